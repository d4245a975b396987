"""The CUDA schedule's algorithm (csrc/schedule/), emulated in NumPy, against the reference.

No GPU is needed to check the algorithm: the emulation has the kernels' decomposition (one block
per (chunk, source), warps owning 512-route pieces walked in 32-lane steps), their constants and
their scans, computed per block/warp/lane with array operations instead of threads. If it matches
`reference.schedule` bit for bit, so does a kernel that implements these steps faithfully.

| kernel         | emulated by      | what it computes                                           |
|----------------|------------------|------------------------------------------------------------|
| count_kernel   | `count_blocks`   | hist[src][chunk][e]: routes of each chunk per local expert |
| columns_kernel | `scan_columns`   | exclusive scan of hist over chunks; count[e][src]          |
| segment_kernel | `scan_segments`  | padded segment starts, tokens_per_expert, num_tokens       |
| place_kernel   | `place_routes`   | each route's ordinal j, its row, the two output words      |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mok import status
from mok.backends.cuda import schedule as cuda_schedule
from mok.backends.reference import schedule as reference_schedule

# The constants of csrc/schedule/schedule.h.
LANES = 32
STEPS = 16  # 32-route steps per warp: a warp owns 512 consecutive routes of a chunk
MAX_WARPS = 8
COUNTERS = 8192  # int32 counters of the place kernel's shared memory (warps * E <= this)
SEGMENT_THREADS = 1024
ROWS = 256  # segment padding
CAPACITY_OVERFLOW = 2
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Plan:
    warps: int  # warps per block of the count and place kernels
    chunk: int  # routes per block: warps * STEPS * LANES
    chunks: int  # blocks per source


def make_plan(routes: int, experts: int) -> Plan:
    warps = min(MAX_WARPS, COUNTERS // experts)
    chunk = warps * STEPS * LANES
    return Plan(warps, chunk, -(-routes // chunk))


def local_keys(topk_all: np.ndarray, experts: int, rank: int, plan: Plan) -> np.ndarray:
    """[EP, chunks, warps, STEPS, LANES]: the local expert of each lane's route, -1 for routes
    of other ranks, invalid ids and the lanes past the end (what each thread computes first)."""
    ep, routes = topk_all.shape[0], topk_all[0].size
    local = topk_all.reshape(ep, routes).astype(np.int64) - rank * experts
    keys = np.where((local >= 0) & (local < experts), local, -1)
    padded = np.full((ep, plan.chunks * plan.chunk), -1, dtype=np.int64)
    padded[:, :routes] = keys
    return padded.reshape(ep, plan.chunks, plan.warps, STEPS, LANES)


def _histogram(keys: np.ndarray, groups: int, experts: int) -> np.ndarray:
    """[groups, experts] counts of keys [groups, ...] (keys < 0 not counted)."""
    if groups == 0:  # no routes: no blocks
        return np.zeros((0, experts), dtype=np.int64)
    flat = keys.reshape(groups, -1)
    group = np.broadcast_to(np.arange(groups)[:, None], flat.shape)
    mask = flat >= 0
    counts = np.bincount(group[mask] * experts + flat[mask], minlength=groups * experts)
    return counts.reshape(groups, experts)


def count_blocks(keys: np.ndarray, experts: int) -> np.ndarray:
    """count_kernel: each block's shared histogram over its chunk -> hist [EP, chunks, E]."""
    ep, chunks = keys.shape[:2]
    return _histogram(keys, ep * chunks, experts).reshape(ep, chunks, experts)


