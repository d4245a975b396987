"""The backward fused ops return what the original's return, in its order (API.md, issue 48
cause 9): 15 tensors in BF16, 18 in MXFP8 (the routed d_gate, d_up and d_y as (fp8, scale)
pairs), the weight gradients at the original's indices, and they declare the saved routed
activations they are given as mutated."""

from __future__ import annotations

import pytest
import torch
from step_setup import single_rank_step

from mok import functional as F
from mok import mxfp8, ops
from mok.ops import fused_backward

T, H, I, E, K = 16, 128, 128, 2, 2
BF16_WEIGHT_GRADS = range(9, 15)
MXFP8_WEIGHT_GRADS = range(12, 18)


def _bf16(*shape, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) / 8).bfloat16()


def _step(group, mode: str):
    """(config, ws, schedule, inputs, forward and backward weight forms, F.backward's result)."""
    config, ws, schedule = single_rank_step(group, tokens=T, hidden=H, topk=K, experts=E, seed=5)
    x, d_out = _bf16(T, H, seed=1), _bf16(T, H, seed=2)
    rw = torch.rand(T, K, generator=torch.Generator().manual_seed(3))
    shared = (_bf16(I, H, seed=4), _bf16(I, H, seed=5), _bf16(H, I, seed=6))
    routed = (_bf16(E, I, H, seed=7), _bf16(E, I, H, seed=8), _bf16(E, H, I, seed=9))
    fwd, bwd = routed, routed
    if mode == "mxfp8":
        pairs = [tuple(ops.mxfp8_quantize(w, True, True)) for w in routed]
        fwd, bwd = [p[:2] for p in pairs], (pairs[0], pairs[1], pairs[2][2:])
    _, ctx = F.forward(config, ws, schedule, x, rw, *shared, *fwd, swiglu_limit=6.0)
    want = F.backward(config, ws, schedule, ctx, d_out, x, rw, *shared, *bwd, swiglu_limit=6.0)
    return config, ws, schedule, ctx, (x, d_out, rw), shared, bwd, want


def _fill_buffers(ws, inputs) -> None:
    """What a caller of the flat ops does: the step's x, d_y and router weights into the
    workspace buffers (mok's functional API at EP 1 reads its inputs in place instead)."""
    x, d_out, rw = inputs
    ws.d_y_buffer.copy_(d_out)
    ws.router_weight_buffer.copy_(rw)
    ws.x_buffer.copy_(x)


def _call_op(config, ws, schedule, ctx, inputs, shared, routed, mode):
    _fill_buffers(ws, inputs)
    args = fused_backward.original_arguments(config, ws, schedule, ctx, shared, routed, 6.0,
                                             mode == "mxfp8")  # fmt: skip
    op = getattr(ops, f"dispatch_mlp_swiglu_combine_bwd_{mode}")
    return op(*args)


def _d_y_rows(schedule, d_out):
    """d_out's row of each schedule row's token; zero on padding rows."""
    valid = schedule.peer_rank >= 0
    tokens = torch.where(valid, schedule.peer_token_idx // K, 0).long()
    return torch.where(valid[:, None], d_out[tokens], 0).bfloat16()


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_outputs_sit_where_the_original_puts_them(single_rank_group, mode):
    config, ws, schedule, ctx, inputs, shared, routed, want = _step(single_rank_group, mode)
    got = _call_op(config, ws, schedule, ctx, inputs, shared, routed, mode)
    count, grads = (15, BF16_WEIGHT_GRADS) if mode == "bf16" else (18, MXFP8_WEIGHT_GRADS)
    assert len(got) == count
    # shared gate, routed gate, shared up, routed up, shared down, routed down
    functional_order = (want[5], want[2], want[6], want[3], want[7], want[4])
    for index, expected in zip(grads, functional_order, strict=True):
        assert torch.equal(got[index], expected), f"output {index}"
    rows = _d_y_rows(schedule, inputs[1])
    if mode == "bf16":
        assert torch.equal(got[8], rows), "d_y_routed: the d_out rows the d_h GEMM read"
        return
    for data, scales in (got[3:5], got[6:8], got[10:12]):
        assert data.dtype == torch.float8_e4m3fn and scales.dtype == torch.uint8
        assert data.shape[0] == schedule.peer_rank.shape[0]
    assert torch.equal(mxfp8.dequantize(*got[10:12]), mxfp8.dequantize(*mxfp8.quantize(rows)[:2]))
    d_gate_values = mxfp8.dequantize(*got[3:5])
    assert d_gate_values.shape == (schedule.peer_rank.shape[0], I)
    assert d_gate_values[schedule.peer_rank >= 0].abs().sum() > 0


def test_pairs_can_be_left_out(single_rank_group):
    """mok's `routed_gradient_pairs=False`: the same weight gradients, the pairs 0-size."""
    config, ws, schedule, ctx, inputs, shared, routed, want = _step(single_rank_group, "mxfp8")
    _fill_buffers(ws, inputs)
    args = fused_backward.original_arguments(config, ws, schedule, ctx, shared, routed, 6.0, True)
    got = ops.dispatch_mlp_swiglu_combine_bwd_mxfp8(*args, routed_gradient_pairs=False)
    assert len(got) == 18 and all(got[i].numel() == 0 for i in (3, 4, 6, 7, 10, 11))
    assert torch.equal(got[13], want[2])


@pytest.mark.parametrize(
    ("mode", "saved"),
    [
        ("bf16", ["x_routed", "gate_routed", "up_routed", "hidden_routed"]),
        ("mxfp8", ["x_fp8_t_routed", "x_sc_t_routed", "gate_fp8_routed", "gate_sc_routed",
                   "up_fp8_routed", "up_sc_routed", "hidden_fp8_t_routed", "hidden_sc_t_routed"]),
    ],
)  # fmt: skip
def test_saved_routed_activations_are_declared_mutated(mode, saved):
    schema = getattr(torch.ops.mok, f"dispatch_mlp_swiglu_combine_bwd_{mode}").default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write}
    assert mutated == {"d_x_routed_buffer", "d_router_weight_buffer", *saved}
    assert len(schema.returns) == (15 if mode == "bf16" else 18)
