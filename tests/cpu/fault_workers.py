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
