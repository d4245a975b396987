"""mok.ops keeps the original's call forms (API.md): `schedule(topk_all, num_local_experts,
schedule_capacity, rank)` without mok's status word and `bwd_epilogue(d_x_shared,
d_x_routed_buffer)` without mok's topk, each giving what the longer form gives; and the
reference paths of the epilogues and the routing all-gather check their arguments as the CUDA
ones do."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mok import ops

EP, TOKENS, TOPK, EXPERTS = 2, 40, 3, 4


def _routing(seed: int, ep=EP, tokens=TOKENS, topk=TOPK, experts=EXPERTS) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, ep * experts, (ep, tokens, topk), generator=gen, dtype=torch.int32)


def test_schedule_without_status_is_the_schedule_with_it():
    topk_all = _routing(0)
    rows = ops.schedule_worst_case_rows(topk_all.numel(), EXPERTS)
    status = torch.zeros(1, dtype=torch.int32)
    want = ops.schedule(topk_all, EXPERTS, rows, 1, status)
    got = ops.schedule(topk_all, EXPERTS, rows, 1)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert int(status) == 0


def test_schedule_without_status_takes_the_originals_capacity():
    """The original's call form with its capacity T * k * max(2, ceil(EP * multiplier)): the
    schedule of C rows, and an overflow recorded in the device's word, never a trap."""
    from mok import status
    from mok.config import MoKConfig

    word = ops.schedule_status("cpu")
    status.check(word)  # start clean
    topk_all = torch.zeros(4, 64, 4, dtype=torch.int32)  # every route to rank 0, expert 0
    capacity = MoKConfig().schedule_capacity(4, 64, 4)
    assert capacity == 64 * 4 * 2
    peer_rank, _, num_tokens, _ = ops.schedule(topk_all, EXPERTS, capacity, 0)
    assert peer_rank.shape == (capacity,) and int(num_tokens) == capacity
    with pytest.raises(RuntimeError, match="capacity"):
        status.check(word)
    assert int(word) == 0, "check clears it"
    ops.schedule(topk_all, EXPERTS, capacity, 1)  # rank 1 receives nothing: clean
    status.check(word)


@pytest.mark.parametrize(("routes", "experts"), [(1000, 4), (300, 1), (257, 3), (5, 8)], ids=str)
def test_worst_case_rows_is_reached_and_suffices(routes, experts):
    """Every expert but the last gets one route (a whole padded segment each), the last the
    rest: the schedule needs exactly the bound, one segment less overflows."""
    used = min(experts, routes)
    ids = torch.cat([torch.arange(used - 1), torch.full((routes - used + 1,), used - 1)])
    topk_all = ids.to(torch.int32).reshape(1, routes, 1)
    rows = ops.schedule_worst_case_rows(routes, experts)
    status = torch.zeros(1, dtype=torch.int32)
    _, _, num_tokens, _ = ops.schedule(topk_all, experts, rows, 0, status)
    assert int(num_tokens) == rows and int(status) == 0
    ops.schedule(topk_all, experts, rows - 256, 0, status)
    assert int(status) != 0


