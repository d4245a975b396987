"""MoKSchedule and build_schedule: routing -> per-rank row schedule, on the device, no sync."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mok import _routes, backends, ops
from mok import status as device_status
from mok._checks import check_range, check_tensor, check_type
from mok._custom_op import direct
from mok.config import MoKConfig
from mok.workspace import MoKWorkspace


@dataclass(frozen=True, slots=True)
class MoKSchedule:
    """Which routed rows this rank computes, grouped by local expert.

    | field             | dtype | shape | meaning                                              |
    |-------------------|-------|-------|------------------------------------------------------|
    | peer_rank         | int32 | [C]   | source rank of each row, -1 on padding rows          |
    | peer_token_idx    | int32 | [C]   | `token * topk + slot` on the source rank, -1 on pad  |
    | num_tokens        | int32 | [1]   | padded total rows (a multiple of 256), on the device |
    | tokens_per_expert | int32 | [E]   | padded rows of each local expert                     |
    """

    peer_rank: torch.Tensor
    peer_token_idx: torch.Tensor
    num_tokens: torch.Tensor
    tokens_per_expert: torch.Tensor

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.peer_rank, self.peer_token_idx, self.num_tokens, self.tokens_per_expert)


def build_schedule(
    workspace: MoKWorkspace,
    config: MoKConfig,
    top_experts: torch.Tensor,
    *,
    num_local_experts: int,
) -> MoKSchedule:
    """All-gather the routing and build this rank's schedule on the device (no host sync).

    `top_experts` is int64 [T, k] of global expert ids; expert e lives on rank
    e // num_local_experts. An id outside [0, EP * E) is recorded in the status word
    (see `check_status`) and the route contributes exactly zero. The int32 routing stays with
    the schedule (mok._routes), so its pushes clear only the rows of those routes.
    """
    check_type("workspace", workspace, MoKWorkspace)
    check_type("config", config, MoKConfig)
    ws = workspace
    check_tensor(
        "top_experts",
        top_experts,
        dtype=torch.int64,
        shape=(ws.num_local_tokens, ws.topk),
        dims=("T", "k"),
        device=ws.device,
    )
    check_range("num_local_experts", num_local_experts, 1, (2**31 - 1) // ws.ep_size)
    num_experts = ws.ep_size * num_local_experts
    routing = _routing(top_experts, num_experts, ws.status)
    result = direct(ops.schedule_op)(
        _all_gather(ws, config, routing),
        num_local_experts,
        ws.schedule_rows(num_local_experts),
        ws.ep_rank,
        ws.status,
    )
    if device_status.debug_enabled():
        device_status.check(ws.status)
    _routes.remember(ws, result[0], routing)
    return MoKSchedule(*result)


def _all_gather(ws: MoKWorkspace, config: MoKConfig, routing: torch.Tensor) -> torch.Tensor:
    """Every rank's routing (int32 [EP, T, k]). One rank's is its own: at EP 1 the copy into
    the workspace's all-gather buffer (a kernel and ~40 µs of host time before the first GEMM)
    is left out."""
    if ws.ep_size == 1:
        return routing.unsqueeze(0)
    direct(ops.all_gather_top_experts)(
        routing,
        ws.all_gather_top_experts_buffer,
        0,
        ws.ep_rank,
        config.all_gather_top_experts_chunk_bytes,
        ws.group_name,
    )
    return ws.all_gather_top_experts_buffer


def _routing(top_experts: torch.Tensor, num_experts: int, status: torch.Tensor) -> torch.Tensor:
    """int32 ids, -1 for the invalid ones, which `status` records: one kernel on CUDA in eager
    mode; torch ops (the same bits) elsewhere and while torch.compile traces, which cannot
    follow a raw kernel launch."""
    if not torch.compiler.is_compiling() and backends.uses_cuda(top_experts.device):
        from mok.backends import cuda_schedule

        return cuda_schedule.routing(top_experts, num_experts, status)
    from mok.backends import reference

    return reference.routing(top_experts, num_experts, status)
