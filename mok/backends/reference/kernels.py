"""The reference backend's face for mok.backends' registry: the same functions as
mok.backends.cuda.kernels, in plain PyTorch over torch.distributed (the oracle)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mok import mxfp8
from mok import status as device_status
from mok.backends.reference import exchange
from mok.backends.reference import schedule as schedule_stage
from mok.backends.reference.engine import ReferenceEngine, group_of
from mok.backends.reference.exchange import resolve_group
from mok.schedule import rows_of_routes

mxfp8_quantize = mxfp8.quantize
routing = schedule_stage.routing
schedule = schedule_stage.schedule
local_schedule = schedule_stage.local_schedule


def engine(workspace, config=None) -> ReferenceEngine:
    """mok.passes' engine on a workspace's buffers."""
    return ReferenceEngine.of_workspace(workspace)


def op_engine(buffers: dict[str, torch.Tensor], x_ptrs, topk: int, group_name: str, config=None):
    """The engine of a fused op called with the original's flat arguments: the given tensors
    themselves are the buffers (the pointer lists mean nothing off CUDA; the reference has no
    speed knobs, so `config` changes nothing)."""
    return ReferenceEngine(buffers, topk, group_name)


def all_gather_top_experts(top_experts, buffer, group_name: str, chunk_bytes: int = 0) -> None:
    """The collective moves the table whole: `chunk_bytes` (checked by the op) changes nothing."""
    exchange.all_gather_top_experts(top_experts, buffer, group_name)


def gather_routing(workspace, routing: torch.Tensor, chunk_bytes: int = 0) -> torch.Tensor:
    """Every rank's routing into the workspace's all-gather buffer (int32 [EP, T, k]); the
    collective moves it whole, whatever `chunk_bytes`."""
    buffer = workspace.all_gather_top_experts_buffer
    exchange.all_gather_top_experts(routing, buffer, group_of(workspace))
    return buffer


def combine_status(workspace, num_local_experts: int) -> None:
    """OR every rank's status word into each rank's (mok.status.combine). Ranks that passed
    different num_local_experts raise here, on every rank alike: the reference's collectives
    would otherwise meet tensors of different sizes (the CUDA backend records RANKS_DISAGREE)."""
    mine = device_status.word(workspace.status, num_local_experts)
    gathered = exchange.all_gather(mine, group_of(workspace), "status")
    experts = gathered[:, 1].tolist()
    if len(set(experts)) > 1:
        raise ValueError(
            "every rank must pass the same num_local_experts to build_schedule; the ranks "
            f"passed {experts} (in rank order)"
        )
    device_status.combine(workspace.status, gathered, num_local_experts)


def barrier(barrier_buffer, barrier_buffer_ptrs, target, group_name: str) -> None:
    dist.barrier(group=resolve_group(group_name))
    target.add_(1)


def fwd_epilogue(y_shared, combine_buffer, topk_weights, route_rows=None) -> torch.Tensor:
    """out[t] = bf16(y_shared[t] + sum_j w[t, j] * combine_buffer[t * k + j]), fp32, j in order.
    With `route_rows` (MoKSchedule.route_rows) `combine_buffer` is the routed rows, read in
    place (mok.schedule.rows_of_routes)."""
    tokens, topk = topk_weights.shape
    if route_rows is not None:
        combine_buffer = rows_of_routes(combine_buffer, route_rows)
    routed = combine_buffer.float().reshape(tokens, topk, -1)
    total = torch.zeros_like(routed[:, 0]) if y_shared is None else y_shared.float()
    for slot in range(topk):
        total = total + topk_weights[:, slot, None] * routed[:, slot]
    return total.to(torch.bfloat16)


def bwd_epilogue(d_x_shared, d_x_routed_buffer, topk: int, route_rows=None) -> torch.Tensor:
    """d_x[t] = bf16(d_x_shared[t] + sum_j d_x_routed_buffer[t * k + j]), fp32, j in order;
    `route_rows` as fwd_epilogue's."""
    if route_rows is not None:
        d_x_routed_buffer = rows_of_routes(d_x_routed_buffer, route_rows)
    routed = d_x_routed_buffer.float().reshape(-1, topk, d_x_routed_buffer.shape[1])
    total = torch.zeros_like(routed[:, 0]) if d_x_shared is None else d_x_shared.float()
    for slot in range(topk):
        total = total + routed[:, slot]
    return total.to(torch.bfloat16)