def scan_columns(hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """columns_kernel: one thread per (src, e) walks the chunks in order, replacing hist by its
    exclusive prefix (the chunk's base ordinal) and storing the total as count[e][src]."""
    base = np.cumsum(hist, axis=1) - hist
    count = hist.sum(axis=1).T
    assert count.max(initial=0) <= INT32_MAX  # int32 on the device
    return base, np.ascontiguousarray(count)


def scan_segments(count: np.ndarray, capacity: int):
    """segment_kernel: one block; thread t owns experts [t*per, (t+1)*per), a block-wide
    exclusive scan of the threads' padded sums gives each thread its first segment start."""
    experts = count.shape[0]
    padded = (count.sum(axis=1) + ROWS - 1) // ROWS * ROWS
    per = -(-experts // SEGMENT_THREADS)
    owned = np.zeros(SEGMENT_THREADS * per, dtype=np.int64)
    owned[:experts] = padded
    thread_sums = owned.reshape(SEGMENT_THREADS, per).sum(axis=1)
    thread_start = np.cumsum(thread_sums) - thread_sums
    within = np.cumsum(owned.reshape(SEGMENT_THREADS, per), axis=1)
    within -= owned.reshape(SEGMENT_THREADS, per)
    seg_start = (thread_start[:, None] + within).reshape(-1)[:experts]
    end = seg_start + padded
    tokens_per_expert = np.minimum(end, capacity) - np.minimum(seg_start, capacity)
    num_tokens = min(int(thread_sums.sum()), capacity)
    return seg_start, tokens_per_expert.astype(np.int32), num_tokens


def _warp_ordinals(keys: np.ndarray, base: np.ndarray, experts: int) -> np.ndarray:
    """place_kernel, passes 1 and 2: the ordinal j of every route within its (src, e).

    Pass 1 counts each warp's piece into its own shared row; the block then turns the rows into
    starting ordinals (the chunk's base plus the earlier warps' counts). Pass 2 walks the piece
    32 lanes at a time: j = row[key] + the lanes below with the same key (match_any & lanemask_lt),
    then the lowest such lane adds the group's size to row[key]."""
    ep, chunks, warps = keys.shape[:3]
    n_warps = ep * chunks * warps
    per_warp = _histogram(keys, n_warps, experts).reshape(ep, chunks, warps, experts)
    running = base[:, :, None, :] + np.cumsum(per_warp, axis=2) - per_warp
    running = running.reshape(n_warps, experts)
    warp_keys = keys.reshape(n_warps, STEPS, LANES)
    below = np.tril(np.ones((LANES, LANES), dtype=bool), -1)  # below[l, m]: lane m < lane l
    warp_index = np.broadcast_to(np.arange(n_warps)[:, None], (n_warps, LANES))
    ordinal = np.full(warp_keys.shape, -1, dtype=np.int64)
    for step in range(STEPS):
        key = warp_keys[:, step, :]
        peers = key[:, :, None] == key[:, None, :]
        rank_in_group = (peers & below).sum(axis=2)
        mine = key >= 0
        ordinal[:, step, :][mine] = running[warp_index[mine], key[mine]] + rank_in_group[mine]
        leader = mine & (rank_in_group == 0)
        group_size = peers.sum(axis=2)
        running[warp_index[leader], key[leader]] += group_size[leader]
    return ordinal.reshape(keys.shape)


def _positions(expert, src, ordinal, count, batch: int = 1 << 16) -> np.ndarray:
    """pos = sum_s min(count[e][s], j) + #{s < src : count[e][s] > j}: the rounds before j,
    then the sources before `src` in round j (each lane loops over the EP counts of its e)."""
    ep = count.shape[1]
    out = np.empty(expert.shape, dtype=np.int64)
    for lo in range(0, expert.size, batch):
        e, s, j = expert[lo : lo + batch], src[lo : lo + batch], ordinal[lo : lo + batch, None]
        c = count[e]
        earlier = np.arange(ep)[None, :] < s[:, None]
        out[lo : lo + batch] = np.minimum(c, j).sum(axis=1) + ((c > j) & earlier).sum(axis=1)
    return out


def place_routes(keys, base, count, seg_start, capacity: int, plan: Plan):
    """place_kernel: rows of every local route; rows >= capacity only raise the overflow bit.
    Both outputs start as -1 (the memset before the kernels)."""
    ordinal = _warp_ordinals(keys, base, count.shape[0])
    mine = keys >= 0
    src = np.broadcast_to(np.arange(keys.shape[0]).reshape(-1, 1, 1, 1, 1), keys.shape)[mine]
    route = np.broadcast_to(np.arange(plan.chunks * plan.chunk).reshape(keys.shape[1:]), keys.shape)
    expert, j = keys[mine], ordinal[mine]
    row = seg_start[expert] + _positions(expert, src, j, count)
    kept = row < capacity
    assert np.unique(row).size == row.size, "two routes on one row: the kernel would race"
    peer_rank = np.full(capacity, -1, dtype=np.int32)
    peer_token = np.full(capacity, -1, dtype=np.int32)
    peer_rank[row[kept]] = src[kept]
    peer_token[row[kept]] = route[mine][kept]
    return peer_rank, peer_token, bool((~kept).any())


def emulate(topk_all: np.ndarray, experts: int, capacity: int, rank: int):
    """The four kernels in stream order -> (peer_rank, peer_token_idx, num_tokens,
    tokens_per_expert, status)."""
    plan = make_plan(topk_all[0].size, experts)
    assert plan.warps * experts <= COUNTERS and plan.warps >= 1
    keys = local_keys(topk_all, experts, rank, plan)
    base, count = scan_columns(count_blocks(keys, experts))
    seg_start, tokens_per_expert, num_tokens = scan_segments(count, capacity)
    peer_rank, peer_token, overflow = place_routes(keys, base, count, seg_start, capacity, plan)
    word = CAPACITY_OVERFLOW if overflow else 0
    return peer_rank, peer_token, num_tokens, tokens_per_expert, word


def check_against_reference(topk_all: torch.Tensor, experts: int, capacity: int, rank: int):
    word = torch.zeros(1, dtype=torch.int32)
    want = reference_schedule.schedule(topk_all, experts, capacity, rank, word)
    got = emulate(topk_all.numpy(), experts, capacity, rank)
    names = ("peer_rank", "peer_token_idx", "num_tokens", "tokens_per_expert")
    for name, g, w in zip(names, got[:4], want, strict=True):
        g = torch.as_tensor(np.asarray(g, dtype=np.int32)).reshape(w.shape)
        bad = (g != w).nonzero()
        assert bad.numel() == 0, f"{name} differs at {bad.shape[0]} places, first {bad[0]}"
    assert got[4] == int(word), f"status {got[4]} != reference {int(word)}"
    return int(word)


def test_constants_match_the_header_and_status():
    assert CAPACITY_OVERFLOW == status.CAPACITY_OVERFLOW
    assert cuda_schedule.MAX_LOCAL_EXPERTS == COUNTERS
    path = Path(__file__).resolve().parents[2] / "csrc" / "schedule" / "schedule.h"
    if not path.is_file():
        pytest.skip(f"{path} is not in this tree (a runfiles tree without csrc/)")
    header = path.read_text()
    for name, value in {
        "kLanes": LANES,
        "kSteps": STEPS,
        "kMaxWarps": MAX_WARPS,
        "kCounters": COUNTERS,
        "kSegmentThreads": SEGMENT_THREADS,
        "kRowsPerSegment": ROWS,
        "kCapacityOverflow": CAPACITY_OVERFLOW,
    }.items():
        assert f"{name} = {value};" in header, f"{name} is not {value} in csrc/schedule/schedule.h"
    assert "kMaxLocalExperts = kCounters;" in header


def _routing(ep, tokens, topk, experts, seed, low=0, skew=None):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, ep * experts, (ep, tokens, topk), generator=gen, dtype=torch.int32)
    if skew is not None:
        ids = torch.where(torch.rand(ids.shape, generator=gen) < 0.8, skew, ids)
    return ids


def _capacity(topk_all, experts, rank, factor: float) -> int:
    """A capacity `factor` times the rows rank needs (a multiple of 256, at least 256)."""
    word = torch.zeros(1, dtype=torch.int32)
    huge = topk_all.numel() + experts * ROWS
    needed = int(
        reference_schedule.schedule(topk_all, experts, -(-huge // 256) * 256, rank, word)[2]
    )
    return max(ROWS, int(needed * factor) // ROWS * ROWS)


# (EP, T, k, E, rank): small, uneven tails, many warps per chunk, W < 8 (large E), big EP.
CASES = {
    "ep1-t1-k1-e1": (1, 1, 1, 1, 0),
    "ep2-t0-k4-e3": (2, 0, 4, 3, 1),  # no routes at all: only the fill and segment kernels
    "ep2-t40-k3-e3": (2, 40, 3, 3, 1),
    "ep3-t700-k2-e5": (3, 700, 2, 5, 2),
    "ep8-t4096-k8-e16": (8, 4096, 8, 16, 3),
    "ep4-t1000-k6-e1500": (4, 1000, 6, 1500, 0),  # 5 warps per block
    "ep1-t2000-k4-e8192": (1, 2000, 4, 8192, 0),  # one warp per block
    "ep16-t512-k6-e12": (16, 512, 6, 12, 15),
    "ep72-t300-k4-e4": (72, 300, 4, 4, 40),
    "ep7-t1111-k5-e256": (7, 1111, 5, 256, 6),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("seed", [1, 2])
def test_matches_reference(case, seed):
    ep, tokens, topk, experts, rank = case
    topk_all = _routing(ep, tokens, topk, experts, seed)
    capacity = _capacity(topk_all, experts, rank, 1.0) + 256
    assert check_against_reference(topk_all, experts, capacity, rank) == 0


@pytest.mark.parametrize("factor", [0.0, 0.3, 0.75, 0.999])
def test_overflow_matches_reference(factor):
    topk_all = _routing(4, 900, 6, 6, seed=7, skew=13)
    capacity = _capacity(topk_all, 6, 2, factor)
    assert check_against_reference(topk_all, 6, capacity, 2) == CAPACITY_OVERFLOW


def test_invalid_ids_are_never_scheduled():
    topk_all = _routing(5, 333, 3, 4, seed=3, low=-3)
    topk_all[1, 7, 2] = 5 * 4  # one past the last expert
    topk_all[2, 0, 0] = -(2**31)
    topk_all[3, 1, 1] = 2**31 - 1
    for rank in range(5):
        check_against_reference(topk_all, 4, 8192, rank)


@pytest.mark.parametrize(
    "name", ["all-to-one-expert", "empty-experts", "one-rank-gets-all", "nothing-for-rank"]
)
def test_skewed(name):
    ep, tokens, topk, experts = 6, 1000, 4, 5
    topk_all = _routing(ep, tokens, topk, experts, seed=11)
    if name == "all-to-one-expert":
        topk_all.fill_(2 * experts + 3)
    elif name == "empty-experts":
        topk_all = topk_all // experts * experts + 2 * (topk_all % 2)  # local experts 0 and 2
    elif name == "one-rank-gets-all":
        topk_all = 2 * experts + topk_all % experts
    else:
        topk_all = torch.where(topk_all // experts == 2, 0, topk_all)
    capacity = _capacity(topk_all, experts, 2, 1.0) + 512
    assert check_against_reference(topk_all, experts, capacity, 2) == 0


def test_deepseek_scale_with_overflow():
    """EP 72, 256 local experts, T*k = 100k routes per source (7.2M routes)."""
    ep, tokens, topk, experts = 72, 12500, 8, 256
    topk_all = _routing(ep, tokens, topk, experts, seed=5)
    rank = 71
    full = _capacity(topk_all, experts, rank, 1.0)
    assert check_against_reference(topk_all, experts, full, rank) == 0
    assert check_against_reference(topk_all, experts, full // 2 // 256 * 256, rank) == 2


@settings(max_examples=60, deadline=None)
@given(
    ep=st.integers(1, 12),
    tokens=st.integers(1, 600),
    topk=st.integers(1, 9),
    experts=st.sampled_from([1, 2, 3, 7, 16, 33, 300, 1025, 3000]),
    fraction=st.sampled_from([0.0, 0.5, 0.9, 1.0, 2.0]),
    data=st.data(),
)
def test_random_routing(ep, tokens, topk, experts, fraction, data):
    seed = data.draw(st.integers(0, 2**31 - 1))
    rank = data.draw(st.integers(0, ep - 1))
    topk_all = _routing(ep, tokens, topk, experts, seed, low=-2)
    capacity = _capacity(topk_all, experts, rank, fraction)
    check_against_reference(topk_all, experts, capacity, rank)
