"""The comm kernels composed as the CUDA backend uses them, captured in a CUDA graph, and timed.

Run with test_comm.py, one pytest process per rank through torchrun (see its docstring):

    torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_comm_pipeline.py -s

The bandwidth test prints GB/s of pull and push for [T*k, 7168] bf16 rows that all cross NVLink,
per CTA count, next to a torch copy of a peer's tensor measured in the same run.
"""

from __future__ import annotations

import pytest
import torch
from comm_helpers import (
    SHAPE_IDS,
    SHAPES,
    WORLD,
    bit_mismatch,
    check_calls,
    epilogue_oracle,
    expect_clean,
    fresh_schedule,
    generator,
    make_workspace,
    poison,
    random_rows,
    routing,
    skew,
    ws_and_draws,
)
from gpu_helpers import gb_per_s

# The fixtures device, seed and workspaces come from tests/gpu/conftest.py.
from mok.backends.cuda import comm as cuda_comm
from mok.backends.cuda import epilogue as cuda_epilogue
from mok.backends.reference import exchange as reference_exchange

pytestmark = [pytest.mark.gpu, *([pytest.mark.multi_gpu] if WORLD > 1 else [])]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_forward_composed_with_minimal_barriers(shape, seed, workspaces):
    """A forward with the fewest barriers a backend can use: zero the combine buffer and write
    x, one barrier, pull, compute, push without a leading barrier or zero-fill, one barrier,
    epilogue. Two barriers per step instead of the standalone ops' four."""
    ws, gen, rng = ws_and_draws(workspaces, seed, "composed", shape)

    def one_call(call: int, sched: tuple[torch.Tensor, ...]) -> list[str | None]:
        x = random_rows((ws.num_local_tokens, ws.hidden_size), torch.bfloat16, gen)
        weights = random_rows((ws.num_local_tokens, ws.topk), torch.float32, gen)
        shared = random_rows(tuple(x.shape), torch.bfloat16, gen) if call % 2 else None
        poison(ws.combine_buffer)
        skew(rng)
        ws.combine_buffer.zero_()
        ws.x_buffer.copy_(x)
        x_rows = cuda_comm.pull_rows(ws, "x_buffer", sched, sync_after=False)
        skew(rng)
        y = (x_rows.float() * -0.5).to(torch.bfloat16)  # exact: stands in for the experts
        cuda_comm.push_rows(ws, y, sched, "combine_buffer", zero_fill=False, sync_before=False)
        out = cuda_epilogue.fwd_epilogue(shared, ws.combine_buffer, weights)
        want_rows = reference_exchange.pull_rows(
            ws.x_buffer, sched[0], sched[1], ws.topk, ws.group_name
        )
        want_combine = torch.zeros_like(ws.combine_buffer)
        want_y = (want_rows.float() * -0.5).to(torch.bfloat16)
        reference_exchange.push_rows(want_y, sched[0], sched[1], want_combine, ws.group_name)
        want = epilogue_oracle(shared, want_combine, weights)
        return [
            bit_mismatch(f"composed pull call {call}", x_rows, want_rows),
            bit_mismatch(f"composed combine call {call}", ws.combine_buffer, want_combine),
            bit_mismatch(f"composed output call {call}", out.cpu(), want),
        ]

    check_calls(ws, None, shape[3], gen, one_call)  # None: every routing kind in turn


def _graph_inputs(ws, experts: int, gen) -> dict[str, torch.Tensor]:
    sched = fresh_schedule(ws, "uniform", experts, gen)
    rows = sched[0].shape[0]
    tokens, topk, hidden = ws.num_local_tokens, ws.topk, ws.hidden_size
    return {
        "routing": routing("invalid_ids", tokens, topk, ws.ep_size * experts, gen),
        "x": random_rows((tokens, hidden), torch.bfloat16, gen),
        "router_weights": random_rows((tokens, topk), torch.float32, gen),
        "rows": random_rows((rows, hidden), torch.bfloat16, gen),
        "rw_rows": random_rows((rows,), torch.float32, gen),
        "shared": random_rows((tokens, hidden), torch.bfloat16, gen),
        **dict(
            zip(
                ("peer_rank", "peer_token_idx", "num_tokens", "tokens_per_expert"),
                sched,
                strict=True,
            )
        ),
    }


