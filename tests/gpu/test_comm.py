"""The NVLink comm kernels (mok.backends.cuda.comm) against the reference backend, bit for bit.

One pytest process per rank, through torchrun; EP is the number of processes:

    torchrun --standalone --nproc-per-node=2 -m pytest tests/gpu/test_comm.py -s   # EP=2
    torchrun --standalone --nproc-per-node=1 -m pytest tests/gpu/test_comm.py -s   # EP=1

At EP > 1 every test here carries the `multi_gpu` marker. Fresh random data every run (the seed
is printed; replay with MOK_TEST_SEED), outputs and destinations poisoned before the kernels
write them, CALLS back-to-back calls per test without clearing anything (the epoch-tagged flags
are reused), ranks delayed by random GPU sleeps so a missing barrier shows up as wrong data,
skewed routing (everything to one rank or one expert, empty experts, invalid ids, capacity
overflow), the timeout path and the argument checks. test_comm_pipeline.py composes the ops as
the backend does, replays them in a CUDA graph and measures bandwidth; test_epilogue_cuda.py
checks the epilogues.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from comm_helpers import (
    CALLS,
    ROUTINGS,
    SHAPE_IDS,
    SHAPES,
    WORLD,
    bit_mismatch,
    check_calls,
    expect_clean,
    host_random,
    poison,
    random_rows,
    routing,
    skew,
    ws_and_draws,
)

from mok import status as device_status
from mok.backends.cuda import comm as cuda_comm
from mok.backends.cuda import extension, mxfp8, mxfp8_pulls
from mok.backends.cuda.experimental import f16_rows
from mok.backends.reference import exchange as reference_exchange
from mok.config import MoKConfig
from mok.functional import build_schedule

# The fixtures device, seed and workspaces come from tests/gpu/conftest.py (which also skips with
# the reason when there is no GPU or no module).
pytestmark = [pytest.mark.gpu, *([pytest.mark.multi_gpu] if WORLD > 1 else [])]


# Chunk bytes per CTA (MoKConfig.all_gather_top_experts_chunk_bytes): the kernel's default, the
# smallest, one that leaves a partial chunk, the config's default, one past the whole table.
CHUNKS = (0, 16, 48, 2048, 1 << 20)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_all_gather_top_experts(shape, seed, workspaces):
    ws, gen, rng = ws_and_draws(workspaces, seed, "ag", shape)
    problems = []
    for call in range(max(CALLS, len(CHUNKS))):
        kind, chunk = ROUTINGS[call % len(ROUTINGS)], CHUNKS[call % len(CHUNKS)]
        mine = routing(kind, ws.num_local_tokens, ws.topk, ws.ep_size * shape[3], gen)
        poison(ws.all_gather_top_experts_buffer)
        skew(rng)
        got = cuda_comm.all_gather_top_experts(ws, mine, chunk_bytes=chunk).clone()
        want = reference_exchange.all_gather(mine, ws.group_name)
        problems.append(bit_mismatch(f"all-gather call {call} ({kind}, chunk {chunk})", got, want))
    expect_clean(ws, problems)


def test_barrier_advances_one_epoch_per_call(seed, workspaces):
    ws = workspaces(SHAPES[0])
    rng = host_random(seed, "barrier")
    torch.cuda.synchronize()
    before = int(ws.barrier_target.item())
    for _ in range(CALLS):
        skew(rng)
        cuda_comm.barrier(ws)
    torch.cuda.synchronize()
    after = int(ws.barrier_target.item())
    expected = before + (CALLS if ws.ep_size > 1 else 0)
    problems = [None if after == expected else f"epoch {before} -> {after}, want {expected}"]
    flags = ws.barrier_buffer[: ws.ep_size].tolist()  # the epochs; the tag rows follow
    for peer, flag in enumerate(flags):
        # A peer may already have signalled the next barrier (the next test's), never more.
        if peer != ws.ep_rank and ws.ep_size > 1 and flag - after not in (0, 1):
            problems.append(f"rank {ws.ep_rank}: flag of peer {peer} is {flag}, epoch {after}")
    expect_clean(ws, problems)


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_pull_rows_and_router_weights(shape, kind, seed, workspaces):
    ws, gen, rng = ws_and_draws(workspaces, seed, "pull", shape, kind)

    def one_call(call: int, sched: tuple[torch.Tensor, ...]) -> list[str | None]:
        name = ("x_buffer", "d_y_buffer")[call % 2]
        source = getattr(ws, name)
        source.copy_(random_rows(tuple(source.shape), torch.bfloat16, gen))
        ws.router_weight_buffer.copy_(
            random_rows((ws.num_local_tokens, ws.topk), torch.float32, gen)
        )
        out = poison(
            torch.empty((sched[0].shape[0], ws.hidden_size), dtype=torch.bfloat16, device="cuda")
        )
        out_rw = poison(torch.empty(sched[0].shape[0], dtype=torch.float32, device="cuda"))
        skew(rng)
        cuda_comm.pull_rows(ws, name, sched, out)
        skew(rng)
        got_rw = cuda_comm.pull_router_weights(ws, sched, out_rw)
        want = reference_exchange.pull_rows(source, sched[0], sched[1], ws.topk, ws.group_name)
        want_rw = reference_exchange.pull_router_weights(
            ws.router_weight_buffer, sched[0], sched[1], ws.group_name
        )
        # zero_rest=False: rows from num_tokens on keep what they held (the poison).
        kept = poison(torch.empty_like(out))
        cuda_comm.pull_rows(ws, name, sched, kept, zero_rest=False)
        live = int(sched[2].item())
        return [
            bit_mismatch(f"pull {name} call {call}", out, want),
            bit_mismatch(f"pull router weights call {call}", got_rw, want_rw),
            bit_mismatch(f"pull {name} call {call}, zero_rest=False", kept[:live], want[:live]),
            bit_mismatch(
                f"pull {name} call {call}, rows past num_tokens",
                kept[live:],
                poison(torch.empty_like(out))[live:],
            ),  # fmt: skip
        ]

    check_calls(ws, kind, shape[3], gen, one_call)


@pytest.mark.parametrize("ctas", [None, 3], ids=["cta-per-tile", "3-ctas"])
@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_pull_round_is_the_pull_then_the_rounding(shape, kind, ctas, seed, workspaces):
    """The MXFP8 dispatch in one pass (mxfp8_pulls.pull_round, on its own grid or on a few
    CTAs taking turns) against pull_rows followed by mxfp8_round with its transposed pair, bit
    for bit, on the rows below num_tokens (nothing reads, or writes, the rest)."""
    ws, gen, rng = ws_and_draws(workspaces, seed, "pull_round", shape, kind, ctas)

    def one_call(call: int, sched: tuple[torch.Tensor, ...]) -> list[str | None]:
        ws.x_buffer.copy_(random_rows(tuple(ws.x_buffer.shape), torch.bfloat16, gen))
        skew(rng)
        values, (data_t, scale_t) = mxfp8_pulls.pull_round(ws, "x_buffer", sched, num_ctas=ctas)
        rows = cuda_comm.pull_rows(ws, "x_buffer", sched)
        want, (want_t, want_scale_t) = mxfp8.mxfp8_round(rows, transposed=True)
        live = int(sched[2].item())
        what = f"pull_round call {call}"
        return [
            bit_mismatch(f"{what}: rounded rows", values[:live], want[:live]),
            bit_mismatch(f"{what}: transposed data", data_t[:, :live], want_t[:, :live]),
            bit_mismatch(
                f"{what}: transposed scales",
                scale_t[:, : live // 128],
                want_scale_t[:, : live // 128],
            ),  # fmt: skip
        ]

    check_calls(ws, kind, shape[3], gen, one_call)


@pytest.mark.parametrize("ctas", [None, 3], ids=["cta-per-tile", "3-ctas"])
@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_pull_round_rows_is_the_pull_then_both_roundings(shape, kind, ctas, seed, workspaces):
    """The MXFP8 backward's d_out pull in one pass (mxfp8_pulls.pull_round_rows) against
    pull_rows followed by mxfp8_round and mxfp8_round_rows with the router weights as row
    scales, bit for bit, on the rows below num_tokens."""
    ws, gen, rng = ws_and_draws(workspaces, seed, "pull_round_rows", shape, kind, ctas)

    def one_call(call: int, sched: tuple[torch.Tensor, ...]) -> list[str | None]:
        ws.d_y_buffer.copy_(random_rows(tuple(ws.d_y_buffer.shape), torch.bfloat16, gen))
        weights = random_rows((sched[0].shape[0],), torch.float32, gen)
        skew(rng)
        values, rounded_rows = mxfp8_pulls.pull_round_rows(
            ws, "d_y_buffer", sched, weights, num_ctas=ctas
        )
        rows = cuda_comm.pull_rows(ws, "d_y_buffer", sched)
        want = mxfp8.mxfp8_round(rows)[0]
        want_rows = mxfp8.mxfp8_round_rows(rows, row_scale=weights)
        live = int(sched[2].item())
        what = f"pull_round_rows call {call}"
        return [
            bit_mismatch(f"{what}: rounded", values[:live], want[:live]),
            bit_mismatch(f"{what}: rounded rows", rounded_rows[:live], want_rows[:live]),
        ]

    check_calls(ws, kind, shape[3], gen, one_call)


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_pull_round_rebased_rows(shape, kind, seed, workspaces):
    """EP 1: pull_round's f16 rows rebased per row (M_GROUPED_MXFP8_NT_F16_ROWS's input) are
    its bf16 rounded rows times 2^(127 - R), R the source token's row_exponents byte (0 on
    padding rows), exactly, with the same transposed pair; beyond EP 1 the mode is refused (it
    reads local tokens)."""
    ws, gen, rng = ws_and_draws(workspaces, seed, "pull_round_rebased", shape, kind)

    def one_call(call: int, sched: tuple[torch.Tensor, ...]) -> list[str | None]:
        ws.x_buffer.copy_(random_rows(tuple(ws.x_buffer.shape), torch.bfloat16, gen))
        if ws.ep_size > 1:
            with pytest.raises(ValueError, match="need the local source"):
                mxfp8_pulls.pull_round(ws, "x_buffer", sched, rebased=True)
            return []
        skew(rng)
        (values, exponents), pair = mxfp8_pulls.pull_round(ws, "x_buffer", sched, rebased=True)
        want, want_pair = mxfp8_pulls.pull_round(ws, "x_buffer", sched)
        live = int(sched[2].item())
        source = (sched[1][:live] // ws.topk).clamp(min=0).long()
        tokens = f16_rows.row_exponents(ws.x_buffer)[source]
        want_exponents = torch.where(sched[0][:live] < 0, 0, tokens).to(torch.uint8)
        back = values[:live].float() * torch.exp2(exponents[:live].float() - 127)[:, None]
        what = f"rebased pull_round call {call}"
        return [
            bit_mismatch(f"{what}: exponents", exponents[:live], want_exponents),
            bit_mismatch(f"{what}: values", back, want[:live].float()),
            bit_mismatch(f"{what}: transposed data", pair[0][:, :live], want_pair[0][:, :live]),
        ]

    check_calls(ws, kind, shape[3], gen, one_call)


@pytest.mark.parametrize("kind", ROUTINGS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_push_rows(shape, kind, seed, workspaces):
    ws, gen, rng = ws_and_draws(workspaces, seed, "push", shape, kind)

    def one_call(call: int, sched: tuple[torch.Tensor, ...]) -> list[str | None]:
        rows_count = sched[0].shape[0]
        name = ("combine_buffer", "d_x_routed_buffer")[call % 2]
        dest = getattr(ws, name)
        rows = random_rows((rows_count, ws.hidden_size), torch.bfloat16, gen)
        rw_rows = random_rows((rows_count,), torch.float32, gen)
        poison(dest)
        poison(ws.d_router_weight_buffer)
        skew(rng)
        cuda_comm.push_rows(ws, rows, sched, name)
        got = dest.clone()
        skew(rng)
        cuda_comm.push_rows(ws, rw_rows, sched, "d_router_weight_buffer")
        got_rw = ws.d_router_weight_buffer.clone()
        want, want_rw = torch.zeros_like(dest), torch.zeros_like(ws.d_router_weight_buffer)
        reference_exchange.push_rows(rows, sched[0], sched[1], want, ws.group_name)
        reference_exchange.push_rows(rw_rows, sched[0], sched[1], want_rw.view(-1), ws.group_name)
        return [
            bit_mismatch(f"push into {name} call {call}", got, want),
            bit_mismatch(f"push router-weight grads call {call}", got_rw, want_rw),
        ]

    check_calls(ws, kind, shape[3], gen, one_call)


_PUSH_NAMES = ("combine_buffer", "d_x_routed_buffer", "d_router_weight_buffer")


@pytest.mark.parametrize("kind", ("uniform", "invalid_ids", "one_rank"))
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_push_after_build_schedule_clears_only_unrouted_rows(shape, kind, seed, workspaces):
    """A schedule of build_schedule's (it keeps its routes: these workspaces' capacity
    holds the worst case at EP <= 2): the push zeroes only the rows of invalid routes in the
    poisoned destination, and gets the bits of a push into a zeroed one."""
    ws, gen, rng = ws_and_draws(workspaces, seed, "push-built", shape, kind)
    worst_case = ws.ep_size * ws.num_local_tokens * ws.topk
    problems = []
    for call in range(CALLS):
        mine = routing(kind, ws.num_local_tokens, ws.topk, ws.ep_size * shape[3], gen)
        built = build_schedule(ws, MoKConfig(), mine.long(), num_local_experts=shape[3])
        sched = built.as_tuple()
        kept = built.unpushed_routes() is not None
        assert kept == (ws.schedule_capacity >= worst_case)
        name = _PUSH_NAMES[call % len(_PUSH_NAMES)]
        dest = getattr(ws, name)
        # The router-weight gradients are one fp32 per route: rows [C] into dest viewed [T*k].
        one_value = name == "d_router_weight_buffer"
        rows_shape = (sched[0].shape[0],) if one_value else (sched[0].shape[0], ws.hidden_size)
        rows = random_rows(rows_shape, dest.dtype, gen)
        poison(dest)
        skew(rng)
        # Either form: the MoKSchedule (its routes: only unrouted rows zeroed) or its tuple (all).
        cuda_comm.push_rows(ws, rows, built if call % 2 else sched, name)
        got = dest.clone()
        want = torch.zeros_like(dest)
        reference_exchange.push_rows(rows, sched[0], sched[1], want.view(-1) if one_value else want,
                            ws.group_name)  # fmt: skip
        problems.append(bit_mismatch(f"push into {name} call {call} (kept {kept})", got, want))
    torch.cuda.synchronize()
    # build_schedule records the invalid ids: the one status bit this test expects.
    assert int(ws.status.item()) & ~device_status.INVALID_EXPERT_ID == 0
    ws.status.zero_()
    expect_clean(ws, problems)


@pytest.mark.skipif(WORLD < 2, reason="a barrier timeout needs a peer that does not arrive")
def test_barrier_timeout_sets_status_and_ranks_recover(workspaces, monkeypatch):
    ws = workspaces(SHAPES[0])
    torch.cuda.synchronize()
    dist.barrier()
    if ws.ep_rank == 0:  # waits alone, gives up after 0.2 s
        monkeypatch.setenv("MOK_COMM_TIMEOUT_S", "0.2")
        cuda_comm.barrier(ws)
        torch.cuda.synchronize()
        monkeypatch.delenv("MOK_COMM_TIMEOUT_S")
    dist.barrier()  # NCCL: the others start only after rank 0 timed out
    if ws.ep_rank != 0:  # rank 0's signal is already there: they pass, epochs agree again
        cuda_comm.barrier(ws)
    cuda_comm.barrier(ws)  # everyone, in step
    torch.cuda.synchronize()
    value = int(ws.status.item())
    ws.status.zero_()
    epochs = reference_exchange.all_gather(ws.barrier_target, ws.group_name).flatten().tolist()
    if ws.ep_rank == 0:
        assert value & device_status.TIMEOUT, f"rank 0 status {value:#x} lacks TIMEOUT"
        with pytest.raises(device_status.MoKDeviceError, match="barrier gave up"):
            device_status.raise_for(value)
    else:
        assert value == 0, f"rank {ws.ep_rank} status {value:#x}"
    assert len(set(epochs)) == 1, f"epochs differ after recovery: {epochs}"


def test_pointer_tables_match_symmetric_memory(workspaces):
    ws = workspaces(SHAPES[0])
    problems = []
    for name, table in ws.peer_ptr_tables.items():
        tensor, handle = getattr(ws, name), getattr(ws, f"{name}_handle")
        ptrs = table.tolist()
        if ptrs[ws.ep_rank] != tensor.data_ptr():
            problems.append(f"{name}: own entry {ptrs[ws.ep_rank]:#x} != {tensor.data_ptr():#x}")
        for peer in range(ws.ep_size):
            remote = handle.get_remote_tensor(peer, tuple(tensor.shape), tensor.dtype)
            if remote.data_ptr() != ptrs[peer]:
                problems.append(f"{name}: peer {peer} {ptrs[peer]:#x} != {remote.data_ptr():#x}")
    assert not problems, "\n".join(problems)


def test_rejects_bad_arguments(workspaces):
    ws = workspaces(SHAPES[0])
    sched = (torch.zeros(256, dtype=torch.int32, device="cuda"),) * 2 + (
        torch.zeros(1, dtype=torch.int32, device="cuda"),
        torch.zeros(2, dtype=torch.int32, device="cuda"),
    )
    with pytest.raises(ValueError, match="must be one of"):
        cuda_comm.pull_rows(ws, "combine_buffer", sched)
    with pytest.raises(TypeError, match="int32"):
        cuda_comm.all_gather_top_experts(ws, torch.zeros(101, 3, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="rows"):
        cuda_comm.push_rows(
            ws, torch.zeros(255, 128, dtype=torch.bfloat16, device="cuda"), sched, "combine_buffer"
        )
    with pytest.raises(ValueError, match="zero_fill"):
        cuda_comm.push_rows(
            ws,
            torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda"),
            sched,
            "combine_buffer",
            sync_before=False,
        )
    odd = tuple(t[:200] for t in sched[:2]) + sched[2:]
    with pytest.raises(ValueError, match="multiples of 128"):
        mxfp8_pulls.pull_round(ws, "x_buffer", odd)
    with pytest.raises(ValueError, match="num_ctas"):
        mxfp8_pulls.pull_round(ws, "x_buffer", sched, num_ctas=0)
    with pytest.raises(ValueError, match="row_weights"):
        mxfp8_pulls.pull_round_rows(ws, "d_y_buffer", sched, torch.ones(256, device="cuda")[1:])
    module = extension.module_for_device(ws.device)
    big = 1 << 20
    with pytest.raises(ValueError, match="multiples of 128"):
        module.comm_pull_round(big, big, big, big, 256, 100, 1, 1, 1, big, big, big, 0, 0)
    with pytest.raises(ValueError, match="ctas"):
        module.comm_pull_round(big, big, big, big, 256, 128, 1, 1, 1, big, big, big, -1, 0)
    pair_and_rows = (big, big, big, big, 256, 128, 1, 1, 1, big, big, big, 0, 0)
    with pytest.raises(ValueError, match="not both or neither"):
        module.comm_pull_round(*pair_and_rows, rounded_rows=big, row_scale=big)
    with pytest.raises(ValueError, match="both be given"):
        module.comm_pull_round(*pair_and_rows[:10], 0, 0, 0, 0, rounded_rows=big)
    with pytest.raises(ValueError, match="row_bytes"):
        module.comm_pull_rows(
            1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 256, 6, 1, 1, 1, 1, True, 0
        )
    with pytest.raises(ValueError, match="rank"):
        module.comm_barrier(1 << 20, 1 << 20, 1 << 20, 1 << 20, 3, 2, 1, 0)
    with pytest.raises(ValueError, match="ep"):
        module.comm_all_gather(1 << 20, 1 << 20, 16, 0, 73, 0)
