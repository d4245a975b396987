"""Per-rank bodies of the fault tests that need a group of processes (tests/cpu/distributed.py
imports them by name in each spawned rank)."""

from __future__ import annotations

from mok import functional as F


def create_with_rank_multiplier(rank: int, world_size: int) -> str | None:
    """Create a workspace whose schedule_capacity_multiplier differs on the last rank; return
    the ValueError's message (None if creation passed)."""
    multiplier = 0.75 if rank == world_size - 1 else 0.5
    config = F.MoKConfig(schedule_capacity_multiplier=multiplier)
    try:
        F.create_workspace(config, None, device="cpu", num_local_tokens=8, hidden_size=128, topk=1)
    except ValueError as error:
        return str(error)
    return None


def gather_out_of_step(rank: int, world_size: int) -> str | None:
    """Rank 0 gathers its x rows while the others gather d_y rows of the same shape and dtype
    (ranks out of step); return the ValueError's message (None if the gather passed)."""
    import torch

    from mok.backends.reference import exchange

    rows = torch.zeros(4, 128, dtype=torch.bfloat16)
    try:
        exchange.all_gather(rows, "", "x_buffer" if rank == 0 else "d_y_buffer")
    except ValueError as error:
        return str(error)
    return None


def _one_step_inputs(rank: int, world_size: int):
    import torch

    gen = torch.Generator().manual_seed(rank)
    config = F.MoKConfig()
    ws = F.create_workspace(config, None, device="cpu", num_local_tokens=8, hidden_size=128,
                            topk=2)  # fmt: skip
    top = torch.randint(0, 2 * world_size, (8, 2), generator=gen)
    x = torch.randn(8, 128, generator=gen).bfloat16()
    rw = torch.rand(8, 2, generator=gen)
    routed = [torch.randn(2, 128, 128, generator=gen).bfloat16() / 16 for _ in range(3)]
    return config, ws, top, x, rw, routed


def _step(config, ws, top, x, rw, routed, fault: str | None):
    """build_schedule, forward and backward; `fault` spoils one argument of one of them."""
    import torch

    bad_top = top.int() if fault == "build_schedule" else top
    schedule = F.build_schedule(ws, config, bad_top, num_local_experts=2)
    bad_x = x.float() if fault == "forward" else x
    out, ctx = F.forward(config, ws, schedule, bad_x, rw, None, None, None, *routed)
    grad = out[:, :64] if fault == "backward" else out
    grads = F.backward(config, ws, schedule, ctx, grad, x, rw, None, None, None, *routed)
    return (
        float(out.float().sum())
        + sum(float(g.float().sum()) for g in grads[:5])
        + 0 * len(torch.__version__)
    )


def last_rank_fails_validation(rank: int, world_size: int, fault: str):
    """The last rank passes a bad argument to `fault`'s call; every rank returns (its error,
    seconds until it, the checksum of a clean retry by every rank)."""
    import time

    config, ws, top, x, rw, routed = _one_step_inputs(rank, world_size)
    start = time.monotonic()
    try:
        _step(config, ws, top, x, rw, routed, fault if rank == world_size - 1 else None)
        error = None
    except (ValueError, TypeError) as caught:
        error = f"{type(caught).__name__}: {caught}"
    elapsed = time.monotonic() - start
    return error, elapsed, _step(config, ws, top, x, rw, routed, None)


def last_rank_never_arrives(rank: int, world_size: int, seconds: float):
    """With MOK_COMM_TIMEOUT_S set, the other ranks' first exchange gives up on a last rank
    that never calls; returns (error message, seconds until it) on the others."""
    import os
    import time

    os.environ["MOK_COMM_TIMEOUT_S"] = str(seconds)
    config, ws, top, *_ = _one_step_inputs(rank, world_size)
    if rank == world_size - 1:
        time.sleep(4 * seconds)
        return None
    start = time.monotonic()
    try:
        F.build_schedule(ws, config, top, num_local_experts=2)
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return "no error", time.monotonic() - start
