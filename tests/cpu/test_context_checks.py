"""backward checks the forward context against itself before any kernel reads it by address: the
mode (BF16 tensors or MXFP8 pairs), the shared expert's presence and every saved tensor's shape.
A context of another forward (another mode, layer or schedule) is a named error, on the
functional path and on the fused ops' own."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from step_setup import single_rank_step

from mok import functional as F
from mok import ops

T, H, I, E, K = 16, 128, 128, 2, 2


def _bf16(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _weights(inter=I, seed=0):
    routed = (_bf16(E, inter, H, seed=seed), _bf16(E, inter, H, seed=seed + 1),
              _bf16(E, H, inter, seed=seed + 2))  # fmt: skip
    shared = (_bf16(inter, H, seed=seed + 3), _bf16(inter, H, seed=seed + 4),
              _bf16(H, inter, seed=seed + 5))  # fmt: skip
    return shared, routed


def _mxfp8(routed, backward):
    pairs = [ops.mxfp8_quantize(w, True, True) for w in routed]
    if backward:
        return pairs[0], pairs[1], pairs[2][2:]
    return tuple(p[:2] for p in pairs)


@pytest.fixture
def step(single_rank_group):
    config, ws, schedule = single_rank_step(
        single_rank_group, tokens=T, hidden=H, topk=K, experts=E, seed=1
    )
    x, rw, grad = _bf16(T, H, seed=7), torch.rand(T, K), _bf16(T, H, seed=8)

    def forward(shared, routed):
        return F.forward(config, ws, schedule, x, rw, *shared, *routed)[1]

    def backward(ctx, shared, routed):
        return F.backward(config, ws, schedule, ctx, grad, x, rw, *shared, *routed)

    return forward, backward


def test_a_bf16_context_in_an_mxfp8_backward(step):
    forward, backward = step
    shared, routed = _weights()
    with pytest.raises(TypeError, match=r"`forward_context.x_routed` is another mode's \(bf16 "
                       r"\[\d+, 128\] on cpu\) but the routed weights are MXFP8"):  # fmt: skip
        backward(forward(shared, routed), shared, _mxfp8(routed, backward=True))


def test_an_mxfp8_context_in_a_bf16_backward(step):
    forward, backward = step
    shared, routed = _weights()
    ctx = forward(shared, _mxfp8(routed, backward=False))
    with pytest.raises(TypeError, match=r"`forward_context.x_routed` is another mode's \(tuple\) "
                       r"but the routed weights are bf16"):  # fmt: skip
        backward(ctx, shared, routed)


def test_shared_expert_presence_must_match(step):
    forward, backward = step
    shared, routed = _weights()
    none = (None, None, None)
    with pytest.raises(ValueError, match=r"`forward_context.gate_shared` is None but this "
                       r"backward has a shared expert"):  # fmt: skip
        backward(forward(none, routed), shared, routed)
    with pytest.raises(ValueError, match=r"`forward_context.gate_shared` holds a tensor but "
                       r"this backward has no shared expert"):  # fmt: skip
        backward(forward(shared, routed), none, routed)


def test_a_context_of_another_layer_size(step):
    forward, backward = step
    ctx = forward(*_weights(inter=256))
    with pytest.raises(ValueError, match=r"`forward_context.gate_shared` must be bf16 \[T, I\] = "
                       r"\[16, 128\], got bf16 \[16, 256\]"):  # fmt: skip
        backward(ctx, *_weights())


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_a_truncated_routed_tensor(step, mxfp8):
    forward, backward = step
    shared, routed = _weights()
    ctx = forward(shared, _mxfp8(routed, backward=False) if mxfp8 else routed)
    if mxfp8:
        data, scale = ctx.gate_routed
        short = dataclasses.replace(ctx, gate_routed=(data[:-128], scale))
        message = r"`forward_context.gate_routed\[0\]` must be float8_e4m3fn"
    else:
        short = dataclasses.replace(ctx, gate_routed=ctx.gate_routed[:-256])
        message = r"`forward_context.gate_routed` must be bf16 \[\d+, 128\], got bf16"
    with pytest.raises(ValueError, match=message):
        backward(short, shared, _mxfp8(routed, backward=True) if mxfp8 else routed)


def test_the_fused_op_checks_its_saved_tensors_itself(step, monkeypatch):
    """Called without mok.functional's checks (as through torch.ops, which is how mok.functional
    reaches it while torch.compile traces), the op makes them."""
    forward, backward = step
    shared, routed = _weights()
    ctx = forward(shared, routed)
    monkeypatch.setattr(F, "_check_context", lambda *args: None)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    short = dataclasses.replace(ctx, hidden_routed=ctx.hidden_routed[:, :64])
    with pytest.raises(ValueError, match=r"`hidden_routed` must be bf16 \[\d+, 128\]"):
        backward(short, shared, routed)


def test_saved_fields_are_the_context_fields_in_order():
    """The fused ops hand their saved tensors to the check in this order."""
    from mok import _moe_arguments

    assert (
        tuple(f.name for f in dataclasses.fields(F.MoKForwardContext))[:7]
        == _moe_arguments.SAVED_FIELDS
    )
