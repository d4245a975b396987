"""mok.MoELayer (autograd) on the CUDA backend: output and every gradient against the same layer
on the reference backend, and the layer under torch.compile(fullgraph=True) giving the eager bits.

Rank-count agnostic: the 1-rank pass runs it at EP=1, the multi-GPU pass at EP=N (four experts per
rank). Fresh random data every run (seed printed; replay with MOK_TEST_SEED).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from layer_helpers import layer_step

import mok
from mok import functional as F

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]

TOKENS, HIDDEN, INTER, EXPERTS_PER_RANK, TOPK, LIMIT = 256, 1024, 512, 4, 3, 6.0
# Σ|diff| / Σ|ref| per tensor (DESIGN.md §7's relative bound; weight gradients included).
RELATIVE = {False: 0.01, True: 0.1}


def _layer(seed: int, mxfp8: bool) -> mok.MoELayer:
    torch.manual_seed(seed + dist.get_rank())  # each rank its own experts
    experts = EXPERTS_PER_RANK * dist.get_world_size()
    return mok.MoELayer(HIDDEN, INTER, experts, TOPK, swiglu_limit=LIMIT, mxfp8=mxfp8,
                        device="cuda")  # fmt: skip


def _inputs(seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed + 7 + dist.get_rank())
    experts = EXPERTS_PER_RANK * dist.get_world_size()
    scores = torch.rand(TOKENS, experts, generator=gen, device="cuda")
    return {
        "x": torch.randn(TOKENS, HIDDEN, generator=gen, device="cuda").bfloat16(),
        "top": scores.topk(TOPK, dim=1).indices,
        "rw": torch.rand(TOKENS, TOPK, generator=gen, device="cuda"),
        "grad": torch.randn(TOKENS, HIDDEN, generator=gen, device="cuda").bfloat16(),
    }


def _step(layer, call, data) -> list[torch.Tensor]:
    return layer_step(layer, call, data["x"], data["top"], data["rw"], data["grad"])


def _poison(layer, data) -> None:
    """NaN into the layer's workspace buffers the passes write, so a write the compiled step
    skips cannot pass on the eager step's values."""
    ws = F.get_workspace(layer.config, layer.group, device=data["x"].device,
                         num_local_tokens=TOKENS, hidden_size=HIDDEN, topk=TOPK)  # fmt: skip
    for buffer in (ws.combine_buffer, ws.d_x_routed_buffer, ws.d_router_weight_buffer):
        buffer.fill_(float("nan"))


@pytest.mark.parametrize("mxfp8", [False, True], ids=["bf16", "mxfp8"])
def test_layer_matches_reference_and_compiles(nccl_group, monkeypatch, seed, mxfp8):
    layer, data = _layer(seed, mxfp8), _inputs(seed)
    names = ["out", "d_x", "d_router_weights", *(n for n, _ in layer.named_parameters())]
    cuda = _step(layer, layer, data)
    monkeypatch.setenv("MOK_BACKEND", "reference")
    reference = _step(layer, layer, data)
    monkeypatch.delenv("MOK_BACKEND")
    for name, got, ref in zip(names, cuda, reference, strict=True):
        assert torch.isfinite(got.float()).all(), f"{name}: non-finite values"
        diff = (got.double() - ref.double()).abs().sum()
        rel = float(diff / ref.double().abs().sum().clamp(min=1e-30))
        assert rel <= RELATIVE[mxfp8], f"{name}: Σ|diff|/Σ|ref| = {rel:.3g} against the reference"

    _poison(layer, data)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    traced = _step(layer, compiled, data)
    for name, a, b in zip(names, cuda, traced, strict=True):
        assert torch.equal(a, b), f"{name}: the compiled layer differs from eager"
