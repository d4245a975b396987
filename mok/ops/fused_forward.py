"""The four fused passes as custom ops: dispatch -> SwiGLU experts -> combine, fwd and bwd.

Argument lists are the original's (plus mok's trailing `group_name` and `mok_config`, the
None (no shared expert): the matching shared outputs are then 0-size tensors, since a custom op
that mutates an input may not return None. Routed outputs have one row per schedule row (C).
Each op checks its arguments, packs them (a MoKSchedule, the weight tuples, the engine of the
workspace whose buffers it was given) and runs mok.passes.forward. `run` is the other direction,
for mok.functional under torch.compile: a workspace's step flattened into the op's arguments.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.library import custom_op

from mok import _moe_arguments, backends, macrobatch, passes
from mok._arguments import check_multiple, check_range, check_tensor
from mok.backends.reference.exchange import resolve_group
from mok.config import MoKConfig
from mok.ops.schedule import schedule_status
from mok.schedule import MoKSchedule, contained
from mok.workspace import MAX_TOPK, Buffer

Tensor = torch.Tensor
OptTensor = torch.Tensor | None


def _common(x, schedule, topk, swiglu_limit, routed_buffer) -> int:
    """The checks every pass shares; returns the schedule's local expert count."""
    check_tensor("x", x, dtype=torch.bfloat16, shape=(None, None), dims=("T", "H"))
    _moe_arguments.check_limit(swiglu_limit)
    _, num_experts = _moe_arguments.check_schedule(*schedule, x.device)
    check_range("topk", topk, 1, MAX_TOPK)
    # The buffer of the pass's per-route rows (one per token and slot) ties k to T.
    name, buffer = routed_buffer
    tokens, hidden = x.shape
    check_tensor(name, buffer, dtype=torch.bfloat16, shape=(tokens * topk, hidden),
                 dims=("T * k", "H"), device=x.device)  # fmt: skip
    return num_experts


def check_launch(num_comm_sms, macrobatch_size, minibatch_size, group_name, **pointer_lists):
    """The launch parameters as the original checks them (MoKConfig's rules: comm SMs even and
    at least 2, the batch sizes multiples of 256 and of the minibatch), and each pointer list
    one address per rank of the group."""
    check_multiple("num_comm_sms", num_comm_sms, 2)
    check_multiple("minibatch_size", minibatch_size, 256)
    check_multiple("macrobatch_size", macrobatch_size, minibatch_size)
    ep_size = dist.get_world_size(resolve_group(group_name)) if dist.is_initialized() else 1
    for name, ptrs in pointer_lists.items():
        if len(ptrs) != ep_size:
            raise ValueError(
                f"`{name}` must hold one address per rank of the group ({ep_size}), got {len(ptrs)}"
            )


def edge_config(mok_config: str, launch: tuple[str, int, int, int]) -> MoKConfig:
    """The config a fused op's pass uses: mok's optional `mok_config` argument, a JSON object of
    MoKConfig fields (mok.functional passes MoKConfig.speed_json() under torch.compile); fields
    it leaves out, and all of them when it is empty, keep their defaults (the speed knobs'
    environment variables). `launch` = (the pass's comm-SM field, num_comm_sms, minibatch_size,
    macrobatch_size): the original's launch arguments (checked by check_launch), which set
    those fields."""
    comm_field, num_comm_sms, minibatch_size, macrobatch_size = launch
    if not mok_config:
        config = MoKConfig()
    elif not mok_config.lstrip().startswith("{"):
        raise ValueError(
            f"`mok_config` must be a JSON object of MoKConfig fields, got {mok_config!r:.60}"
        )
    else:
        try:
            config = MoKConfig.from_json(mok_config)
        except (TypeError, ValueError) as error:
            raise ValueError(f"`mok_config`: {error}") from error
    launch_fields = {comm_field: num_comm_sms, "minibatch_size": minibatch_size,
                     "macrobatch_size": macrobatch_size}  # fmt: skip
    return dataclasses.replace(config, **launch_fields)


