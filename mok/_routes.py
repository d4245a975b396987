"""This rank's own routes, kept with the schedule that build_schedule made from them.

A push fills the source rank's destination (`combine_buffer`, `d_x_routed_buffer`,
`d_router_weight_buffer`) at every route some rank pushes; the others must read as zero. The
routes nobody pushes are exactly those whose expert id is invalid (-1 in build_schedule's
int32 routing) when no valid route can be dropped, i.e. when the workspace's capacity holds the
worst case (EP * T * k rows: always at EP <= 2, or with schedule_capacity_multiplier >= 1). For
such schedules the push zeroes only those rows (none in a normal step) instead of the whole
destination, whose clearing cost ~0.1 ms a pass on the DSV4-Pro-like shape (benchmarks/NOTES.md
v20). The routing is kept per schedule, not per workspace: another build_schedule (the next
microbatch) may run between a schedule's forward and its backward.

Keyed by the identity of the schedule's `peer_rank` tensor, the entry dies with it; a schedule
not made by build_schedule (the low-level `ops.schedule`) has none, and its pushes zero
everything.
"""

from __future__ import annotations

import weakref

import torch

_ROUTING: dict[int, torch.Tensor] = {}


def remember(workspace, peer_rank: torch.Tensor, routing: torch.Tensor) -> None:
    """Keep `routing` (int32 [T, k], -1 for invalid ids) for the schedule whose peer_rank is
    `peer_rank`, if the workspace's capacity rules out dropped routes."""
    worst_case = workspace.ep_size * workspace.num_local_tokens * workspace.topk
    if workspace.schedule_capacity < worst_case or torch.compiler.is_compiling():
        return
    key = id(peer_rank)
    _ROUTING[key] = routing
    weakref.finalize(peer_rank, _ROUTING.pop, key, None)


def routing_of(peer_rank: torch.Tensor) -> torch.Tensor | None:
    """The routing remembered for the schedule whose peer_rank is `peer_rank`, or None."""
    return _ROUTING.get(id(peer_rank))
