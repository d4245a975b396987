"""The reference backend: every mok op in plain PyTorch over torch.distributed (the oracle).

Data moves with collectives (gloo on CPU, NCCL on CUDA) instead of peer loads and stores, but
every op has the semantics of the CUDA kernels: pull-dispatch of token rows into the schedule
order, push-combine of expert rows into the source rank's `combine_buffer[token * topk + k]`.
Tensors cross ranks as raw bytes, so any dtype works on any backend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mok import status as device_status
from mok.backends import reference_experts as experts


def resolve_group(group_name: str) -> dist.ProcessGroup:
    if not group_name:
        return dist.group.WORLD
    return dist.distributed_c10d._resolve_process_group(group_name)


def all_gather(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    """[EP, *tensor.shape]: every rank's tensor, in rank order."""
    group = resolve_group(group_name)
    raw = tensor.contiguous().view(torch.uint8)
    parts = [torch.empty_like(raw) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, raw, group=group)
    return torch.stack(parts).view(tensor.dtype)


def routing(ids: torch.Tensor, num_experts: int, status: torch.Tensor) -> torch.Tensor:
    """int32 ids, -1 where outside [0, num_experts); INVALID_EXPERT_ID recorded if any is."""
    valid = (ids >= 0) & (ids < num_experts)
    device_status.record(status, device_status.INVALID_EXPERT_ID, ~valid)
    return torch.where(valid, ids, -1).to(torch.int32)


def all_gather_top_experts(top_experts: torch.Tensor, buffer: torch.Tensor, group_name: str):
    gathered = all_gather(top_experts, group_name)
    # Checked after the collective, which every rank joins, so a bad buffer cannot hang a peer;
    # copy_ would broadcast one rank's routing over a buffer sized for more ranks.
    if gathered.shape != buffer.shape:
        raise ValueError(
            f"`all_gather_top_experts_buffer` must be int32 [EP, T, k] = "
            f"{list(gathered.shape)} for this group of {gathered.shape[0]} ranks, "
            f"got {list(buffer.shape)}"
        )
    buffer.copy_(gathered)


def schedule(topk_all: torch.Tensor, num_local_experts: int, capacity: int, rank: int, status):
    """Rows for destination `rank`, grouped by local expert in 256-row padded segments.

    Inside a segment the source ranks take turns (round-robin: the j-th route of every source
    before the (j+1)-th of any), each source's routes in `token * topk + k` order. Padding rows
    hold -1. Routes past `capacity` are dropped and recorded in `status`.
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


def pull_rows(source: torch.Tensor, peer_rank, peer_token_idx, topk: int, group_name: str):
    """Dispatch: row i = source[peer_rank[i]][peer_token_idx[i] // topk]; zero on padding rows."""
    everyone = all_gather(source, group_name)
    rank = peer_rank.to(torch.int64).clamp(min=0)
    token = peer_token_idx.to(torch.int64).clamp(min=0) // topk
    rows = everyone[rank, token]
    pad = (peer_rank < 0).reshape(-1, *([1] * (rows.dim() - 1)))
    return torch.where(pad, torch.zeros((), dtype=rows.dtype, device=rows.device), rows)


def pull_router_weights(weights: torch.Tensor, peer_rank, peer_token_idx, group_name: str):
    """Reverse-combine helper: the fp32 router weight of each schedule row (0 on padding)."""
    everyone = all_gather(weights.reshape(-1), group_name)
    rank = peer_rank.to(torch.int64).clamp(min=0)
    flat = peer_token_idx.to(torch.int64).clamp(min=0)
    return torch.where(peer_rank >= 0, everyone[rank, flat], 0.0)


def push_rows(rows: torch.Tensor, peer_rank, peer_token_idx, destination: torch.Tensor, group_name):
    """Combine: row i goes to `destination[peer_token_idx[i]]` on rank `peer_rank[i]`.

    Every route is scheduled on exactly one rank, so each destination row has one writer;
    rows nobody sends (invalid expert ids, capacity overflow) are zero.
    """
    group = resolve_group(group_name)
    me = dist.get_rank(group)
    all_rows = all_gather(rows, group_name).flatten(0, 1)
    all_rank = all_gather(peer_rank, group_name).flatten()
    all_token = all_gather(peer_token_idx, group_name).flatten().to(torch.int64)
    slots = destination.shape[0]
    target = torch.where(all_rank == me, all_token, slots)
    landing = torch.zeros(slots + 1, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
    landing.index_copy_(0, target, all_rows)
    destination.copy_(landing[:slots].reshape(destination.shape))


class ReferenceEngine:
    """The reference backend's side of mok.backends.moe: collectives and masked fp32 GEMMs.

    `buffers` maps the workspace buffer names the passes use (x_buffer, d_y_buffer,
    router_weight_buffer, combine_buffer, d_x_routed_buffer, d_router_weight_buffer) to this
    rank's tensors; `group_name` names the EP group.
    """

    def __init__(self, buffers: dict[str, torch.Tensor], topk: int, group_name: str):
        self.buffers, self.topk, self.group_name = buffers, topk, group_name

    # The collectives complete in call order and synchronise themselves, so `background` and
    # `sync` change nothing here.
    def pull(self, name: str, schedule, background=False, *, sync=(True, True)) -> torch.Tensor:
        return pull_rows(self.buffers[name], schedule[0], schedule[1], self.topk, self.group_name)

    def pull_rounded(self, name: str, schedule, gemm, background=False, *, sync=(True, True)):
        rounded = gemm.mx_round_both(self.pull(name, schedule))
        return lambda: rounded

    def pull_rounded_rows(
        self, name: str, schedule, gemm, row_weights, background=False, *, sync=(True, True)
    ):
        rounded = experts.mx_round_d_out(gemm, self.pull(name, schedule), row_weights)
        return lambda: rounded

    def pull_router_weights(self, schedule, background=False, *, sync=(True, True)):
        weights = self.buffers["router_weight_buffer"]
        return pull_router_weights(weights, schedule[0], schedule[1], self.group_name)

    def push_all(self, pushes, schedule, background: bool = False) -> None:
        for rows, name in pushes:
            destination = self.buffers[name].view(-1, *rows.shape[1:])
            push_rows(rows, schedule[0], schedule[1], destination, self.group_name)

    @staticmethod
    def join() -> None:
        return None

    @staticmethod
    def hand_back_pushed() -> None:
        """The collectives write the given tensors themselves: nothing to copy."""
        return None

    @staticmethod
    def routed_gemms(schedule, num_experts: int) -> experts.MaskedGemms:
        rows = schedule[0].shape[0]
        return experts.MaskedGemms(experts.row_experts(schedule[3], schedule[2], rows), num_experts)

    def shared_gemms(self, tokens: int) -> experts.MaskedGemms:
        device = self.buffers["x_buffer"].device
        return experts.MaskedGemms(torch.zeros(tokens, dtype=torch.int64, device=device), 1)
