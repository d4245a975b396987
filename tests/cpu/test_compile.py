"""torch.compile(fullgraph=True) traces build_schedule -> forward -> backward, and mok.MoELayer,
with no graph break, and the compiled step gives bitwise the eager results."""

from __future__ import annotations

import pytest
import torch
from layer_helpers import layer_step

import mok
from mok import functional as F

TOKENS, HIDDEN, INTER, EXPERTS, TOPK = 24, 128, 128, 3, 2
RING_TOKENS = 512


def _inputs(mxfp8: bool, tokens: int = TOKENS):
    generator = torch.Generator().manual_seed(7)

    def weight(*shape):
        return (torch.randn(*shape, generator=generator) / shape[-1] ** 0.5).bfloat16()

    routed = [
        weight(EXPERTS, INTER, HIDDEN),
        weight(EXPERTS, INTER, HIDDEN),
        weight(EXPERTS, HIDDEN, INTER),
    ]
    if mxfp8:
        gate, up, down = (torch.ops.mok.mxfp8_quantize(w, True, True) for w in routed)
        routed = [gate, up, down]
    return {
        "top_experts": torch.randint(0, EXPERTS, (tokens, TOPK), generator=generator),
        "x": torch.randn(tokens, HIDDEN, generator=generator).bfloat16(),
        "rw": torch.rand(tokens, TOPK, generator=generator),
        "grad": torch.randn(tokens, HIDDEN, generator=generator).bfloat16(),
        "shared": (weight(INTER, HIDDEN), weight(INTER, HIDDEN), weight(HIDDEN, INTER)),
        "routed": routed,
    }


def _step(config, ws, top_experts, x, rw, grad, shared, routed, mxfp8):
    schedule = F.build_schedule(ws, config, top_experts, num_local_experts=EXPERTS)
    fwd_routed = [tuple(w[:2]) for w in routed] if mxfp8 else routed
    out, ctx = F.forward(config, ws, schedule, x, rw, *shared, *fwd_routed, swiglu_limit=3.0)
    bwd_routed = [tuple(routed[0]), tuple(routed[1]), tuple(routed[2][2:])] if mxfp8 else routed
    grads = F.backward(
        config, ws, schedule, ctx, grad, x, rw, *shared, *bwd_routed, swiglu_limit=3.0
    )
    return out, grads


@pytest.mark.parametrize("ring", [False, True], ids=["every-row", "ring"])
@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_fullgraph_step_matches_eager(single_rank_group, mxfp8, ring):
    """With `ring` (at 512 tokens: more schedule rows than the ring of a 256-row macrobatch)
    the traced step saves the ring (its fused ops return that many routed rows, their fakes say
    so) and still gives the bits of the eager step that saves every row (mok.macrobatch)."""
    config = F.MoKConfig()
    traced_config = F.MoKConfig(minibatch_size=256, macrobatch_size=256) if ring else config
    tokens = RING_TOKENS if ring else TOKENS
    ws = F.create_workspace(
        config,
        single_rank_group,
        device="cpu",
        num_local_tokens=tokens,
        hidden_size=HIDDEN,
        topk=TOPK,
    )
    args = _inputs(mxfp8, tokens)
    eager = _step(config, ws, *args.values(), mxfp8)
    torch._dynamo.reset()
    compiled = torch.compile(_step, fullgraph=True, backend="aot_eager")
    traced = compiled(traced_config, ws, *args.values(), mxfp8)
    flat_eager = [eager[0], *eager[1]]
    flat_traced = [traced[0], *traced[1]]
    for a, b in zip(flat_eager, flat_traced, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_fullgraph_layer_matches_eager(single_rank_group, mxfp8):
    """mok.MoELayer (its autograd node, the workspace cache and the on-the-fly quantization
    included) traces whole, forward and backward, and gives the eager bits."""
    torch.manual_seed(3)
    layer = mok.MoELayer(HIDDEN, INTER, EXPERTS, TOPK, swiglu_limit=3.0, mxfp8=mxfp8)
    args = _inputs(False)

    def step(call):
        return layer_step(layer, call, args["x"], args["top_experts"], args["rw"], args["grad"])

    eager = step(layer)
    torch._dynamo.reset()
    traced = step(torch.compile(layer, fullgraph=True, backend="aot_eager"))
    for a, b in zip(eager, traced, strict=True):
        assert torch.equal(a, b)


def test_the_traced_step_runs_with_the_configs_speed_knobs(single_rank_group, monkeypatch):
    """Under torch.compile the passes run inside the fused ops, which get the config's speed
    knobs through `mok_config`: the engine of each pass sees them (before: the environment's)."""
    from mok.backends.reference import kernels

    seen, original = [], kernels.op_engine

    def recording(buffers, x_ptrs, topk, group_name, config=None):
        seen.append(config)
        return original(buffers, x_ptrs, topk, group_name, config)

    monkeypatch.setattr(kernels, "op_engine", recording)
    config = F.MoKConfig(overlap_ctas=8, grouped_gemm="torch", swiglu_epilogue=True)
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=TOKENS,
                            hidden_size=HIDDEN, topk=TOPK)  # fmt: skip
    torch._dynamo.reset()
    compiled = torch.compile(_step, fullgraph=True, backend="aot_eager")
    compiled(config, ws, *_inputs(False).values(), False)
    knobs = [(c.overlap_ctas, c.grouped_gemm, c.swiglu_epilogue) for c in seen]
    assert knobs == [(8, "torch", True)] * 2  # the forward's pass and the backward's
