"""The CUDA schedule (csrc/schedule/) against the reference (mok.backends.reference.schedule),
exactly: peer_rank, peer_token_idx, num_tokens, tokens_per_expert and the status word.

Fresh random routing every run (the seed is printed; MOK_TEST_SEED replays it), outputs and the
kernels' scratch poisoned before the kernels run, EP 1..72 simulated on one GPU by building the
gathered table [EP, T, k] directly, skewed and invalid routing, capacity overflow, bitwise
repeatability, CUDA-graph capture with new routing per replay, and a timing line. Runs under
plain pytest and under `torchrun --nproc-per-node=1 -m pytest`.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch
from gpu_helpers import gpu_skip_reason, median_ms, module_seed, requires_gpu_module

from mok import status
from mok.backends.cuda import extension as _extension
from mok.backends.cuda import schedule as cuda_schedule
from mok.backends.reference import schedule as reference_schedule

pytestmark = pytest.mark.gpu

POISON = 0x5A5A5A5A  # neither -1 nor a plausible rank, token index or row count


requires_module = requires_gpu_module()


@pytest.fixture(scope="module", autouse=True)
def _device():
    if gpu_skip_reason() is None:  # torchrun gives each process its GPU through LOCAL_RANK
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


seed = module_seed("schedule cuda")


def _generator(seed: int, salt: object) -> torch.Generator:
    # crc32, not hash(): str hashes change per process, which would break MOK_TEST_SEED replays.
    salted = seed * 1_000_003 + zlib.crc32(repr(salt).encode())
    return torch.Generator(device="cuda").manual_seed(salted % 2**62)


def _routing(ep, tokens, topk, experts, gen, low=0, high=None) -> torch.Tensor:
    high = ep * experts if high is None else high
    shape = (ep, tokens, topk)
    return torch.randint(low, high, shape, generator=gen, device="cuda", dtype=torch.int32)


def _ample(topk_all: torch.Tensor, experts: int) -> int:
    """A capacity no routing of this shape can overflow."""
    return -(-(topk_all.numel() + 256 * experts) // 256) * 256


def _kernel(topk_all, experts, capacity, rank, word):
    """The extension on poisoned outputs and poisoned scratch (nothing may rely on zeros)."""
    module = _extension.module_for_device(topk_all.device)
    ep, routes = topk_all.shape[0], topk_all[0].numel()

    def poisoned(n: int) -> torch.Tensor:
        return torch.full((n,), POISON, dtype=torch.int32, device="cuda")

    outs = (poisoned(capacity), poisoned(capacity), poisoned(1), poisoned(experts))
    scratch_bytes = module.schedule_workspace_bytes(ep, routes, experts)
    scratch = torch.randint(-(2**62), 2**62, ((scratch_bytes + 7) // 8,), device="cuda")
    module.schedule(
        topk_all.data_ptr(),
        *(t.data_ptr() for t in outs),
        word.data_ptr(),
        scratch.data_ptr(),
        ep,
        routes,
        experts,
        capacity,
        rank,
        torch.cuda.current_stream().cuda_stream,
    )
    return outs


def _compare(topk_all, experts, capacity, rank, *, word_before: int = 0) -> int:
    """Run both on the same CUDA tensor; assert identical outputs and status; return status."""
    got_word = torch.full((1,), word_before, dtype=torch.int32, device="cuda")
    want_word = got_word.clone()
    got = _kernel(topk_all, experts, capacity, rank, got_word)
    want = reference_schedule.schedule(topk_all, experts, capacity, rank, want_word)
    what = f"EP={topk_all.shape[0]} T={topk_all.shape[1]} k={topk_all.shape[2]} E={experts} "
    what += f"C={capacity} rank={rank}"
    for name, g, w in zip(
        ("peer_rank", "peer_token_idx", "num_tokens", "tokens_per_expert"), got, want, strict=True
    ):
        assert g.dtype == w.dtype == torch.int32 and g.shape == w.shape, f"{what}: {name}"
        bad = (g != w).nonzero()
        assert bad.numel() == 0, (
            f"{what}: {name} differs at {bad.shape[0]} rows, first row {bad[0].item()}: "
            f"kernel {g[bad[0]].item()}, reference {w[bad[0]].item()}"
        )
    assert int(got_word) == int(want_word), f"{what}: status {int(got_word)} != {int(want_word)}"
    return int(got_word)


# (EP, T, k, E): tails shorter than a warp, several chunks, fewer warps per block (E > 1024),
# one warp per block (E = 8192).
SMALL = {
    "ep1-t1-k1-e1": (1, 1, 1, 1),
    "ep2-t0-k4-e3": (2, 0, 4, 3),  # no routes: only the fill and the segment kernels run
    "ep2-t40-k3-e3": (2, 40, 3, 3),
    "ep3-t700-k2-e5": (3, 700, 2, 5),
    "ep4-t1000-k6-e1500": (4, 1000, 6, 1500),
    "ep1-t2000-k4-e8192": (1, 2000, 4, 8192),
    "ep72-t300-k4-e4": (72, 300, 4, 4),
    "ep7-t1111-k5-e256": (7, 1111, 5, 256),
}


@requires_module
@pytest.mark.parametrize("case", SMALL.values(), ids=SMALL.keys())
def test_small(case, seed):
    ep, tokens, topk, experts = case
    topk_all = _routing(ep, tokens, topk, experts, _generator(seed, case))
    for rank in sorted({0, ep // 2, ep - 1}):
        assert _compare(topk_all, experts, _ample(topk_all, experts), rank) == 0


@requires_module
@pytest.mark.parametrize("ep", [2, 4, 8, 16, 32, 64, 72], ids=lambda ep: f"ep{ep}")
def test_deepseek_like(ep, seed):
    """T=4096, top-6, 12 local experts; an ample capacity and the config's default one
    (0.5 * EP * T * k, which overflows at EP=2: the status must then match too)."""
    tokens, topk, experts = 4096, 6, 12
    topk_all = _routing(ep, tokens, topk, experts, _generator(seed, ("dsv", ep)))
    default = max(256, int(0.5 * ep * tokens * topk) // 256 * 256)
    for rank in sorted({0, ep - 1, ep // 3}):
        assert _compare(topk_all, experts, _ample(topk_all, experts), rank) == 0
        _compare(topk_all, experts, default, rank)


SKEWS = ["all-to-one-expert", "empty-experts", "one-rank-gets-all", "nothing-for-rank"]


@requires_module
@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("ep", [2, 8, 64], ids=lambda ep: f"ep{ep}")
def test_skewed(skew, ep, seed):
    tokens, topk, experts, rank = 4096, 6, 12, ep - 1
    topk_all = _routing(ep, tokens, topk, experts, _generator(seed, (skew, ep)))
    if skew == "all-to-one-expert":
        topk_all.fill_(rank * experts + 5)
    elif skew == "empty-experts":  # only local experts 0, 3 and 11 receive anything
        used = torch.tensor([0, 3, 11], dtype=torch.int32, device="cuda")
        topk_all = topk_all // experts * experts + used[(topk_all % 3).long()]
    elif skew == "one-rank-gets-all":
        topk_all = rank * experts + topk_all % experts
    else:
        topk_all = torch.where(topk_all // experts == rank, 0, topk_all)
    assert _compare(topk_all, experts, _ample(topk_all, experts), rank) == 0


@requires_module
def test_invalid_ids_are_never_scheduled(seed):
    ep, experts = 8, 6
    topk_all = _routing(ep, 2048, 4, experts, _generator(seed, "invalid"), -5, ep * experts + 5)
    topk_all[0, 0, :] = torch.tensor([-(2**31), 2**31 - 1, -1, ep * experts], dtype=torch.int32)
    for rank in range(ep):
        assert _compare(topk_all, experts, _ample(topk_all, experts), rank) == 0


@requires_module
@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.6, 0.95], ids=lambda f: f"cap{f}")
def test_overflow_is_reported_and_matches(fraction, seed):
    ep, tokens, topk, experts, rank = 8, 4096, 8, 16, 3
    gen = _generator(seed, ("overflow", fraction))
    topk_all = _routing(ep, tokens, topk, experts, gen)
    hot = torch.rand(topk_all.shape, generator=gen, device="cuda") < 0.5
    topk_all = torch.where(hot, rank * experts + 7, topk_all)  # rank 3 gets most routes
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    needed = int(
        reference_schedule.schedule(topk_all, experts, _ample(topk_all, experts), rank, word)[2]
    )
    capacity = max(256, int(needed * fraction) // 256 * 256)
    assert _compare(topk_all, experts, capacity, rank) == status.CAPACITY_OVERFLOW
    # Bits already in the word stay (the kernel only ORs).
    assert _compare(topk_all, experts, capacity, rank, word_before=1) == 1 | 2


@requires_module
@pytest.mark.parametrize("index", range(12), ids=lambda i: f"random{i}")
def test_random_shapes(index, seed):
    gen = torch.Generator().manual_seed(seed + index)

    def pick(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    ep, tokens, topk = pick(1, 72), pick(1, 3000), pick(1, 10)
    experts = [pick(1, 16), pick(1, 300), pick(1000, 8192)][index % 3]
    topk_all = _routing(ep, tokens, topk, experts, _generator(seed, ("random", index)), -2)
    rank = pick(0, ep - 1)
    capacity = _ample(topk_all, experts) // [1, 4, 64][index % 3] // 256 * 256 + 256
    _compare(topk_all, experts, capacity, rank)


@requires_module
def test_repeated_runs_are_bitwise_identical(seed):
    ep, experts, rank = 16, 8, 5
    topk_all = _routing(ep, 4096, 6, experts, _generator(seed, "repeat"))
    capacity = 16 * 4096 * 6 // 16 // 256 * 256  # overflows: the status must repeat too
    runs = []
    for _ in range(5):
        word = torch.zeros(1, dtype=torch.int32, device="cuda")
        runs.append((*_kernel(topk_all, experts, capacity, rank, word), word))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run, strict=True))


@requires_module
def test_runs_on_the_current_stream(seed):
    ep, tokens, topk, experts, rank = 8, 4096, 8, 16, 2
    topk_all = _routing(ep, tokens, topk, experts, _generator(seed, "stream"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        word = torch.zeros(1, dtype=torch.int32, device="cuda")
        got = cuda_schedule.schedule(topk_all, experts, _ample(topk_all, experts), rank, word)
    torch.cuda.current_stream().wait_stream(side)
    want_word = torch.zeros(1, dtype=torch.int32, device="cuda")
    want = reference_schedule.schedule(
        topk_all, experts, _ample(topk_all, experts), rank, want_word
    )
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@requires_module
def test_cuda_graph_replays_with_new_routing(seed):
    ep, tokens, topk, experts, rank = 8, 4096, 6, 12, 1
    gen = _generator(seed, "graph")
    static_topk = _routing(ep, tokens, topk, experts, gen)
    capacity = int(0.5 * ep * tokens * topk) // 256 * 256
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch recommends
        cuda_schedule.schedule(static_topk, experts, capacity, rank, word)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        word.zero_()
        outs = cuda_schedule.schedule(static_topk, experts, capacity, rank, word)
    for replay in range(3):
        routing = _routing(ep, tokens, topk, experts, gen)
        if replay == 2:  # skewed enough to overflow: the status must come from the graph too
            routing = torch.where(routing % 2 == 0, rank * experts, routing)
        static_topk.copy_(routing)
        graph.replay()
        want_word = torch.zeros(1, dtype=torch.int32, device="cuda")
        want = reference_schedule.schedule(routing, experts, capacity, rank, want_word)
        assert all(torch.equal(g, w) for g, w in zip(outs, want, strict=True)), replay
        assert int(word) == int(want_word) == (status.CAPACITY_OVERFLOW if replay == 2 else 0)


@requires_module
def test_rejects_bad_arguments():
    topk_all = torch.zeros((2, 8, 2), dtype=torch.int32, device="cuda")
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="capacity"):
        cuda_schedule.schedule(topk_all, 4, 300, 0, word)
    with pytest.raises(ValueError, match="rank"):
        cuda_schedule.schedule(topk_all, 4, 256, 2, word)
    with pytest.raises(ValueError, match="num_local_experts"):
        cuda_schedule.schedule(topk_all, 8193, 256, 0, word)
    with pytest.raises(TypeError, match="topk_all"):
        cuda_schedule.schedule(topk_all.long(), 4, 256, 0, word)
    with pytest.raises(ValueError, match="CUDA"):
        cuda_schedule.schedule(topk_all.cpu(), 4, 256, 0, word)
    module = _extension.module_for_device()
    with pytest.raises(ValueError, match="experts"):
        module.schedule_workspace_bytes(2, 16, 0)


@requires_module
@pytest.mark.parametrize("shape", [(0, 6), (1, 1), (300, 7), (4096, 8)], ids=str)
def test_routing_matches_the_reference(shape, seed):
    """int64 ids of every kind -> the same int32 routing and status bit as the torch ops."""
    experts = 96
    gen = _generator(seed, ("routing", shape))
    ids = torch.randint(0, experts, shape, generator=gen, device="cuda", dtype=torch.int64)
    bad = torch.rand(shape, generator=gen, device="cuda") < 0.05
    extremes = torch.tensor([-1, experts, -(2**31) - 1, 2**31, 2**62, -(2**63)], device="cuda")
    pick = torch.randint(0, len(extremes), shape, generator=gen, device="cuda")
    ids = torch.where(bad, extremes[pick], ids)
    for word_before in (0, status.CAPACITY_OVERFLOW):
        got_word = torch.full((1,), word_before, dtype=torch.int32, device="cuda")
        want_word = got_word.clone()
        got = cuda_schedule.routing(ids.T.contiguous().T, experts, got_word)  # strided view
        want = reference_schedule.routing(ids, experts, want_word)
        assert got.dtype == torch.int32 and got.shape == ids.shape
        assert torch.equal(got, want)
        assert int(got_word) == int(want_word)
        assert bool(int(got_word) & status.INVALID_EXPERT_ID) == bool(bad.any())


@requires_module
def test_routing_rejects_bad_arguments():
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    ids = torch.zeros((4, 2), dtype=torch.int64, device="cuda")
    with pytest.raises(TypeError, match="ids"):
        cuda_schedule.routing(ids.int(), 8, word)
    with pytest.raises(ValueError, match="num_experts"):
        cuda_schedule.routing(ids, 0, word)
    with pytest.raises(ValueError, match="CUDA"):
        cuda_schedule.routing(ids.cpu(), 8, word)
    with pytest.raises(TypeError, match="status"):
        cuda_schedule.routing(ids, 8, word.long())


# (T, k, E): one route; the Qwen3-235B-like shape (columns and segments in one block); E past
# 1024 (separate column and segment kernels) and E = 8192 (one warp a block).
LOCAL = {"t1-k1-e1": (1, 1, 1), "t4096-k8-e16": (4096, 8, 16), "t300-k7-e1500": (300, 7, 1500),
         "t2000-k4-e8192": (2000, 4, 8192)}  # fmt: skip


@requires_module
@pytest.mark.parametrize("case", LOCAL.values(), ids=LOCAL.keys())
def test_local_schedule_is_routing_then_schedule(case, seed):
    """A one-rank schedule straight from int64 ids (the routing written by the count kernel):
    the reference's routing, schedule and route rows, exactly, and the same status word, with
    invalid ids of every kind and a capacity that overflows."""
    tokens, topk, experts = case
    gen = _generator(seed, ("local", case))
    ids = torch.randint(0, experts, (tokens, topk), generator=gen, device="cuda")
    extremes = torch.tensor([-1, experts, -(2**31) - 1, 2**31, -(2**63)], device="cuda")
    bad = torch.rand(ids.shape, generator=gen, device="cuda") < 0.05
    pick = torch.randint(0, len(extremes), ids.shape, generator=gen, device="cuda")
    ids = torch.where(bad, extremes[pick], ids)
    ample = -(-(ids.numel() + 256 * experts) // 256) * 256
    for capacity in (ample, max(256, ample // 3 // 256 * 256)):
        got_word = torch.zeros(1, dtype=torch.int32, device="cuda")
        want_word = got_word.clone()
        got = cuda_schedule.launch_local_schedule(ids, experts, capacity, got_word)
        want = reference_schedule.local_schedule(ids, experts, capacity, want_word)
        names = ("peer_rank", "peer_token_idx", "num_tokens", "tokens_per_expert", "routing",
                 "route_rows")  # fmt: skip
        for name, g, w in zip(names, got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert torch.equal(g, w), f"{case} C={capacity}: {name} differs"
        assert int(got_word) == int(want_word), f"{case} C={capacity}: status"
        assert bool(int(got_word) & status.INVALID_EXPERT_ID) == bool(bad.any())


def _median_us(fn, iterations: int = 50) -> float:
    return median_ms(fn, iterations=iterations) * 1e3


@requires_module
def test_timing(seed, capsys):
    ep, tokens, topk, experts, rank = 8, 4096, 8, 16, 0
    topk_all = _routing(ep, tokens, topk, experts, _generator(seed, "timing"))
    capacity = int(0.5 * ep * tokens * topk) // 256 * 256
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    kernel_us = _median_us(lambda: cuda_schedule.schedule(topk_all, experts, capacity, rank, word))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_schedule.schedule(topk_all, experts, capacity, rank, word)
    graph_us = _median_us(graph.replay)
    reference_us = _median_us(
        lambda: reference_schedule.schedule(topk_all, experts, capacity, rank, word), iterations=10
    )
    with capsys.disabled():
        print(
            f"\nschedule EP={ep} T={tokens} k={topk} E={experts} on "
            f"{torch.cuda.get_device_name()}: {kernel_us:.1f} us per call (eager), "
            f"{graph_us:.1f} us (CUDA graph replay), reference {reference_us:.0f} us"
        )


@requires_module
@pytest.mark.parametrize(("bad_id", "recorded"), [(8, True), (-2, True), (-1, False)])
def test_ops_schedule_records_an_id_outside_the_group(bad_id, recorded):
    """The flat op on the CUDA backend: an id at or past EP * E is skipped and recorded (it was
    skipped without a word); -1 marks a route build_schedule already recorded."""
    from mok import ops

    topk_all = torch.zeros(2, 4, 1, dtype=torch.int32, device="cuda")  # EP 2, E 4: ids 0-7
    topk_all[1, 2, 0] = bad_id
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows = ops.schedule(topk_all, 4, 2048, 0, word)
    assert bool(int(word) & status.INVALID_EXPERT_ID) == recorded
    assert int((rows[0] >= 0).sum()) == 7, "the other routes are still scheduled"
