"""The functional API: build_schedule once per step, then forward and backward (see API.md).

Each function checks its arguments once, then runs on the workspace's own objects: the
registry's backend (mok.backends) for the schedule and the epilogues, mok.passes for the
expert passes. While torch.compile traces, it calls the flat ops of mok.ops instead, whose fake
implementations the compiler follows and which run the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mok import _moe_arguments, backends, ops, passes, settings
from mok import status as device_status
from mok._arguments import check_range, check_tensor, check_type
from mok._moe_arguments import check_context as _check_context
from mok.backends.reference import exchange
from mok.config import MoKConfig
from mok.ops import fused_backward, fused_forward
from mok.schedule import MoKSchedule, contained, route_rows_to_fill, rows_of_routes
from mok.workspace import (
    Buffer,
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
    """Activations the backward needs. Routed fields have R = min(C, macrobatch_size + 256 *
    E) rows: one per schedule row, or the macrobatch ring's (mok.macrobatch: the backward
    recomputes the rows before it).

    | field         | BF16 mode     | MXFP8 mode                                  |
    |---------------|---------------|---------------------------------------------|
    | x_routed      | bf16 [R, H]   | (fp8 [H, R], scale): transposed, for wgrad  |
    | gate_routed   | bf16 [R, I]   | (fp8 [R, I], scale)                         |
    | up_routed     | bf16 [R, I]   | (fp8 [R, I], scale)                         |
    | hidden_routed | bf16 [R, I]   | (fp8 [I, R], scale): transposed, for wgrad  |
    | *_shared      | bf16 [T, I] or None without a shared expert                 |

    (mok) `schedule` and `workspace` are those forward ran with: backward refuses a context
    made with others, whose rows would belong to another routing.
    """

    x_routed: object
    gate_shared: torch.Tensor | None
    gate_routed: object
    up_shared: torch.Tensor | None
    up_routed: object
    hidden_shared: torch.Tensor | None
    hidden_routed: object
    schedule: MoKSchedule | None = None
    workspace: MoKWorkspace | None = None


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
    _moe_arguments.check_limit(swiglu_limit)
    capacity, sched_experts = _moe_arguments.check_schedule(*schedule.as_tuple(), device)
    if capacity != ws.schedule_rows(sched_experts):
        raise ValueError(
            f"`schedule` has {capacity} rows but this workspace builds "
            f"{ws.schedule_rows(sched_experts)}: build it with this workspace"
        )
    routed = (routed_gate_weights, routed_up_weights, routed_down_weights)
    mxfp8 = _moe_arguments.is_mxfp8(routed_gate_weights)
    if mxfp8:
        _, inter = _moe_arguments.check_routed_mxfp8(
            routed, hidden, device, backward=backward, num_experts=sched_experts
        )
    else:
        _, inter = _moe_arguments.check_routed_bf16(routed, hidden, device, sched_experts)
    shared = (shared_gate_weights, shared_up_weights, shared_down_weights)
    _moe_arguments.check_shared(shared, hidden, inter, device)
    return mxfp8


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
    (see `check_status`) and the route contributes exactly zero.
    """
    check_type("workspace", workspace, MoKWorkspace)
    ws = workspace
    with _announcing(ws):
        check_type("config", config, MoKConfig)
        check_tensor(
            "top_experts",
            top_experts,
            dtype=torch.int64,
            shape=(ws.num_local_tokens, ws.topk),
            dims=("T", "k"),
            device=ws.device,
        )
        check_range("num_local_experts", num_local_experts, 1, (2**31 - 1) // ws.ep_size)
    rows = ws.schedule_rows(num_local_experts)
    if ws.ep_size == 1 and not torch.compiler.is_compiling():
        # One rank's schedule straight from its ids: the routing and the route rows come with
        # it, from the same launches (docs/host-overhead.md).
        backend = backends.for_device(ws.device)
        *result, routing, route_rows = backend.local_schedule(
            top_experts, num_local_experts, rows, ws.status
        )
    else:
        result, routing, route_rows = _gathered_schedule(ws, config, top_experts,
                                                         num_local_experts, rows)  # fmt: skip
    if settings.debug():
        device_status.check(ws.status)
    return MoKSchedule(*result, routes=routing, routes_complete=_keeps_every_route(ws),
                       route_rows=route_rows)  # fmt: skip


def _gathered_schedule(ws: MoKWorkspace, config: MoKConfig, top_experts, num_local_experts, rows):
    """(schedule outputs, routing, route rows or None): the routing validated, all-gathered and
    scheduled in turn, every rank's status word combined."""
    routing = _routing(top_experts, ws.ep_size * num_local_experts, ws.status)
    schedule = _eager_backend_or(ops.schedule_op, "schedule", ws.device)
    gathered = _all_gather(ws, config, routing)
    route_rows = route_rows_to_fill(ws.ep_size, ws.num_local_tokens * ws.topk, ws.device)
    in_place = {} if route_rows is None else {"route_rows": route_rows}
    result = schedule(gathered, num_local_experts, rows, ws.ep_rank, ws.status, **in_place)
    _combine_status(ws, num_local_experts)
    return result, routing, route_rows


def _keeps_every_route(ws: MoKWorkspace) -> bool:
    """Whether no route can be dropped (the capacity holds the worst case). Not while
    torch.compile traces: the flat fused ops it calls take no routes."""
    worst_case = ws.ep_size * ws.num_local_tokens * ws.topk
    return ws.schedule_capacity >= worst_case and not torch.compiler.is_compiling()


def _all_gather(ws: MoKWorkspace, config: MoKConfig, routing: torch.Tensor) -> torch.Tensor:
    """Every rank's routing (int32 [EP, T, k]). One rank's (EP 1, reached here only while
    torch.compile traces) is its own, not copied into the workspace's all-gather buffer."""
    if ws.ep_size == 1:
        return routing.unsqueeze(0)
    chunk = config.all_gather_top_experts_chunk_bytes
    if not torch.compiler.is_compiling():
        return backends.for_device(ws.device).gather_routing(ws, routing, chunk)
    buffer = ws.all_gather_top_experts_buffer
    ops.all_gather_top_experts(routing, buffer, 0, ws.ep_rank, chunk, ws.group_name)
    return buffer


def _combine_status(ws: MoKWorkspace, num_local_experts: int) -> None:
    """Every rank gets every rank's schedule-time problems (invalid ids, capacity overflow,
    ranks that disagree on num_local_experts), so check_status gives all ranks one verdict.
    Eager only: under torch.compile each rank keeps its own (the flat ops have no status
    exchange)."""
    if ws.ep_size > 1 and not torch.compiler.is_compiling():
        backends.for_device(ws.device).combine_status(ws, num_local_experts)


def _eager_backend_or(op, name: str, device: torch.device):
    """The registry's backend function `name` for `device` in eager mode (its arguments are the
    workspace's own, already checked); the flat op `op` while torch.compile traces, which
    follows the op's fake implementation and cannot follow a raw kernel launch."""
    if torch.compiler.is_compiling():
        return op
    return getattr(backends.for_device(device), name)


def _routing(top_experts: torch.Tensor, num_experts: int, status: torch.Tensor) -> torch.Tensor:
    """int32 ids, -1 for the invalid ones, which `status` records (one kernel on CUDA)."""
    backend = backends.for_device(top_experts.device, traced=torch.compiler.is_compiling())
    return backend.routing(top_experts, num_experts, status)


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
    shared = _shared(shared_gate_weights, shared_up_weights, shared_down_weights)
    routed = (routed_gate_weights, routed_up_weights, routed_down_weights)
    weights = (shared_gate_weights, shared_up_weights, shared_down_weights, *routed)
    args = (config, workspace, schedule, x, router_weights, *weights, swiglu_limit)
    with _announcing(workspace):
        mxfp8 = validate_inputs(*args)
    ws = workspace
    made_schedule, schedule = schedule, _contained(schedule, ws)
    kept = {}
    if torch.compiler.is_compiling():
        saved, shared_out = fused_forward.run(
            config, ws, schedule, x, shared, routed, swiglu_limit, mxfp8
        )
    else:
        engine = backends.engine(ws, config)
        x_read = engine.use_sources({Buffer.X: x})[Buffer.X]
        saved, _, shared_out = passes.forward(
            engine, x_read, shared, routed, schedule, swiglu_limit, mxfp8, config.macrobatch_size
        )
        kept = engine.kept
    (x_routed, gate, up, hidden), (gate_s, up_s, hidden_s, y_shared) = saved, shared_out
    ctx = MoKForwardContext(x_routed, gate_s, gate, up_s, up, hidden_s, hidden, made_schedule,
                            ws)  # fmt: skip
    epilogue = _eager_backend_or(ops.fwd_epilogue, "fwd_epilogue", ws.device)
    routed_rows, in_place = _combined(ws, schedule, kept, Buffer.COMBINE)
    weights = schedule.valid_route_weights(router_weights)
    output = epilogue(y_shared, routed_rows, weights, *in_place)
    _debug_check(ws)
    return output, ctx


def _combined(ws: MoKWorkspace, schedule: MoKSchedule, kept: dict, name: str):
    """What an epilogue sums for buffer `name`, and its extra argument: the rows the pass kept,
    read in place through schedule.route_rows, or the workspace buffer the peers pushed into."""
    if name in kept:
        return kept[name], (schedule.route_rows,)
    return getattr(ws, name), ()


def _announcing(workspace):
    """An entry's argument checks: a rank that fails them tells its peers, which wait in their
    next exchange, where they do (EP > 1 on a torch.distributed group served by the reference
    backend: exchange.failures_announced); the CUDA kernels' waits end in TIMEOUT by
    themselves, and a one-device group releases its ranks."""
    ws = workspace if isinstance(workspace, MoKWorkspace) else None
    waits = ws is not None and ws.ep_size > 1 and ws.host_group is None
    group = ws.group_name if waits and not backends.uses_cuda(ws.device) else None
    return exchange.failures_announced(group)


def _contained(schedule: MoKSchedule, ws: MoKWorkspace) -> MoKSchedule:
    """A schedule made by build_schedule (it keeps its routes) as it is; any other checked on
    the device first (mok.schedule.contained: INVALID_SCHEDULE in the status word)."""
    if schedule.routes is not None:
        return schedule
    return contained(schedule, ws.ep_size, ws.num_local_tokens * ws.topk, ws.status)


def _shared(gate, up, down):
    """The shared expert's weights as one tuple, or None without a shared expert."""
    return None if gate is None else (gate, up, down)


def _debug_check(workspace: MoKWorkspace) -> None:
    if settings.debug():
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
    shared = _shared(shared_gate_weights, shared_up_weights, shared_down_weights)
    routed = (routed_gate_weights, routed_up_weights, routed_down_weights)
    weights = (shared_gate_weights, shared_up_weights, shared_down_weights, *routed)
    args = (config, workspace, schedule, x, router_weights, *weights, swiglu_limit)
    ws = workspace
    with _announcing(workspace):
        mxfp8 = validate_inputs(*args, backward=True)
        check_type("forward_context", forward_context, MoKForwardContext)
        _check_context(forward_context, schedule, ws, routed_gate_weights, shared_gate_weights,
                       mxfp8, config.macrobatch_size)  # fmt: skip
        check_tensor("grad_output", grad_output, dtype=torch.bfloat16,
                     shape=(ws.num_local_tokens, ws.hidden_size), dims=("T", "H"),
                     device=ws.device)  # fmt: skip
    schedule = _contained(schedule, ws)
    kept = {}
    if torch.compiler.is_compiling():
        out = fused_backward.run(config, ws, schedule, forward_context, grad_output, x,
                                 router_weights, shared, routed, swiglu_limit, mxfp8)  # fmt: skip
    else:
        engine = backends.engine(ws, config)
        out = _backward_pass(engine, schedule, forward_context, grad_output, x,
                             router_weights, shared, routed, swiglu_limit, mxfp8,
                             config.macrobatch_size)  # fmt: skip
        kept = engine.kept
    epilogue = _eager_backend_or(ops.bwd_epilogue, "bwd_epilogue", ws.device)
    routed_rows, in_place = _combined(ws, schedule, kept, Buffer.D_X_ROUTED)
    d_x = epilogue(out[0], routed_rows, ws.topk, *in_place)
    d_rw, in_place = _combined(ws, schedule, kept, Buffer.D_ROUTER_WEIGHT)
    d_router_weights = rows_of_routes(d_rw, *in_place) if in_place else d_rw.clone()
    d_router_weights = d_router_weights.view(ws.num_local_tokens, ws.topk)
    _debug_check(ws)
    return (d_x, d_router_weights, out[10], out[12], out[14], out[9], out[11], out[13])


def _backward_pass(engine, schedule, ctx, grad_output, x, router_weights, shared, routed,
                   limit, mxfp8, macrobatch_size):  # fmt: skip
    """mok.passes.backward on the workspace's `engine`; its inputs are copied into its buffers,
    or read in place at EP 1 (`use_sources`)."""
    inputs = {Buffer.D_Y: grad_output, Buffer.ROUTER_WEIGHT: router_weights, Buffer.X: x}
    read = engine.use_sources(inputs)
    saved = (ctx.x_routed, ctx.gate_routed, ctx.up_routed, ctx.hidden_routed)
    shared_saved = None if shared is None else (ctx.gate_shared, ctx.up_shared, ctx.hidden_shared)
    return passes.backward(engine, read[Buffer.D_Y], shared, routed, saved, shared_saved,
                           read[Buffer.X], schedule, limit, mxfp8, macrobatch_size,
                           op_outputs=False)  # fmt: skip


def check_status(workspace: MoKWorkspace) -> None:
    """Raise MoKDeviceError for anything the device recorded on this rank, then clear it.

    One host sync; call it where a sync is acceptable (e.g. once per step or in tests).
    """
    check_type("workspace", workspace, MoKWorkspace)
    device_status.check(workspace.status)