@settings(max_examples=40, deadline=None)
@given(
    ep=st.integers(1, 3), tokens=st.integers(1, 50), topk=st.integers(1, 4),
    experts=st.integers(1, 6), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_no_routing_overflows_the_worst_case(ep, tokens, topk, experts, seed):
    topk_all = _routing(seed, ep, tokens, topk, experts)
    rows = ops.schedule_worst_case_rows(topk_all.numel(), experts)
    status = torch.zeros(1, dtype=torch.int32)
    for rank in range(ep):
        ops.schedule(topk_all, experts, rows, rank, status)
    assert int(status) == 0


def _bf16(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def test_bwd_epilogue_takes_k_from_the_shared_rows():
    shared, routed = _bf16(5, 128, seed=1), _bf16(15, 128, seed=2)
    assert torch.equal(ops.bwd_epilogue(shared, routed), ops.bwd_epilogue(shared, routed, 3))


@pytest.mark.parametrize(
    ("shared", "routed", "message"),
    [
        (None, _bf16(15, 128), r"`topk` must be given when `d_x_shared` is None"),
        (_bf16(4, 128), _bf16(15, 128), r"`d_x_routed_buffer` must have T \* k rows for "
         r"`d_x_shared`'s T = 4, got 15: pass `topk`"),
        (_bf16(0, 128), _bf16(0, 128), r"T = 0, got 0: pass `topk`"),
    ],
    ids=["no-shared", "rows-not-multiple", "no-tokens"],
)  # fmt: skip
def test_bwd_epilogue_without_k_says_when_it_is_needed(shared, routed, message):
    with pytest.raises(ValueError, match=message):
        ops.bwd_epilogue(shared, routed)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: ops.fwd_epilogue(None, _bf16(9, 128), torch.rand(4, 2)), ValueError,
         r"`combine_buffer` must be bf16 \[T \* k, H\] with k = 2"),
        (lambda: ops.fwd_epilogue(None, _bf16(8, 128).float(), torch.rand(4, 2)), TypeError,
         r"`combine_buffer` must be bf16"),
        (lambda: ops.fwd_epilogue(_bf16(5, 128), _bf16(8, 128), torch.rand(4, 2)), ValueError,
         r"`y_shared` must be bf16 \[T, H\] = \[4, 128\]"),
        (lambda: ops.fwd_epilogue(None, _bf16(8, 128), torch.rand(4, 2).double()), TypeError,
         r"`topk_weights` must be float32"),
        (lambda: ops.bwd_epilogue(None, _bf16(9, 128), 2), ValueError,
         r"`d_x_routed_buffer` must be bf16 \[T \* k, H\] with k = 2"),
        (lambda: ops.bwd_epilogue(_bf16(4, 129), _bf16(8, 128), 2), ValueError,
         r"`d_x_shared` must be bf16 \[T, H\] = \[4, 128\]"),
    ],
    ids=["fwd-rows", "fwd-dtype", "fwd-shared", "fwd-weights", "bwd-rows", "bwd-shared"],
)  # fmt: skip
def test_reference_epilogues_check_their_arguments(call, error, message):
    """These once computed garbage or failed inside torch on the reference path."""
    with pytest.raises(error, match=message):
        call()


def test_bwd_epilogue_without_k_traces():
    """The fake implementation takes T from d_x_shared too (torch.compile, fullgraph)."""
    shared, routed = _bf16(5, 128, seed=3), _bf16(10, 128, seed=4)
    compiled = torch.compile(lambda s, r: ops.bwd_epilogue(s, r), fullgraph=True,
                             backend="aot_eager")  # fmt: skip
    assert torch.equal(compiled(shared, routed), ops.bwd_epilogue(shared, routed, 2))


@pytest.mark.parametrize(
    ("buffer_ranks", "chunk_bytes", "message"),
    [(2, 2048, r"`all_gather_top_experts_buffer` must be int32 \[EP, T, k\] = \[1, 8, 2\] for "
      r"this group of 1 ranks, got \[2, 8, 2\]"),
     (1, 0, r"`chunk_bytes` must be a multiple of 16 and >= 1, got 0")],
    ids=["buffer-for-more-ranks", "chunk-bytes"],
)  # fmt: skip
def test_reference_all_gather_checks_its_arguments(single_rank_group, buffer_ranks, chunk_bytes,
                                                   message):  # fmt: skip
    """A buffer for more ranks than the group once got one rank's routing in every row."""
    top = torch.ones(8, 2, dtype=torch.int32)
    buffer = torch.zeros(buffer_ranks, 8, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        ops.all_gather_top_experts(top, buffer, 0, 0, chunk_bytes,
                                   single_rank_group.group_name)  # fmt: skip
    assert not buffer.any()


def test_the_all_gather_op_hands_its_chunk_bytes_to_the_backend(single_rank_group, monkeypatch):
    from mok.backends.reference import kernels

    seen, original = [], kernels.all_gather_top_experts

    def recording(top_experts, buffer, group_name, chunk_bytes=0):
        seen.append(chunk_bytes)
        original(top_experts, buffer, group_name, chunk_bytes)

    monkeypatch.setattr(kernels, "all_gather_top_experts", recording)
    top = torch.ones(8, 2, dtype=torch.int32)
    buffer = torch.zeros(1, 8, 2, dtype=torch.int32)
    ops.all_gather_top_experts(top, buffer, 0, 0, 48, single_rank_group.group_name)
    assert seen == [48] and torch.equal(buffer[0], top)
