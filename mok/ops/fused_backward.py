"""The backward fused passes as custom ops (re-exported by `mok.ops`), returning what the
original's return, in its order (API.md):

- BF16, 15: d_x_shared, d_x_routed [C, H], d_gate_shared, d_gate_routed, d_up_shared,
  d_up_routed, d_hidden_shared, d_hidden_routed (bf16 [C, I]), d_y_routed [C, H] (the d_out
  rows the d_h GEMM read), then the six weight gradients: shared gate, routed gate, shared up,
  routed up, shared down, routed down (bf16).
- MXFP8, 18: as BF16, with d_gate_routed, d_up_routed and d_y_routed as MXFP8 (fp8, scale)
  pairs in the normal layout (blocks along I, I and H: the d_x and d_h GEMMs' reduction dims)
  of the values those GEMMs read. mok's `routed_gradient_pairs=False` leaves the three pairs
  0-size (mok.functional needs none of them, so under torch.compile it skips quantizing them).

`d_x_routed_buffer` and `d_router_weight_buffer` of the source ranks receive the pushed
per-route d_x rows and router-weight gradients; the shared outputs are 0-size tensors without a
shared expert. The saved routed activations are declared mutated, as the original's are (it
reuses their memory); mok only reads them.
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from mok import _moe_arguments, backends, macrobatch, passes
from mok.ops.fused_forward import (
    OptTensor,
    Tensor,
    _shared,
    check_launch,
    check_pass,
    edge_config,
    interleave,
    op_schedule,
    present,
    trailing_arguments,
)
from mok.ops.mxfp8 import mxfp8_quantize
from mok.workspace import Buffer

_MUTATED = ("d_x_routed_buffer", "d_router_weight_buffer")
_MUTATED_BF16 = (*_MUTATED, "x_routed", "gate_routed", "up_routed", "hidden_routed")
_MUTATED_MXFP8 = (*_MUTATED, "x_fp8_t_routed", "x_sc_t_routed", "gate_fp8_routed",
                  "gate_sc_routed", "up_fp8_routed", "up_sc_routed", "hidden_fp8_t_routed",
                  "hidden_sc_t_routed")  # fmt: skip
_OUT_BF16 = tuple[(Tensor,) * 15]
_OUT_MXFP8 = tuple[(Tensor,) * 18]
# Where the pairs of the MXFP8 op's outputs come from among mok.passes.backward's 15.
_PAIRED = (3, 5, 8)


@custom_op("mok::dispatch_mlp_swiglu_combine_bwd_bf16", mutates_args=_MUTATED_BF16)
def dispatch_mlp_swiglu_combine_bwd_bf16(
    d_y_buffer: Tensor,
    d_y_buffer_ptrs: list[int],
    d_x_routed_buffer: Tensor,
    d_x_routed_buffer_ptrs: list[int],
    router_weight_buffer: Tensor,
    router_weight_buffer_ptrs: list[int],
    d_router_weight_buffer: Tensor,
    d_router_weight_buffer_ptrs: list[int],
    w_shared_gate: OptTensor,
    w_routed_gate: Tensor,
    w_shared_up: OptTensor,
    w_routed_up: Tensor,
    w_shared_down: OptTensor,
    w_routed_down: Tensor,
    x_routed: Tensor,
    gate_shared: OptTensor,
    gate_routed: Tensor,
    up_shared: OptTensor,
    up_routed: Tensor,
    hidden_shared: OptTensor,
    hidden_routed: Tensor,
    x: Tensor,
    x_ptrs: list[int],
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
) -> _OUT_BF16:
    """BF16 backward (see the module docstring for the outputs)."""
    schedule = (schedule_peer_rank, schedule_peer_token_idx, num_tokens, tokens_per_expert)
    routed = (w_routed_gate, w_routed_up, w_routed_down)
    shared_weights = (w_shared_gate, w_shared_up, w_shared_down)
    buffer = ("d_x_routed_buffer", d_x_routed_buffer)
    check_pass(x, schedule, topk, swiglu_limit, routed, shared_weights, buffer, mxfp8=False,
               backward=True)  # fmt: skip
    check_launch(num_comm_sms, macrobatch_size, minibatch_size, group_name, x_ptrs=x_ptrs,
                 d_y_buffer_ptrs=d_y_buffer_ptrs,
                 d_x_routed_buffer_ptrs=d_x_routed_buffer_ptrs)  # fmt: skip
    saved = (x_routed, gate_shared, gate_routed, up_shared, up_routed, hidden_shared,
             hidden_routed)  # fmt: skip
    _check_saved(saved, x, schedule, w_routed_gate, w_shared_gate, macrobatch_size, mxfp8=False)
    return _backward(
        (d_y_buffer, router_weight_buffer),
        (d_x_routed_buffer, d_router_weight_buffer),
        _shared(w_shared_gate, w_shared_up, w_shared_down),
        routed,
        (x_routed, gate_routed, up_routed, hidden_routed),
        (gate_shared, up_shared, hidden_shared),
        (x, x_ptrs),
        schedule,
        topk,
        swiglu_limit,
        (
            group_name,
            edge_config(
                mok_config, ("bwd_num_comm_sms", num_comm_sms, minibatch_size, macrobatch_size)
            ),
        ),  # fmt: skip
        False,
    )


@custom_op("mok::dispatch_mlp_swiglu_combine_bwd_mxfp8", mutates_args=_MUTATED_MXFP8)
def dispatch_mlp_swiglu_combine_bwd_mxfp8(
    d_y_buffer: Tensor,
    d_y_buffer_ptrs: list[int],
    d_x_routed_buffer: Tensor,
    d_x_routed_buffer_ptrs: list[int],
    router_weight_buffer: Tensor,
    router_weight_buffer_ptrs: list[int],
    d_router_weight_buffer: Tensor,
    d_router_weight_buffer_ptrs: list[int],
    w_shared_gate: OptTensor,
    w_routed_gate_T: Tensor,
    w_routed_gate_T_sc: Tensor,
    w_shared_up: OptTensor,
    w_routed_up_T: Tensor,
    w_routed_up_T_sc: Tensor,
    w_shared_down: OptTensor,
    w_routed_down_T: Tensor,
    w_routed_down_T_sc: Tensor,
    x_fp8_t_routed: Tensor,
    x_sc_t_routed: Tensor,
    gate_shared: OptTensor,
    gate_fp8_routed: Tensor,
    gate_sc_routed: Tensor,
    up_shared: OptTensor,
    up_fp8_routed: Tensor,
    up_sc_routed: Tensor,
    hidden_shared: OptTensor,
    hidden_fp8_t_routed: Tensor,
    hidden_sc_t_routed: Tensor,
    x: Tensor,
    x_ptrs: list[int],
    w_routed_gate: Tensor,
    w_routed_gate_sc: Tensor,
    w_routed_up: Tensor,
    w_routed_up_sc: Tensor,
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
    routed_gradient_pairs: bool = True,
    mok_config: str = "",
) -> _OUT_MXFP8:
    """MXFP8 backward (see the module docstring for the outputs)."""
    schedule = (schedule_peer_rank, schedule_peer_token_idx, num_tokens, tokens_per_expert)
    routed = (
        (w_routed_gate, w_routed_gate_sc, w_routed_gate_T, w_routed_gate_T_sc),
        (w_routed_up, w_routed_up_sc, w_routed_up_T, w_routed_up_T_sc),
        (w_routed_down_T, w_routed_down_T_sc),
    )
    shared_weights = (w_shared_gate, w_shared_up, w_shared_down)
    buffer = ("d_x_routed_buffer", d_x_routed_buffer)
    check_pass(x, schedule, topk, swiglu_limit, routed, shared_weights, buffer, mxfp8=True,
               backward=True)  # fmt: skip
    check_launch(num_comm_sms, macrobatch_size, minibatch_size, group_name, x_ptrs=x_ptrs,
                 d_y_buffer_ptrs=d_y_buffer_ptrs,
                 d_x_routed_buffer_ptrs=d_x_routed_buffer_ptrs)  # fmt: skip
    saved = (
        (x_fp8_t_routed, x_sc_t_routed),
        (gate_fp8_routed, gate_sc_routed),
        (up_fp8_routed, up_sc_routed),
        (hidden_fp8_t_routed, hidden_sc_t_routed),
    )
    in_context_order = (saved[0], gate_shared, saved[1], up_shared, saved[2], hidden_shared,
                        saved[3])  # fmt: skip
    _check_saved(
        in_context_order, x, schedule, w_routed_gate, w_shared_gate, macrobatch_size, mxfp8=True
    )
    outputs = _backward(
        (d_y_buffer, router_weight_buffer),
        (d_x_routed_buffer, d_router_weight_buffer),
        _shared(w_shared_gate, w_shared_up, w_shared_down),
        routed,
        saved,
        (gate_shared, up_shared, hidden_shared),
        (x, x_ptrs),
        schedule,
        topk,
        swiglu_limit,
        (
            group_name,
            edge_config(
                mok_config, ("bwd_num_comm_sms", num_comm_sms, minibatch_size, macrobatch_size)
            ),
        ),  # fmt: skip
        True,
    )
    return _with_pairs(outputs, routed_gradient_pairs)


def _with_pairs(outputs, quantize: bool) -> tuple[Tensor, ...]:
    """The MXFP8 op's 18 outputs from mok.passes.backward's 15: the routed d_gate, d_up and d_y
    as (fp8, scale) pairs of their normal layout (0-size without `quantize`)."""
    pairs = {}
    for i in _PAIRED:
        values = outputs[i]
        empty = values.new_empty((0,))
        pair = mxfp8_quantize(values.bfloat16(), True, False)[:2] if quantize else None
        pairs[i] = pair or (empty, empty.to(torch.uint8))
    return tuple(t for i, v in enumerate(outputs) for t in pairs.get(i, (v,)))


def _check_saved(saved, x, schedule, w_routed_gate, w_shared_gate, macrobatch_size, *,
                 mxfp8: bool) -> None:  # fmt: skip
    """The forward's saved tensors (MoKForwardContext's order) against this pass: routed rows
    as the forward kept them (mok.macrobatch's ring)."""
    rows = macrobatch.kept_rows(schedule[0].shape[0], macrobatch_size, schedule[3].shape[0])
    sizes = (rows, x.shape[0], x.shape[1], w_routed_gate.shape[1])
    _moe_arguments.check_saved(saved, prefix="", mxfp8=mxfp8, shared=w_shared_gate is not None,
                          sizes=sizes, device=x.device)  # fmt: skip


def _backward(
    grads, buffers, shared, routed, saved, shared_saved, x_and_ptrs, schedule, topk, limit,
    edge, mxfp8,
):  # fmt: skip
    """`edge`: (group name, the config of mok_config)."""
    names = (Buffer.D_Y, Buffer.ROUTER_WEIGHT, Buffer.D_X_ROUTED, Buffer.D_ROUTER_WEIGHT)
    x, x_ptrs = x_and_ptrs
    buffers = dict(zip(names, (*grads, *buffers), strict=True)) | {Buffer.X: x}
    engine = backends.for_device(x.device).op_engine(buffers, x_ptrs, topk, *edge)
    if shared is None:
        shared_saved = None
    schedule = op_schedule(schedule, x, x_ptrs, topk)
    outputs = passes.backward(engine, grads[0], shared, routed, saved, shared_saved, x,
                              schedule, limit, mxfp8, edge[1].macrobatch_size)  # fmt: skip
    return present(outputs, x)


def run(config, workspace, schedule, ctx, grad_output, x, router_weights, shared, routed,
        swiglu_limit, mxfp8: bool):  # fmt: skip
    """mok.passes.backward's 15 outputs (None for an absent shared expert's and, in MXFP8, for
    the routed d_gate, d_up and d_y, which mok.functional does not read) for `workspace`'s
    step, through the fused op (what torch.compile traces); the inputs are copied into the
    workspace's buffers first."""
    ws = workspace
    ws.d_y_buffer.copy_(grad_output)
    ws.router_weight_buffer.copy_(router_weights)
    ws.x_buffer.copy_(x)
    args = original_arguments(config, ws, schedule, ctx, shared, routed, swiglu_limit, mxfp8)
    if mxfp8:
        options = {"mok_config": config.speed_json()}
        out = dispatch_mlp_swiglu_combine_bwd_mxfp8(*args, routed_gradient_pairs=False, **options)
        out = (*out[:3], None, out[5], None, out[8], out[9], None, *out[12:])
    else:
        out = dispatch_mlp_swiglu_combine_bwd_bf16(*args, mok_config=config.speed_json())
    if shared is not None:
        return tuple(out)
    return tuple(None if i in _SHARED_OUTPUTS else t for i, t in enumerate(out))


def original_arguments(config, ws, schedule, ctx, shared, routed, swiglu_limit, mxfp8: bool):
    """The backward fused op's arguments, in the original's order, for `ws`'s step (its
    buffers hold the step's d_y, router weights and x); `ctx` is the forward's context."""
    head = (ws.d_y_buffer, ws.d_y_buffer_ptrs, ws.d_x_routed_buffer, ws.d_x_routed_buffer_ptrs,
            ws.router_weight_buffer, ws.router_weight_buffer_ptrs, ws.d_router_weight_buffer,
            ws.d_router_weight_buffer_ptrs)  # fmt: skip
    tail = trailing_arguments(config, ws, schedule, swiglu_limit, config.bwd_num_comm_sms)
    c, x_and_ptrs = ctx, (ws.x_buffer, ws.x_buffer_ptrs)
    if mxfp8:
        gate, up, down = routed
        saved = (*c.x_routed, c.gate_shared, *c.gate_routed, c.up_shared, *c.up_routed,
                 c.hidden_shared, *c.hidden_routed)  # fmt: skip
        weights = interleave(shared, gate[2:], up[2:], down)
        return (*head, *weights, *saved, *x_and_ptrs, *gate[:2], *up[:2], *tail)
    saved = (c.x_routed, c.gate_shared, c.gate_routed, c.up_shared, c.up_routed, c.hidden_shared,
             c.hidden_routed)  # fmt: skip
    weights = interleave(shared, (routed[0],), (routed[1],), (routed[2],))
    return (*head, *weights, *saved, *x_and_ptrs, *tail)


# Positions of the shared expert's outputs among mok.passes.backward's.
_SHARED_OUTPUTS = (0, 2, 4, 6, 9, 11, 13)


def _fake_outputs(x, w_shared_gate, capacity, num_experts, inter, pairs=None):
    """The outputs' shapes; `pairs`: the MXFP8 op's (True: quantized, False: 0-size)."""
    hidden = x.shape[1]

    def shared_w(*shape):
        return x.new_empty((0,) if w_shared_gate is None else shape)

    shared_i = shared_w(x.shape[0], inter)
    outputs = (
        shared_w(*x.shape),
        x.new_empty((capacity, hidden)),
        shared_i,
        x.new_empty((capacity, inter)),
        torch.empty_like(shared_i),
        x.new_empty((capacity, inter)),
        torch.empty_like(shared_i),
        x.new_empty((capacity, inter)),
        x.new_empty((capacity, hidden)),
        shared_w(inter, hidden),
        x.new_empty((num_experts, inter, hidden)),
        shared_w(inter, hidden),
        x.new_empty((num_experts, inter, hidden)),
        shared_w(hidden, inter),
        x.new_empty((num_experts, hidden, inter)),
    )
    if pairs is None:
        return outputs
    return _with_pairs(outputs, pairs)


@dispatch_mlp_swiglu_combine_bwd_bf16.register_fake
def _(*args, group_name="", mok_config=""):
    w_shared_gate, w_routed_gate, x, peer_rank = args[8], args[9], args[21], args[23]
    return _fake_outputs(
        x, w_shared_gate, peer_rank.shape[0], w_routed_gate.shape[0], w_routed_gate.shape[1]
    )


@dispatch_mlp_swiglu_combine_bwd_mxfp8.register_fake
def _(*args, group_name="", routed_gradient_pairs=True, mok_config=""):
    w_shared_gate, w_routed_gate, x, peer_rank = args[8], args[30], args[28], args[34]
    sizes = (peer_rank.shape[0], w_routed_gate.shape[0], w_routed_gate.shape[1])
    return _fake_outputs(x, w_shared_gate, *sizes, pairs=routed_gradient_pairs)
