"""The functional API: build_schedule once per step, then forward and backward (see API.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mok import _validate, ops
from mok import status as device_status
from mok._checks import check_tensor, check_type
from mok._custom_op import call_validated, direct
from mok.config import MoKConfig
from mok.schedule import MoKSchedule, build_schedule
from mok.workspace import (
    MoKWorkspace,
    clear_workspace_cache,
    create_workspace,
    get_workspace,
    validate_workspace_args,
)

__all__ = [
    "MoKConfig",
    "MoKForwardContext",
    "MoKSchedule",
    "MoKWorkspace",
    "backward",
    "build_schedule",
    "check_status",
    "clear_workspace_cache",
    "create_workspace",
    "forward",
    "get_workspace",
    "validate_inputs",
    "validate_workspace_args",
]


@dataclass(frozen=True, slots=True)
class MoKForwardContext:
    """Activations the backward needs. Routed fields have one row per schedule row (C).

    | field         | BF16 mode     | MXFP8 mode                                  |
    |---------------|---------------|---------------------------------------------|
    | x_routed      | bf16 [C, H]   | (fp8 [H, C], scale): transposed, for wgrad  |
    | gate_routed   | bf16 [C, I]   | (fp8 [C, I], scale)                         |
    | up_routed     | bf16 [C, I]   | (fp8 [C, I], scale)                         |
    | hidden_routed | bf16 [C, I]   | (fp8 [I, C], scale): transposed, for wgrad  |
    | *_shared      | bf16 [T, I] or None without a shared expert                 |
    """

    x_routed: object
    gate_shared: torch.Tensor | None
    gate_routed: object
    up_shared: torch.Tensor | None
    up_routed: object
    hidden_shared: torch.Tensor | None
    hidden_routed: object


def validate_inputs(
    config,
    workspace,
    schedule,
    x,
    router_weights,
    shared_gate_weights,
    shared_up_weights,
    shared_down_weights,
    routed_gate_weights,
    routed_up_weights,
    routed_down_weights,
    swiglu_limit=None,
    *,
    backward: bool = False,
) -> bool:
    """Check every argument of forward (or backward); returns True in MXFP8 mode."""
    check_type("config", config, MoKConfig)
    check_type("workspace", workspace, MoKWorkspace)
    check_type("schedule", schedule, MoKSchedule)
    ws = workspace
    tokens, hidden, device = ws.num_local_tokens, ws.hidden_size, ws.device
    check_tensor(
        "x", x, dtype=torch.bfloat16, shape=(tokens, hidden), dims=("T", "H"), device=device
    )
    check_tensor(
        "router_weights",
        router_weights,
        dtype=torch.float32,
        shape=(tokens, ws.topk),
        dims=("T", "k"),
        device=device,
    )
    _validate.check_limit(swiglu_limit)
    capacity, sched_experts = _validate.check_schedule(*schedule.as_tuple(), device)
    if capacity != ws.schedule_rows(sched_experts):
        raise ValueError(
            f"`schedule` has {capacity} rows but this workspace builds "
            f"{ws.schedule_rows(sched_experts)}: build it with this workspace"
        )
    routed = (routed_gate_weights, routed_up_weights, routed_down_weights)
    mxfp8 = _validate.is_mxfp8(routed_gate_weights)
    if mxfp8:
        _, inter = _validate.check_routed_mxfp8(
            routed, hidden, device, backward=backward, num_experts=sched_experts
        )
    else:
        _, inter = _validate.check_routed_bf16(routed, hidden, device, sched_experts)
    shared = (shared_gate_weights, shared_up_weights, shared_down_weights)
    _validate.check_shared(shared, hidden, inter, device)
    return mxfp8


def forward(
    config: MoKConfig,
    workspace: MoKWorkspace,
    schedule: MoKSchedule,
    x: torch.Tensor,
    router_weights: torch.Tensor,
    shared_gate_weights,
    shared_up_weights,
    shared_down_weights,
    routed_gate_weights,
    routed_up_weights,
    routed_down_weights,
    swiglu_limit=None,
) -> tuple[torch.Tensor, MoKForwardContext]:
    """out[t] = shared(x_t) + sum_k rw[t, k] * expert_{e(t, k)}(x_t); returns (out, ctx).

    | argument       | dtype | shape  |
    |----------------|-------|--------|
    | x              | bf16  | [T, H] |
    | router_weights | fp32  | [T, k] |
    | output         | bf16  | [T, H] |

    Shared weights: bf16 gate/up [I, H], down [H, I], or all None. Routed weights: bf16 gate/up
    [E, I, H], down [E, H, I] (BF16 mode), or (fp8, scale) pairs from ops.mxfp8_quantize (MXFP8).
    """
    shared = (shared_gate_weights, shared_up_weights, shared_down_weights)
    routed = (routed_gate_weights, routed_up_weights, routed_down_weights)
    args = (config, workspace, schedule, x, router_weights, *shared, *routed, swiglu_limit)
    mxfp8 = validate_inputs(*args)
    ws = workspace
    ws.x_buffer.copy_(x)
    head = (ws.x_buffer, ws.x_buffer_ptrs, ws.combine_buffer, ws.combine_buffer_ptrs)
    tail = _tail(config, ws, schedule, swiglu_limit, config.fwd_num_comm_sms)
    if mxfp8:
        weights = _interleave(shared, routed_gate_weights, routed_up_weights, routed_down_weights)
        out = call_validated(ops.dispatch_mlp_swiglu_combine_fwd_mxfp8, *head, *weights, *tail)
        out = _absent_to_none(out, shared_gate_weights, (2, 5, 8, 11))
        ctx = MoKForwardContext(out[0:2], out[2], out[3:5], out[5], out[6:8], out[8], out[9:11])
        y_shared = out[11]
    else:
        weights = _interleave(
            shared, (routed_gate_weights,), (routed_up_weights,), (routed_down_weights,)
        )
        out = call_validated(ops.dispatch_mlp_swiglu_combine_fwd_bf16, *head, *weights, *tail)
        out = _absent_to_none(out, shared_gate_weights, (1, 3, 5, 7))
        ctx = MoKForwardContext(*out[:7])
        y_shared = out[7]
    output = direct(ops.fwd_epilogue)(y_shared, ws.combine_buffer, router_weights)
    _debug_check(ws)
    return output, ctx


def _tail(config, ws, schedule, swiglu_limit, num_comm_sms) -> tuple:
    """The trailing arguments every fused-pass op takes, in the original's order."""
    return (
        *schedule.as_tuple(),
        ws.topk,
        swiglu_limit,
        num_comm_sms,
        config.macrobatch_size,
        config.minibatch_size,
        ws.group_name,
    )


