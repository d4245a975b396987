"""The reference backend's schedule stage: routing validity and the per-rank row schedule, in
torch ops with fixed shapes (no host sync), bit for bit what the CUDA schedule kernel builds."""

from __future__ import annotations

import torch

from mok import status as device_status


def routing(ids: torch.Tensor, num_experts: int, status: torch.Tensor) -> torch.Tensor:
    """int32 ids, -1 where outside [0, num_experts); INVALID_EXPERT_ID recorded if any is."""
    valid = (ids >= 0) & (ids < num_experts)
    device_status.record(status, device_status.INVALID_EXPERT_ID, ~valid)
    return torch.where(valid, ids, -1).to(torch.int32)


def local_schedule(ids: torch.Tensor, num_experts: int, capacity: int, status: torch.Tensor):
    """The schedule of a one-rank group straight from its int64 ids [T, k]: `schedule`'s four
    outputs, then the routing (`routing`'s int32 [T, k]) and the route rows (int32 [T * k])."""
    routes = routing(ids, num_experts, status)
    route_rows = torch.empty(routes.numel(), dtype=torch.int32, device=ids.device)
    rows = schedule(routes.unsqueeze(0), num_experts, capacity, 0, status, route_rows)
    return (*rows, routes, route_rows)


def schedule(topk_all: torch.Tensor, num_local_experts: int, capacity: int, rank: int, status,
             route_rows: torch.Tensor | None = None):  # fmt: skip
    """Rows for destination `rank`, grouped by local expert in 256-row padded segments.

    Inside a segment the source ranks take turns (round-robin: the j-th route of every source
    before the (j+1)-th of any), each source's routes in `token * topk + k` order. Padding rows
    hold -1. Routes past `capacity` are dropped and recorded in `status`. `route_rows` (int32
    [T * k], optional) receives the row of each of `rank`'s own routes, -1 for the others.
    """
    ep, tokens, topk = topk_all.shape
    n_experts, device = num_local_experts, topk_all.device
    per_src = tokens * topk
    ids = topk_all.reshape(-1).to(torch.int64)
    mine = (ids >= rank * n_experts) & (ids < (rank + 1) * n_experts)
    local = torch.where(mine, ids - rank * n_experts, n_experts)
    src = torch.arange(ep, device=device).repeat_interleave(per_src)
    route = torch.arange(per_src, device=device).repeat(ep)

    # j: ordinal of a route among the routes with the same (local expert, source).
    group = local * ep + src
    j = _ordinal_in_group(group, (n_experts + 1) * ep)
    order = torch.sort((local * per_src + j) * ep + src).indices
    local_sorted, src_sorted, route_sorted = local[order], src[order], route[order]

    counts = _count(local, n_experts + 1)[:n_experts]
    padded = (counts + 255) // 256 * 256
    segment_start = torch.cumsum(padded, 0) - padded
    first_in_sorted = torch.cumsum(counts, 0) - counts
    is_mine = local_sorted < n_experts
    expert = local_sorted.clamp(max=n_experts - 1)
    position = torch.arange(ids.numel(), device=device) - first_in_sorted[expert]
    row = segment_start[expert] + position
    kept = is_mine & (row < capacity)
    device_status.record(status, device_status.CAPACITY_OVERFLOW, is_mine & (row >= capacity))

    if route_rows is not None:
        own = kept & (src_sorted == rank)
        rows_of_own = torch.full((per_src + 1,), -1, dtype=torch.int32, device=device)
        rows_of_own.scatter_(0, torch.where(own, route_sorted, per_src), row.to(torch.int32))
        route_rows.copy_(rows_of_own[:per_src])
    target = torch.where(kept, row, capacity)
    peer_rank = torch.full((capacity + 1,), -1, dtype=torch.int32, device=device)
    peer_token = torch.full((capacity + 1,), -1, dtype=torch.int32, device=device)
    peer_rank.scatter_(0, target, src_sorted.to(torch.int32))
    peer_token.scatter_(0, target, route_sorted.to(torch.int32))
    segment_end = (segment_start + padded).clamp(max=capacity)
    kept_per_expert = (segment_end - segment_start.clamp(max=capacity)).to(torch.int32)
    num_tokens = kept_per_expert.sum().reshape(1).to(torch.int32)
    return peer_rank[:capacity], peer_token[:capacity], num_tokens, kept_per_expert


def _count(keys: torch.Tensor, size: int) -> torch.Tensor:
    """bincount with a fixed length (no data-dependent shape, so no host sync)."""
    ones = torch.ones_like(keys)
    return torch.zeros(size, dtype=torch.int64, device=keys.device).scatter_add_(0, keys, ones)


def _ordinal_in_group(keys: torch.Tensor, num_keys: int) -> torch.Tensor:
    """For each element, how many earlier elements share its key (stable, deterministic)."""
    order = torch.sort(keys, stable=True).indices
    counts = _count(keys, num_keys)
    starts = torch.cumsum(counts, 0) - counts
    ordinal = torch.empty_like(keys)
    ordinal[order] = torch.arange(keys.numel(), device=keys.device) - starts[keys[order]]
    return ordinal
