"""The dispatch at EP 1 reads the caller's x, d_y and router weights in place (the engines'
`use_sources`): the workspace buffers keep what they held and the step gives the bits it gives
with the copies (the CUDA kernels' side: tests/gpu/test_pull_in_place_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from mok import functional as F
from mok.backends.reference.engine import ReferenceEngine
from mok.workspace import Buffer

T, H, I, E, K = 40, 128, 128, 3, 2
PULLED = (Buffer.X, Buffer.D_Y, Buffer.ROUTER_WEIGHT)


def _bf16(*shape, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) / 8).bfloat16()


def _train_step(config, ws, shared: bool):
    gen = torch.Generator().manual_seed(3)
    top = torch.randint(0, E, (T, K), generator=gen)
    rw = torch.rand(T, K, generator=gen)
    x, d_out = _bf16(T, H, seed=1), _bf16(T, H, seed=2)
    own = (_bf16(I, H, seed=4), _bf16(I, H, seed=5), _bf16(H, I, seed=6)) if shared else (None,) * 3
    weights = (*own, _bf16(E, I, H, seed=7), _bf16(E, I, H, seed=8), _bf16(E, H, I, seed=9))
    schedule = F.build_schedule(ws, config, top, num_local_experts=E)
    out, ctx = F.forward(config, ws, schedule, x, rw, *weights)
    return (out, *F.backward(config, ws, schedule, ctx, d_out, x, rw, *weights))


def _copying(self, tensors):
    """use_sources as it was: every tensor copied into its buffer."""
    return {name: self.buffers[name].copy_(tensor) for name, tensor in tensors.items()}


@pytest.mark.parametrize("shared", [False, True])
def test_reading_in_place_gives_the_bits_of_the_copies(single_rank_group, monkeypatch, shared):
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=T,
                            hidden_size=H, topk=K)  # fmt: skip
    for name in PULLED:
        getattr(ws, name).fill_(float("nan"))
    got = _train_step(config, ws, shared)
    for name in PULLED:
        assert getattr(ws, name).isnan().all(), f"{name} was written: EP 1 reads in place"
    monkeypatch.setattr(ReferenceEngine, "use_sources", _copying)
    want = _train_step(config, ws, shared)
    assert not ws.x_buffer.isnan().any(), "the copies did run"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert torch.equal(a, b), f"output {i} differs"
            assert not a.float().isnan().any(), f"output {i} read a buffer"
