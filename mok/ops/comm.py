"""The routing all-gather and the device-side barrier as custom ops (the original's call forms)."""

from __future__ import annotations

import torch
from torch.library import custom_op

from mok import backends
from mok._arguments import check_multiple, check_tensor


@custom_op("mok::all_gather_top_experts", mutates_args=("all_gather_top_experts_buffer",))
def all_gather_top_experts(
    top_experts: torch.Tensor,
    all_gather_top_experts_buffer: torch.Tensor,
    all_gather_top_experts_buffer_multicast_ptr: int,
    rank: int,
    chunk_bytes: int,
    group_name: str = "",
) -> None:
    """Every rank gets the whole routing table.

    | argument                      | dtype | shape              |
    |-------------------------------|-------|--------------------|
    | top_experts                   | int32 | [T, k]             |
    | all_gather_top_experts_buffer | int32 | [EP, T, k] (out)   |

    The multicast pointer is accepted for compatibility and ignored (mok uses no multicast).
    """
    buffer = all_gather_top_experts_buffer
    check_tensor("top_experts", top_experts, dtype=torch.int32, shape=(None, None), dims=("T", "k"))
    check_tensor(
        "all_gather_top_experts_buffer",
        buffer,
        dtype=torch.int32,
        shape=(None, *top_experts.shape),
        dims=("EP", "T", "k"),
        device=top_experts.device,
    )
    if not 0 <= rank < buffer.shape[0]:
        raise ValueError(f"`rank` must be in [0, {buffer.shape[0]}), got {rank}")
    check_multiple("chunk_bytes", chunk_bytes, 16)
    backend = backends.for_device(top_experts.device)
    backend.all_gather_top_experts(top_experts, buffer, group_name, chunk_bytes)


@all_gather_top_experts.register_fake
def _(top_experts, buffer, multicast_ptr, rank, chunk_bytes, group_name=""):
    return None


@custom_op("mok::barrier_all", mutates_args=("barrier_buffer", "target"))
def barrier_all(
    barrier_buffer: torch.Tensor,
    barrier_buffer_ptrs: list[int],
    barrier_buffer_multicast_ptr: int,
    target: torch.Tensor,
    group_name: str = "",
) -> None:
    """Barrier over the EP group; `target` is the epoch counter (int32 [1]), bumped by one."""
    backend = backends.for_device(barrier_buffer.device)
    backend.barrier(barrier_buffer, barrier_buffer_ptrs, target, group_name)


@barrier_all.register_fake
def _(barrier_buffer, barrier_buffer_ptrs, barrier_buffer_multicast_ptr, target, group_name=""):
    return None