def _absent_to_none(outputs, shared_gate_weights, shared_positions) -> tuple:
    """The ops return 0-size tensors for the outputs of an absent shared expert."""
    if shared_gate_weights is not None:
        return tuple(outputs)
    return tuple(None if i in shared_positions else t for i, t in enumerate(outputs))


def _interleave(shared, gate, up, down) -> tuple:
    """(shared gate, *routed gate, shared up, *routed up, shared down, *routed down)."""
    return (shared[0], *gate, shared[1], *up, shared[2], *down)


def _debug_check(workspace: MoKWorkspace) -> None:
    if device_status.debug_enabled():
        device_status.check(workspace.status)


def backward(
    config: MoKConfig,
    workspace: MoKWorkspace,
    schedule: MoKSchedule,
    forward_context: MoKForwardContext,
    grad_output: torch.Tensor,
    x: torch.Tensor,
    router_weights: torch.Tensor,
    shared_gate_weights,
    shared_up_weights,
    shared_down_weights,
    routed_gate_weights,
    routed_up_weights,
    routed_down_weights,
    swiglu_limit=None,
):
    """Gradients of forward. Returns, in order: d_x bf16 [T, H], d_router_weights fp32 [T, k],
    d_routed_gate [E, I, H], d_routed_up [E, I, H], d_routed_down [E, H, I], d_shared_gate,
    d_shared_up, d_shared_down (bf16; None without a shared expert).

    MXFP8 weight forms: gate and up (fp8, scale, fp8_t, scale_t), down (fp8_t, scale_t).
    """
    shared = (shared_gate_weights, shared_up_weights, shared_down_weights)
    routed = (routed_gate_weights, routed_up_weights, routed_down_weights)
    args = (config, workspace, schedule, x, router_weights, *shared, *routed, swiglu_limit)
    mxfp8 = validate_inputs(*args, backward=True)
    check_type("forward_context", forward_context, MoKForwardContext)
    ws = workspace
    _check_context(forward_context, schedule, ws, routed_gate_weights, shared_gate_weights, mxfp8)
    check_tensor(
        "grad_output",
        grad_output,
        dtype=torch.bfloat16,
        shape=(ws.num_local_tokens, ws.hidden_size),
        dims=("T", "H"),
        device=ws.device,
    )
    ws.d_y_buffer.copy_(grad_output)
    ws.router_weight_buffer.copy_(router_weights)
    ws.x_buffer.copy_(x)
    head = (
        ws.d_y_buffer,
        ws.d_y_buffer_ptrs,
        ws.d_x_routed_buffer,
        ws.d_x_routed_buffer_ptrs,
        ws.router_weight_buffer,
        ws.router_weight_buffer_ptrs,
        ws.d_router_weight_buffer,
        ws.d_router_weight_buffer_ptrs,
    )
    tail = _tail(config, ws, schedule, swiglu_limit, config.bwd_num_comm_sms)
    c = forward_context
    if mxfp8:
        gate, up, down = routed_gate_weights, routed_up_weights, routed_down_weights
        weights = _interleave(shared, gate[2:], up[2:], down)
        saved = (
            *c.x_routed,
            c.gate_shared,
            *c.gate_routed,
            c.up_shared,
            *c.up_routed,
            c.hidden_shared,
            *c.hidden_routed,
        )
        out = call_validated(
            ops.dispatch_mlp_swiglu_combine_bwd_mxfp8,
            *head,
            *weights,
            *saved,
            ws.x_buffer,
            ws.x_buffer_ptrs,
            *gate[:2],
            *up[:2],
            *tail,
        )
    else:
        weights = _interleave(
            shared, (routed_gate_weights,), (routed_up_weights,), (routed_down_weights,)
        )
        saved = (
            c.x_routed,
            c.gate_shared,
            c.gate_routed,
            c.up_shared,
            c.up_routed,
            c.hidden_shared,
            c.hidden_routed,
        )
        out = call_validated(
            ops.dispatch_mlp_swiglu_combine_bwd_bf16,
            *head,
            *weights,
            *saved,
            ws.x_buffer,
            ws.x_buffer_ptrs,
            *tail,
        )
    out = _absent_to_none(out, shared_gate_weights, (0, 2, 4, 6, 8, 10, 12))
    d_x = direct(ops.bwd_epilogue)(out[0], ws.d_x_routed_buffer, ws.topk)
    d_router_weights = ws.d_router_weight_buffer.clone()
    _debug_check(ws)
    return (d_x, d_router_weights, out[9], out[11], out[13], out[8], out[10], out[12])


def _check_context(ctx, schedule, ws, routed_gate_weights, shared_gate_weights, mxfp8) -> None:
    """The context's tensors against this backward (the fused op trusts its checked caller)."""
    gate = routed_gate_weights[0] if mxfp8 else routed_gate_weights
    sizes = (schedule.peer_rank.shape[0], ws.num_local_tokens, ws.hidden_size, gate.shape[1])
    saved = [getattr(ctx, name) for name in _validate.SAVED_FIELDS]
    _validate.check_saved(saved, prefix="forward_context.", mxfp8=mxfp8,
                          shared=shared_gate_weights is not None, sizes=sizes,
                          device=ws.device)  # fmt: skip


def check_status(workspace: MoKWorkspace) -> None:
    """Raise MoKDeviceError for anything the device recorded on this rank, then clear it.

    One host sync; call it where a sync is acceptable (e.g. once per step or in tests).
    """
    check_type("workspace", workspace, MoKWorkspace)
    device_status.check(workspace.status)
