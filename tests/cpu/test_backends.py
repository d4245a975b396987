"""Backend selection (MOK_BACKEND, MOK_GROUPED_GEMM) and the CUDA engine's refusal of foreign
buffers."""

from __future__ import annotations

import pytest
import torch

from mok import backends
from mok.backends.cuda_moe import CudaEngine, GroupedGemms, HopperGemms
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


def _cpu_schedule(experts: int = 2):
    rows = 256 * experts
    return (
        torch.zeros(rows, dtype=torch.int32),
        torch.zeros(rows, dtype=torch.int32),
        torch.tensor([rows], dtype=torch.int32),
        torch.full((experts,), 256, dtype=torch.int32),
    )


@pytest.mark.parametrize("choice", ["auto", "torch"])
def test_routed_gemms_fall_back_to_torch_without_mok_kernels(monkeypatch, choice):
    monkeypatch.setenv("MOK_GROUPED_GEMM", choice)
    assert isinstance(CudaEngine.routed_gemms(_cpu_schedule(), 2), GroupedGemms)


def test_routed_gemms_mok_choice_needs_the_kernels(monkeypatch):
    monkeypatch.setenv("MOK_GROUPED_GEMM", "mok")
    with pytest.raises(NotImplementedError, match="MOK_GROUPED_GEMM=mok, but cpu's module"):
        CudaEngine.routed_gemms(_cpu_schedule(), 2)


def test_routed_gemms_unknown_choice_is_named(monkeypatch):
    monkeypatch.setenv("MOK_GROUPED_GEMM", "cublas")
    with pytest.raises(ValueError, match="MOK_GROUPED_GEMM must be auto, mok or torch"):
        CudaEngine.routed_gemms(_cpu_schedule(), 2)


def test_swiglu_epilogue_switch_is_checked(monkeypatch):
    monkeypatch.setenv("MOK_SWIGLU_EPILOGUE", "1")
    assert HopperGemms(_cpu_schedule(), 2).swiglu_epilogue
    monkeypatch.delenv("MOK_SWIGLU_EPILOGUE")
    assert not HopperGemms(_cpu_schedule(), 2).swiglu_epilogue
    monkeypatch.setenv("MOK_SWIGLU_EPILOGUE", "yes")
    with pytest.raises(ValueError, match="MOK_SWIGLU_EPILOGUE must be one of 0, 1, got 'yes'"):
        HopperGemms(_cpu_schedule(), 2)


def test_mxfp8_f16_switch_is_checked(monkeypatch):
    """The MXFP8 forward reads f16 rebased rows (kind 6) only with MOK_MXFP8_F16=1."""
    monkeypatch.delenv("MOK_MXFP8_F16", raising=False)
    assert not HopperGemms(_cpu_schedule(), 2).reads_rebased_rows
    monkeypatch.setenv("MOK_MXFP8_F16", "1")
    assert HopperGemms(_cpu_schedule(), 2).reads_rebased_rows
    monkeypatch.setenv("MOK_MXFP8_F16", "on")
    with pytest.raises(ValueError, match="MOK_MXFP8_F16 must be one of 0, 1, got 'on'"):
        HopperGemms(_cpu_schedule(), 2)