def _graph_step(ws, s: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Every comm op once, on the static inputs `s`; returns copies of what they produced."""
    sched = (s["peer_rank"], s["peer_token_idx"], s["num_tokens"], s["tokens_per_expert"])
    gathered = cuda_comm.all_gather_top_experts(ws, s["routing"]).clone()
    ws.x_buffer.copy_(s["x"])
    ws.router_weight_buffer.copy_(s["router_weights"])
    x_rows = cuda_comm.pull_rows(ws, "x_buffer", sched)
    rw_rows = cuda_comm.pull_router_weights(ws, sched)
    cuda_comm.push_rows(ws, s["rows"], sched, "combine_buffer")
    cuda_comm.push_rows(ws, s["rw_rows"], sched, "d_router_weight_buffer")
    out = cuda_epilogue.fwd_epilogue(s["shared"], ws.combine_buffer, s["router_weights"])
    d_x = cuda_epilogue.bwd_epilogue(None, ws.combine_buffer, ws.topk)
    combine = ws.combine_buffer.clone()
    return [gathered, x_rows, rw_rows, combine, ws.d_router_weight_buffer.clone(), out, d_x]


def _graph_reference(ws, s: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    rank, token = s["peer_rank"], s["peer_token_idx"]
    group = ws.group_name
    combine = torch.zeros_like(ws.combine_buffer)
    reference_exchange.push_rows(s["rows"], rank, token, combine, group)
    d_rw = torch.zeros_like(ws.d_router_weight_buffer)
    reference_exchange.push_rows(s["rw_rows"], rank, token, d_rw.view(-1), group)
    ones = torch.ones_like(s["router_weights"])
    return [
        reference_exchange.all_gather(s["routing"], group),
        reference_exchange.pull_rows(ws.x_buffer, rank, token, ws.topk, group),
        reference_exchange.pull_router_weights(ws.router_weight_buffer, rank, token, group),
        combine,
        d_rw,
        epilogue_oracle(s["shared"], combine, s["router_weights"]).cuda(),
        epilogue_oracle(None, combine, ones).cuda(),
    ]


@pytest.mark.parametrize("shape", SHAPES[:2], ids=SHAPE_IDS[:2])
def test_cuda_graph_replays_with_new_inputs(shape, seed, workspaces):
    ws = workspaces(shape)
    gen = generator(seed, "graph", shape)
    static = _graph_inputs(ws, shape[3], gen)
    _graph_step(ws, static)  # warm-up, eagerly
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = _graph_step(ws, static)
    names = ["all-gather", "pull", "pull rw", "combine", "d_rw push", "fwd epilogue", "bwd epi"]
    problems = []
    for replay in range(3):
        for key, value in _graph_inputs(ws, shape[3], gen).items():
            static[key].copy_(value)
        graph.replay()
        wants = _graph_reference(ws, static)
        for name, got, want in zip(names, outputs, wants, strict=True):
            problems.append(bit_mismatch(f"graph replay {replay}: {name}", got, want))
    expect_clean(ws, problems)


def _all_to_next_rank(ws) -> tuple[torch.Tensor, ...]:
    """A schedule of T*k rows that all come from (pull) or go to (push) the next rank, each
    destination slot once."""
    peer = (ws.ep_rank + 1) % ws.ep_size
    index = torch.arange(ws.num_local_tokens * ws.topk, dtype=torch.int32, device=ws.device)
    count = torch.tensor([index.numel()], dtype=torch.int32, device=ws.device)
    return torch.full_like(index, peer), index, count, count


def _each_token_once(ws) -> tuple[torch.Tensor, ...]:
    """A pull schedule that reads every token row of the next rank's x_buffer exactly once (a
    row read k times would be served from L2 and overstate the link's bandwidth)."""
    peer = (ws.ep_rank + 1) % ws.ep_size
    tokens = torch.arange(ws.num_local_tokens, dtype=torch.int32, device=ws.device) * ws.topk
    count = torch.tensor([tokens.numel()], dtype=torch.int32, device=ws.device)
    return torch.full_like(tokens, peer), tokens, count, count


def test_bandwidth(device, capsys):
    """GB/s of pulling every token row of the next rank's x_buffer once ([T, 7168] bf16) and of
    pushing [T*k, 7168] bf16 rows into its combine_buffer (at EP=1: local copies), per CTA count,
    next to a torch copy of the peer's x_buffer in the same run. Each timed call starts right
    after a barrier, so the ranks copy at the same time."""
    ws = make_workspace(device, 4096, 7168, 6)
    sched = _all_to_next_rank(ws)
    pull_sched = _each_token_once(ws)
    peer = int(sched[0][0].item())
    data = torch.randn((sched[1].numel(), ws.hidden_size), device=device).to(torch.bfloat16)
    out = torch.empty_like(ws.x_buffer)
    remote = ws.x_buffer_handle.get_remote_tensor(peer, tuple(ws.x_buffer.shape), torch.bfloat16)
    local = torch.empty_like(ws.x_buffer)

    def line_up() -> None:
        cuda_comm.barrier(ws)

    def gbs(nbytes: int, run) -> float:
        return gb_per_s(nbytes, run, line_up)

    results = {
        "torch copy of the peer's x_buffer": gbs(local.numel() * 2, lambda: local.copy_(remote))
    }
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for ctas in (8, 16, 32, sms):
        quiet = {"num_ctas": ctas, "sync_before": False, "sync_after": False}

        def pull(quiet=quiet) -> None:
            cuda_comm.pull_rows(ws, "x_buffer", pull_sched, out, **quiet)

        def push(quiet=quiet) -> None:
            cuda_comm.push_rows(ws, data, sched, "combine_buffer", zero_fill=False, **quiet)

        results[f"pull, {ctas:3d} CTAs x 512 threads"] = gbs(out.numel() * 2, pull)
        results[f"push, {ctas:3d} CTAs x 512 threads"] = gbs(data.numel() * 2, push)
    cuda_comm.barrier(ws)
    torch.cuda.synchronize()
    with capsys.disabled():
        where = f"rank {ws.ep_rank} -> rank {peer}" if ws.ep_size > 1 else "local (EP=1)"
        print(
            f"\ncomm bandwidth, pull {list(out.shape)} / push {list(data.shape)} bf16, {where}, "
            f"{torch.cuda.get_device_name()}:"
        )
        for name, value in results.items():
            print(f"  {name:>36}: {value:7.0f} GB/s")
    expect_clean(ws, [])
