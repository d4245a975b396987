"""The schedule: every route exactly once, 256-row padded expert segments, round-robin sources.

`expected_schedule` is an independent, loop-based statement of the documented order; the
reference op must match it exactly.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mok import status
from mok.backends.reference import schedule as reference_schedule


def expected_schedule(topk_all: torch.Tensor, num_local_experts: int, rank: int):
    """Rows for `rank` as a list of (src, token*k+slot) or None (padding), per local expert."""
    ep, tokens, topk = topk_all.shape
    rows, per_expert = [], []
    for local in range(num_local_experts):
        wanted = rank * num_local_experts + local
        queues = [
            [
                t * topk + s
                for t in range(tokens)
                for s in range(topk)
                if topk_all[src, t, s] == wanted
            ]
            for src in range(ep)
        ]
        segment = []
        for round_index in range(max(len(q) for q in queues)):
            segment += [
                (src, q[round_index]) for src, q in enumerate(queues) if round_index < len(q)
            ]
        padded = -(-len(segment) // 256) * 256
        rows += segment + [None] * (padded - len(segment))
        per_expert.append(padded)
    return rows, per_expert


def run(topk_all, num_local_experts, capacity, rank):
    word = torch.zeros(1, dtype=torch.int32)
    out = reference_schedule.schedule(
        topk_all.to(torch.int32), num_local_experts, capacity, rank, word
    )
    return (*out, int(word))


def as_rows(peer_rank, peer_token, count):
    return [
        None if int(r) < 0 else (int(r), int(t))
        for r, t in zip(peer_rank[:count], peer_token[:count], strict=True)
    ]


CASES = {
    "ep1-one-expert": (1, 8, 2, 1),
    "ep2-uniform": (2, 40, 3, 3),
    "ep4-top1": (4, 33, 1, 2),
    "ep3-many-experts": (3, 16, 4, 5),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_loop_statement(case):
    ep, tokens, topk, experts = case
    generator = torch.Generator().manual_seed(hash(case) % 2**31)
    topk_all = torch.randint(0, ep * experts, (ep, tokens, topk), generator=generator)
    for rank in range(ep):
        rows, per_expert = expected_schedule(topk_all, experts, rank)
        capacity = len(rows) + 256
        peer_rank, peer_token, num_tokens, tpe, word = run(topk_all, experts, capacity, rank)
        assert word == 0
        assert int(num_tokens) == len(rows)
        assert tpe.tolist() == per_expert
        assert as_rows(peer_rank, peer_token, capacity) == rows + [None] * 256


def test_skewed_everything_to_one_expert():
    topk_all = torch.full((2, 300, 1), 3)
    peer_rank, peer_token, num_tokens, tpe, word = run(topk_all, 2, 1024, rank=1)
    assert tpe.tolist() == [0, 768] and int(num_tokens) == 768 and word == 0
    assert peer_rank[:600].tolist() == [0, 1] * 300
    assert peer_token[:6].tolist() == [0, 0, 1, 1, 2, 2]
    assert (peer_rank[600:] == -1).all() and (peer_token[600:] == -1).all()


def test_rank_receiving_nothing():
    topk_all = torch.zeros((2, 10, 2), dtype=torch.int64)
    peer_rank, _, num_tokens, tpe, word = run(topk_all, 1, 256, rank=1)
    assert int(num_tokens) == 0 and tpe.tolist() == [0] and (peer_rank == -1).all()


def test_invalid_ids_are_never_scheduled():
    topk_all = torch.tensor([[[-1, 0], [2, 1]]])
    peer_rank, peer_token, num_tokens, tpe, _ = run(topk_all, 2, 1024, rank=0)
    assert tpe.tolist() == [256, 256]
    assert as_rows(peer_rank, peer_token, 1) == [(0, 1)]
    assert as_rows(peer_rank, peer_token, 257)[256] == (0, 3)


def test_overflow_is_recorded_and_bounded():
    topk_all = torch.zeros((1, 300, 1), dtype=torch.int64)
    peer_rank, peer_token, num_tokens, tpe, word = run(topk_all, 1, 256, rank=0)
    assert word == status.CAPACITY_OVERFLOW
    assert int(num_tokens) == 256 and tpe.tolist() == [256]
    assert peer_token.tolist() == list(range(256))


def test_deterministic():
    topk_all = torch.randint(0, 8, (4, 64, 4))
    first = run(topk_all, 2, 4096, 1)
    second = run(topk_all, 2, 4096, 1)
    for a, b in zip(first[:4], second[:4], strict=True):
        assert torch.equal(a, b)


@settings(max_examples=40, deadline=None)
@given(
    ep=st.integers(1, 5),
    tokens=st.integers(1, 40),
    topk=st.integers(1, 4),
    experts=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_every_route_exactly_once(ep, tokens, topk, experts, seed):
    generator = torch.Generator().manual_seed(seed)
    topk_all = torch.randint(-1, ep * experts + 1, (ep, tokens, topk), generator=generator)
    seen = []
    for rank in range(ep):
        peer_rank, peer_token, num_tokens, tpe, word = run(topk_all, experts, 8192, rank)
        assert word == 0
        assert int(num_tokens) == int(tpe.sum()) and (tpe % 256 == 0).all()
        rows = as_rows(peer_rank, peer_token, 8192)
        assert all(r is None for r in rows[int(num_tokens) :])
        seen += [row for row in rows if row is not None]
        for src, flat in (row for row in rows if row is not None):
            expert = int(topk_all[src].reshape(-1)[flat])
            assert expert // experts == rank
    valid = [
        (s, f)
        for s in range(ep)
        for f in range(tokens * topk)
        if 0 <= int(topk_all[s].reshape(-1)[f]) < ep * experts
    ]
    assert sorted(seen) == sorted(valid)
