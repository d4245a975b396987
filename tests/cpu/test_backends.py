"""Backend selection (MOK_BACKEND) and the CUDA engine's refusal of foreign buffers."""

from __future__ import annotations

import pytest
import torch

from mok import backends
from mok.backends.cuda_moe import CudaEngine
from mok.backends.reference import ReferenceEngine

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("choice", "device", "expected"),
    [("auto", CPU, False), ("reference", CPU, False), ("reference", CUDA, False)],
    ids=["auto-cpu", "reference-cpu", "reference-cuda"],
)
def test_uses_cuda(monkeypatch, choice, device, expected):
    monkeypatch.setenv("MOK_BACKEND", choice)
    assert backends.uses_cuda(device) is expected


def test_unknown_choice_is_named(monkeypatch):
    monkeypatch.setenv("MOK_BACKEND", "triton")
    with pytest.raises(ValueError, match=r"MOK_BACKEND must be one of auto, reference, cuda"):
        backends.uses_cuda(CPU)


def test_cuda_choice_needs_cuda_tensors(monkeypatch):
    monkeypatch.setenv("MOK_BACKEND", "cuda")
    with pytest.raises(ValueError, match="MOK_BACKEND=cuda needs CUDA tensors"):
        backends.uses_cuda(CPU)


def test_reference_engine_off_cuda(monkeypatch):
    monkeypatch.delenv("MOK_BACKEND", raising=False)
    engine = backends.select_engine(CPU, {"x_buffer": torch.zeros(4, 128)}, 2, "")
    assert isinstance(engine, ReferenceEngine)


def test_cuda_engine_refuses_buffers_of_no_workspace():
    with pytest.raises(ValueError, match="`x_buffer` is not the buffer of that name"):
        CudaEngine.for_buffers({"x_buffer": torch.zeros(4, 128)})