def check_weights(x, routed, shared, *, mxfp8: bool, backward: bool, num_experts=None) -> None:
    """Routed weights in their mode's form with `num_experts` (None: any) local experts, and
    the shared expert's (all None, or bf16 with the routed I)."""
    hidden, device = x.shape[1], x.device
    if mxfp8:
        _, inter = _moe_arguments.check_routed_mxfp8(
            routed, hidden, device, backward=backward, num_experts=num_experts
        )
    else:
        _, inter = _moe_arguments.check_routed_bf16(routed, hidden, device, num_experts)
    _moe_arguments.check_shared(shared, hidden, inter, device)


def check_pass(x, schedule, topk, swiglu_limit, routed, shared, routed_buffer, *, mxfp8: bool,
               backward: bool):  # fmt: skip
    """A fused op's argument checks. `routed_buffer` is (name, tensor) of the pass's per-route
    rows buffer."""
    num_experts = _common(x, schedule, topk, swiglu_limit, routed_buffer)
    check_weights(x, routed, shared, mxfp8=mxfp8, backward=backward, num_experts=num_experts)


@custom_op("mok::dispatch_mlp_swiglu_combine_fwd_bf16", mutates_args=("combine_buffer",))
def dispatch_mlp_swiglu_combine_fwd_bf16(
    x: Tensor,
    x_ptrs: list[int],
    combine_buffer: Tensor,
    combine_buffer_ptrs: list[int],
    w_shared_gate: OptTensor,
    w_routed_gate: Tensor,
    w_shared_up: OptTensor,
    w_routed_up: Tensor,
    w_shared_down: OptTensor,
    w_routed_down: Tensor,
    schedule_peer_rank: Tensor,
    schedule_peer_token_idx: Tensor,
    num_tokens: Tensor,
    tokens_per_expert: Tensor,
    topk: int,
    swiglu_limit: float | None,
    num_comm_sms: int,
    macrobatch_size: int,
    minibatch_size: int,
    group_name: str = "",
    mok_config: str = "",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """BF16 forward. Outputs: x_routed, gate_shared, gate_routed, up_shared, up_routed,
    hidden_shared, hidden_routed, y_shared, y_routed (routed: bf16 [R, H] / [R, I], R =
    min(C, macrobatch_size + 256 * E): the ring of mok.macrobatch)."""
    schedule = (schedule_peer_rank, schedule_peer_token_idx, num_tokens, tokens_per_expert)
    routed = (w_routed_gate, w_routed_up, w_routed_down)
    shared_weights = (w_shared_gate, w_shared_up, w_shared_down)
    launch = (num_comm_sms, macrobatch_size, minibatch_size, group_name, mok_config)
    saved, y, shared_out = _forward((x, x_ptrs), (combine_buffer, combine_buffer_ptrs),
                                    shared_weights, routed, schedule, topk, swiglu_limit, launch,
                                    mxfp8=False)  # fmt: skip
    x_rows, gate, up, hidden = saved
    g_s, u_s, h_s, y_s = present(shared_out, x)
    return x_rows, g_s, gate, u_s, up, h_s, hidden, y_s, y


def _forward(x_and_ptrs, combine_and_ptrs, shared_weights, routed, schedule, topk, swiglu_limit,
             launch, *, mxfp8: bool):  # fmt: skip
    """A forward op's body once its arguments are grouped: check them, pack them, run
    mok.passes.forward on the engine of the workspace whose buffers they are."""
    (x, x_ptrs), (combine_buffer, combine_buffer_ptrs) = x_and_ptrs, combine_and_ptrs
    num_comm_sms, macrobatch_size, minibatch_size, group_name, mok_config = launch
    buffer = ("combine_buffer", combine_buffer)
    check_pass(x, schedule, topk, swiglu_limit, routed, shared_weights, buffer, mxfp8=mxfp8,
               backward=False)  # fmt: skip
    check_launch(num_comm_sms, macrobatch_size, minibatch_size, group_name, x_ptrs=x_ptrs,
                 combine_buffer_ptrs=combine_buffer_ptrs)  # fmt: skip
    config = edge_config(
        mok_config, ("fwd_num_comm_sms", num_comm_sms, minibatch_size, macrobatch_size)
    )
    buffers = {Buffer.X: x, Buffer.COMBINE: combine_buffer}
    engine = backends.for_device(x.device).op_engine(buffers, x_ptrs, topk, group_name, config)
    shared = _shared(*shared_weights)
    schedule = op_schedule(schedule, x, x_ptrs, topk)
    saved, y, shared_out = passes.forward(engine, x, shared, routed, schedule, swiglu_limit,
                                          mxfp8, macrobatch_size)  # fmt: skip
    ring = macrobatch.ring_rows(macrobatch_size, schedule.tokens_per_expert.shape[0])
    return saved, macrobatch.keep_rows(y, schedule.num_tokens, ring), shared_out


def op_schedule(schedule, x, x_ptrs, topk) -> MoKSchedule:
    """A fused op's schedule tensors as a MoKSchedule, contained on the device
    (mok.schedule.contained; what it finds is recorded in the device's word for calls in the
    original's form, ops.schedule_status)."""
    routes_per_rank = x.shape[0] * topk
    word = schedule_status(x.device)
    return contained(MoKSchedule(*schedule), len(x_ptrs), routes_per_rank, word)


def _shared(gate, up, down):
    return None if gate is None else (gate, up, down)


@dispatch_mlp_swiglu_combine_fwd_bf16.register_fake
def _(x, x_ptrs, combine_buffer, combine_buffer_ptrs, w_shared_gate, w_routed_gate, *rest,
      **options):  # fmt: skip
    capacity, inter = _ring_rows(rest, 4, options), w_routed_gate.shape[1]
    shared = w_shared_gate is not None
    routed_i = x.new_empty((capacity, inter))
    shared_i = x.new_empty((x.shape[0], inter) if shared else (0,))
    y_s = x.new_empty(x.shape if shared else (0,))
    return (
        x.new_empty((capacity, x.shape[1])),
        shared_i,
        routed_i,
        _like(shared_i),
        torch.empty_like(routed_i),
        _like(shared_i),
        torch.empty_like(routed_i),
        y_s,
        x.new_empty((capacity, x.shape[1])),
    )


def _ring_rows(rest, peer_rank_at: int, options) -> int:
    """Rows of a fake forward's routed outputs: the schedule's, at most the macrobatch ring's
    (mok.macrobatch; macrobatch_size is the argument 7 places after peer_rank in `rest`,
    tokens_per_expert 3 places, unless given by keyword)."""
    macrobatch_size = options.get("macrobatch_size", None)
    if macrobatch_size is None:
        macrobatch_size = rest[peer_rank_at + 7]
    experts = rest[peer_rank_at + 3].shape[0]
    return macrobatch.kept_rows(rest[peer_rank_at].shape[0], macrobatch_size, experts)


def _like(t):
    return torch.empty_like(t)


def present(outputs, like: Tensor) -> tuple[Tensor, ...]:
    """Custom ops that mutate inputs cannot return None: an absent output is a 0-size tensor."""
    return tuple(like.new_empty((0,)) if t is None else t for t in outputs)


@custom_op("mok::dispatch_mlp_swiglu_combine_fwd_mxfp8", mutates_args=("combine_buffer",))
def dispatch_mlp_swiglu_combine_fwd_mxfp8(
    x: Tensor,
    x_ptrs: list[int],
    combine_buffer: Tensor,
    combine_buffer_ptrs: list[int],
    w_shared_gate: OptTensor,
    w_routed_gate: Tensor,
    w_routed_gate_sc: Tensor,
    w_shared_up: OptTensor,
    w_routed_up: Tensor,
    w_routed_up_sc: Tensor,
    w_shared_down: OptTensor,
    w_routed_down: Tensor,
    w_routed_down_sc: Tensor,
    schedule_peer_rank: Tensor,
    schedule_peer_token_idx: Tensor,
    num_tokens: Tensor,
    tokens_per_expert: Tensor,
    topk: int,
    swiglu_limit: float | None,
    num_comm_sms: int,
    macrobatch_size: int,
    minibatch_size: int,
    group_name: str = "",
    mok_config: str = "",
) -> tuple[
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
    Tensor,
]:
    """MXFP8 forward. Outputs: x_fp8_t_routed [H, R], x_sc_t_routed, gate_shared,
    gate_fp8_routed [R, I], gate_sc_routed, up_shared, up_fp8_routed, up_sc_routed,
    hidden_shared, hidden_fp8_t_routed [I, R], hidden_sc_t_routed, y_shared, y_routed [R, H]
    (R = min(C, macrobatch_size + 256 * E): the ring of mok.macrobatch)."""
    schedule = (schedule_peer_rank, schedule_peer_token_idx, num_tokens, tokens_per_expert)
    routed = (
        (w_routed_gate, w_routed_gate_sc),
        (w_routed_up, w_routed_up_sc),
        (w_routed_down, w_routed_down_sc),
    )
    shared_weights = (w_shared_gate, w_shared_up, w_shared_down)
    launch = (num_comm_sms, macrobatch_size, minibatch_size, group_name, mok_config)
    saved, y, shared_out = _forward((x, x_ptrs), (combine_buffer, combine_buffer_ptrs),
                                    shared_weights, routed, schedule, topk, swiglu_limit, launch,
                                    mxfp8=True)  # fmt: skip
    (x_t, x_t_sc), (gate, gate_sc), (up, up_sc), (hidden_t, hidden_t_sc) = saved
    g_s, u_s, h_s, y_s = present(shared_out, x)
    return (x_t, x_t_sc, g_s, gate, gate_sc, u_s, up, up_sc, h_s, hidden_t, hidden_t_sc, y_s, y)


@dispatch_mlp_swiglu_combine_fwd_mxfp8.register_fake
def _(x, x_ptrs, combine_buffer, combine_buffer_ptrs, w_shared_gate, w_routed_gate, *rest,
      **options):  # fmt: skip
    capacity, inter, hidden = _ring_rows(rest, 7, options), w_routed_gate.shape[1], x.shape[1]
    shared = x.new_empty((x.shape[0], inter) if w_shared_gate is not None else (0,))

    def pair(rows, cols):
        data = x.new_empty((rows, cols), dtype=torch.float8_e4m3fn)
        return data, x.new_empty((rows // 128, cols // 128, 32, 16), dtype=torch.uint8)

    y_s = x.new_empty(x.shape if w_shared_gate is not None else (0,))
    return (
        *pair(hidden, capacity),
        shared,
        *pair(capacity, inter),
        _like(shared),
        *pair(capacity, inter),
        _like(shared),
        *pair(inter, capacity),
        y_s,
        x.new_empty((capacity, hidden)),
    )


def run(config, workspace, schedule, x, shared, routed, swiglu_limit, mxfp8: bool):
    """mok.passes.forward's (saved, shared outputs) for `workspace`'s step, through the fused
    op (what torch.compile traces): `x` is copied into the workspace's x_buffer first."""
    ws = workspace
    ws.x_buffer.copy_(x)
    head = (ws.x_buffer, ws.x_buffer_ptrs, ws.combine_buffer, ws.combine_buffer_ptrs)
    tail = trailing_arguments(config, ws, schedule, swiglu_limit, config.fwd_num_comm_sms)
    gate, up, down = routed if mxfp8 else ((routed[0],), (routed[1],), (routed[2],))
    op = dispatch_mlp_swiglu_combine_fwd_mxfp8 if mxfp8 else dispatch_mlp_swiglu_combine_fwd_bf16
    out = op(*head, *interleave(shared, gate, up, down), *tail, mok_config=config.speed_json())
    if mxfp8:
        saved = (out[0:2], out[3:5], out[6:8], out[9:11])
        shared_out = (out[2], out[5], out[8], out[11])
    else:
        saved = (out[0], out[2], out[4], out[6])
        shared_out = (out[1], out[3], out[5], out[7])
    return saved, shared_out if shared is not None else (None,) * 4


def trailing_arguments(config, ws, schedule, swiglu_limit, num_comm_sms) -> tuple:
    """The trailing arguments every fused op takes, in the original's order."""
    return (
        *schedule.as_tuple(),
        ws.topk,
        swiglu_limit,
        num_comm_sms,
        config.macrobatch_size,
        config.minibatch_size,
        ws.group_name,
    )


def interleave(shared, gate, up, down) -> tuple:
    """(shared gate, *routed gate, shared up, *routed up, shared down, *routed down); `shared`
    is (gate, up, down) or None."""
    shared = (None, None, None) if shared is None else shared
    return (shared[0], *gate, shared[1], *up, shared[2], *down)
