"""MoELayer / MoEFunction: autograd gives exactly what mok.functional.backward returns."""

from __future__ import annotations

import pytest
import torch

import mok
from mok import functional as F
from mok import ops

T, H, I, E, K = 24, 128, 128, 3, 2


def _inputs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    top = torch.randint(0, E, (T, K), generator=generator)
    x = torch.randn(T, H, generator=generator).bfloat16()
    rw = torch.randn(T, K, generator=generator)
    grad = torch.randn(T, H, generator=generator).bfloat16()
    return top, x, rw, grad


def _functional(layer, top, x, rw, grad):
    """The same step through mok.functional directly."""
    ws = F.get_workspace(
        layer.config, None, device="cpu", num_local_tokens=T, hidden_size=H, topk=K
    )
    schedule = F.build_schedule(ws, layer.config, top, num_local_experts=E)
    shared = (layer.shared_gate, layer.shared_up, layer.shared_down)
    routed = [w.detach() for w in (layer.routed_gate, layer.routed_up, layer.routed_down)]
    shared = tuple(None if w is None else w.detach() for w in shared)
    fwd, bwd = routed, routed
    if layer.mxfp8:
        forms = [ops.mxfp8_quantize(w, True, True) for w in routed]
        fwd = [tuple(f[:2]) for f in forms]
        bwd = [tuple(forms[0]), tuple(forms[1]), tuple(forms[2][2:])]
    out, ctx = F.forward(layer.config, ws, schedule, x, rw, *shared, *fwd, layer.swiglu_limit)
    grads = F.backward(
        layer.config, ws, schedule, ctx, grad, x, rw, *shared, *bwd, layer.swiglu_limit
    )
    return out, grads


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "no-shared"])
def test_autograd_equals_functional(single_rank_group, shared, mxfp8):
    torch.manual_seed(0)
    layer = mok.MoELayer(H, I, E, K, shared_expert=shared, swiglu_limit=4.0, mxfp8=mxfp8)
    top, x, rw, grad = _inputs(1)
    x_leaf, rw_leaf = x.clone().requires_grad_(), rw.clone().requires_grad_()
    out = layer(x_leaf, top, rw_leaf)
    out.backward(grad)
    want_out, want = _functional(layer, top, x, rw, grad)
    assert torch.equal(out.detach(), want_out)
    d_x, d_rw, d_gate, d_up, d_down, d_sgate, d_sup, d_sdown = want
    assert torch.equal(x_leaf.grad, d_x) and torch.equal(rw_leaf.grad, d_rw)
    assert torch.equal(layer.routed_gate.grad, d_gate)
    assert torch.equal(layer.routed_up.grad, d_up)
    assert torch.equal(layer.routed_down.grad, d_down)
    if shared:
        assert torch.equal(layer.shared_gate.grad, d_sgate)
        assert torch.equal(layer.shared_down.grad, d_sdown)
    else:
        assert layer.shared_gate is None and d_sup is None


def test_parameters_and_shapes(single_rank_group):
    layer = mok.MoELayer(H, I, E, K)
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes["routed_gate"] == (E, I, H) and shapes["routed_down"] == (E, H, I)
    assert shapes["shared_up"] == (I, H)
    assert all(p.dtype == torch.bfloat16 for p in layer.parameters())


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "fragment"),
    [((100, I, E, K), {}, ValueError, "`hidden_size` must be a multiple of 128"),
     ((H, 100, E, K), {"mxfp8": True}, ValueError, "`intermediate_size` must be a multiple of 128"),
     ((H, I, E, 0), {}, ValueError, r"`topk` must be in \[1, 255\], got 0"),
     ((H, I, 2.0, K), {}, TypeError, "`num_experts` must be an int, got float"),
     ((H, I, E, K), {"swiglu_limit": -1.0}, ValueError, "`swiglu_limit` must be finite and >= 0")],
    ids=["hidden", "inter-mxfp8", "topk", "experts-float", "limit"],
)  # fmt: skip
def test_sizes_are_checked_before_any_weight(single_rank_group, args, kwargs, error, fragment):
    """Caught at construction, not at the first call (nor inside the MXFP8 weight quantizer)."""
    with pytest.raises(error, match=fragment):
        mok.MoELayer(*args, **kwargs)


def test_num_experts_must_divide_over_the_group(single_rank_group):
    with pytest.raises(ValueError, match="`num_experts` must be a positive multiple"):
        mok.MoELayer(H, I, 0, K)


def test_views_and_low_precision_router_weights(single_rank_group):
    """Strided views give the contiguous inputs' result; bf16 router weights are used in fp32
    and get their gradient back in bf16."""
    layer = mok.MoELayer(H, I, E, K)
    top, x, rw, grad = _inputs(5)
    rw_bf16 = rw.bfloat16()
    want = layer(x, top, rw_bf16.float())
    x_view = torch.cat([x, x], dim=1)[:, :H]
    top_view = top.t().contiguous().t()
    rw_leaf = rw_bf16.clone().requires_grad_()
    got = layer(x_view, top_view, rw_leaf)
    assert torch.equal(got, want)
    got.backward(grad)
    assert rw_leaf.grad.dtype == torch.bfloat16 and rw_leaf.grad.shape == (T, K)


def test_input_shape_and_repr(single_rank_group):
    layer = mok.MoELayer(H, I, E, K, shared_expert=False)
    top, x, rw, _ = _inputs(6)
    with pytest.raises(ValueError, match=r"`x` must be bf16 \[T, H\] = \[\*, 128\], got bf16 "
                       r"\[2, 12, 128\]"):  # fmt: skip
        layer(x.reshape(2, T // 2, H), top, rw)
    with pytest.raises(ValueError, match=r"`x` must be bf16 \[T, H\] = \[\*, 128\], got bf16 "
                       r"\[24, 256\]"):  # fmt: skip
        layer(torch.cat([x, x], dim=1), top, rw)
    assert repr(layer) == (
        "MoELayer(hidden_size=128, intermediate_size=128, num_experts=3, num_local_experts=3, "
        "topk=2, shared_expert=False, swiglu_limit=None, mxfp8=False)"
    )
