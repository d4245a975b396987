"""The combine at EP 1 reads the routed rows in place (MoKSchedule.route_rows): no push into
the combine buffers, the same bits as the pushes give (the CUDA kernels' bits against the
same step with the pushes: tests/gpu/test_combine_in_place_cuda.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mok import functional as F
from mok.schedule import rows_of_routes

T, H, I, E, K = 48, 128, 128, 3, 4


def _bf16(*shape, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) / 8).bfloat16()


def _step(group):
    config = F.MoKConfig()
    ws = F.create_workspace(config, group, device="cpu", num_local_tokens=T, hidden_size=H,
                            topk=K)  # fmt: skip
    gen = torch.Generator().manual_seed(11)
    top = torch.randint(0, E, (T, K), generator=gen)
    top[3, 1] = E + 7  # an invalid id: its route has no row
    top[5, 0] = -1
    rw = torch.rand(T, K, generator=gen)
    rw[3, 1] = float("nan")  # weighs nothing: the route is invalid
    return config, ws, F.build_schedule(ws, config, top, num_local_experts=E), rw


def _weights(shared: bool):
    routed = (_bf16(E, I, H, seed=7), _bf16(E, I, H, seed=8), _bf16(E, H, I, seed=9))
    own = (_bf16(I, H, seed=4), _bf16(I, H, seed=5), _bf16(H, I, seed=6)) if shared else (None,) * 3
    return (*own, *routed)


def _train_step(config, ws, schedule, rw, weights):
    x, d_out = _bf16(T, H, seed=1), _bf16(T, H, seed=2)
    out, ctx = F.forward(config, ws, schedule, x, rw, *weights)
    grads = F.backward(config, ws, schedule, ctx, d_out, x, rw, *weights)
    return (out, *grads)


def test_route_rows_invert_the_schedule(single_rank_group):
    _, _, schedule, _ = _step(single_rank_group)
    rows = schedule.route_rows
    assert rows is not None and rows.dtype == torch.int32 and rows.shape == (T * K,)
    placed = torch.nonzero(schedule.peer_rank == 0).flatten()
    assert torch.equal(rows[schedule.peer_token_idx[placed].long()], placed.int())
    assert (rows >= 0).sum() == placed.numel() == T * K - 2
    assert rows[3 * K + 1] == -1 and rows[5 * K] == -1


@pytest.mark.parametrize("shared", [False, True])
def test_reading_in_place_gives_the_bits_of_the_pushes(single_rank_group, shared):
    config, ws, schedule, rw = _step(single_rank_group)
    pushed = dataclasses.replace(schedule, route_rows=None)
    sentinel = torch.full_like(ws.combine_buffer, 3.0)
    ws.combine_buffer.copy_(sentinel)
    ws.d_x_routed_buffer.copy_(sentinel)
    got = _train_step(config, ws, schedule, rw, _weights(shared))
    assert torch.equal(ws.combine_buffer, sentinel), "read in place: nothing is pushed"
    assert torch.equal(ws.d_x_routed_buffer, sentinel)
    want = _train_step(config, ws, pushed, rw, _weights(shared))
    assert not torch.equal(ws.combine_buffer, sentinel), "the pushes did run"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert torch.equal(a, b), f"output {i} differs"
    assert torch.isfinite(got[0].float()).all()


def test_rows_of_routes_reads_zeros_where_a_route_has_no_row():
    rows = torch.arange(12, dtype=torch.float32).view(4, 3) + 1
    picked = rows_of_routes(rows, torch.tensor([2, -1, 0, 4], dtype=torch.int32))
    assert torch.equal(picked, torch.stack([rows[2], torch.zeros(3), rows[0], torch.zeros(3)]))
    flat = rows_of_routes(torch.tensor([5.0, 6.0]), torch.tensor([1, -1, 0], dtype=torch.int32))
    assert torch.equal(flat, torch.tensor([6.0, 0.0, 5.0]))
