"""The registry (mok.backends: MOK_BACKEND, MOK_GROUPED_GEMM), the flat ops' workspace lookup and
the CUDA engine's handling of functional copies of the buffers (torch.compile)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mok import backends, workspace
from mok.backends.cuda import kernels as cuda_kernels
from mok.backends.cuda import pull_beside
from mok.backends.cuda.engine import CudaEngine
from mok.backends.cuda.routed_gemms import GroupedGemms, HopperGemms
from mok.backends.reference import kernels as reference_kernels
from mok.backends.reference.engine import ReferenceEngine
from mok.config import MoKConfig

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
    backend = backends.for_device(CPU)
    engine = backend.op_engine({"x_buffer": torch.zeros(4, 128)}, [0], 2, "")
    assert isinstance(engine, ReferenceEngine)


@pytest.mark.parametrize("backend", [reference_kernels, cuda_kernels], ids=["reference", "cuda"])
def test_each_backend_offers_every_function(backend):
    missing = [
        name for name in backends.BACKEND_FUNCTIONS if not callable(getattr(backend, name, None))
    ]
    assert missing == []


def test_the_registry_hands_out_the_reference_while_tracing(monkeypatch):
    monkeypatch.setattr(backends, "uses_cuda", lambda device: True)
    assert backends.for_device(CUDA, traced=True) is reference_kernels


def test_cuda_engine_refuses_pointers_of_no_workspace():
    with pytest.raises(ValueError, match="must be the `x_buffer` of a live mok workspace"):
        cuda_kernels.op_engine({"x_buffer": torch.zeros(4, 128)}, [12345], 2, "g")


class _Workspace:
    """The symmetric buffers of a registered workspace, on the CPU (weakref-able)."""

    def __init__(self, group_name="g"):
        self.group_name = group_name
        for name, (dtype, shape_of) in workspace._SYMMETRIC_BUFFERS.items():
            tensor = torch.zeros(shape_of(2, 4, 128, 2), dtype=dtype)
            setattr(self, name, tensor)
            setattr(self, f"{name}_ptrs", [111, tensor.data_ptr()])
        workspace._register(self)


def test_cuda_engine_takes_functional_copies_of_the_buffers():
    """Under torch.compile the ops get copies: values go into the buffers the peers read, and
    the pushed-into buffers' values come back to their copies; the buffers themselves (eager
    mode) are neither copied nor handed back."""
    ws = _Workspace()
    x = torch.randn(4, 128).bfloat16()
    combine = torch.full((8, 128), float("nan")).bfloat16()
    engine = cuda_kernels.op_engine({"x_buffer": x, "combine_buffer": combine}, ws.x_buffer_ptrs,
                                    2, "g")  # fmt: skip
    assert engine.ws is ws and torch.equal(ws.x_buffer, x)
    ws.combine_buffer.fill_(3.0)
    engine.hand_back_pushed()
    assert (combine == 3.0).all() and (x != 3.0).any()
    own = CudaEngine.with_stand_ins(ws, {"x_buffer": ws.x_buffer})
    assert own._stand_ins == {}
    with pytest.raises(ValueError, match=r"`combine_buffer` must have the workspace's"):
        CudaEngine.with_stand_ins(ws, {"combine_buffer": combine[:4]})


def test_a_flat_op_finds_its_workspace_by_pointer_list_or_first_created_layout():
    """The compatibility edge's one lookup: a pointer list names its buffer's workspace; an op
    without one (the routing all-gather) gets the group's first-created workspace whose buffer
    has the given layout."""
    first, other, later = _Workspace("g2"), _Workspace("g3"), _Workspace("g2")
    name = "all_gather_top_experts_buffer"
    probe = torch.zeros_like(first.all_gather_top_experts_buffer)
    assert workspace.workspace_for("g2", name, probe) is first
    assert workspace.workspace_for("g3", name, probe) is other
    assert workspace.workspace_for("g2", name, probe[:1]) is None
    assert workspace.workspace_for("g2", "x_buffer", probe, later.x_buffer_ptrs) is later
    assert workspace.workspace_for("g2", "x_buffer", probe, [1, 2]) is None


def _cpu_schedule(experts: int = 2):
    rows = 256 * experts
    return (
        torch.zeros(rows, dtype=torch.int32),
        torch.zeros(rows, dtype=torch.int32),
        torch.tensor([rows], dtype=torch.int32),
        torch.full((experts,), 256, dtype=torch.int32),
    )


@pytest.mark.parametrize("choice", ["auto", "torch"])
def test_routed_gemms_fall_back_to_torch_without_mok_kernels(choice):
    config = MoKConfig(grouped_gemm=choice)
    assert isinstance(CudaEngine(None, config).routed_gemms(_cpu_schedule(), 2), GroupedGemms)


def test_routed_gemms_mok_choice_needs_the_kernels():
    with pytest.raises(NotImplementedError, match=r"grouped_gemm='mok' \(MOK_GROUPED_GEMM\), "
                       "but cpu's module"):  # fmt: skip
        backends.routed_gemms(_cpu_schedule(), 2, MoKConfig(grouped_gemm="mok"))


def test_routed_gemms_take_the_environment_without_a_config(monkeypatch):
    monkeypatch.setenv("MOK_GROUPED_GEMM", "mok")
    with pytest.raises(NotImplementedError, match="grouped_gemm='mok'"):
        backends.routed_gemms(_cpu_schedule(), 2)
    monkeypatch.setenv("MOK_GROUPED_GEMM", "cublas")
    with pytest.raises(ValueError, match="MOK_GROUPED_GEMM must be one of auto, mok, torch"):
        backends.routed_gemms(_cpu_schedule(), 2)


def test_experimental_switches_come_from_the_config():
    """The SwiGLU epilogue (M_GROUPED_BF16_NT_SWIGLU) and the MXFP8 forward's f16 rebased rows
    (M_GROUPED_MXFP8_NT_F16_ROWS) run only when the config asks."""
    assert not HopperGemms(_cpu_schedule(), 2, MoKConfig()).swiglu_epilogue
    assert HopperGemms(_cpu_schedule(), 2, MoKConfig(swiglu_epilogue=True)).swiglu_epilogue
    assert not HopperGemms(_cpu_schedule(), 2, MoKConfig()).reads_rebased_rows
    assert HopperGemms(_cpu_schedule(), 2, MoKConfig(mxfp8_f16_rows=True)).reads_rebased_rows


def test_a_pull_runs_beside_the_gemms_that_wait_for_rows_only():
    """The BF16 gate/up GEMM and the d_h GEMM wait for their rows (engine.pull_beside); the
    SwiGLU epilogue's does not, and a pull beside any other linear is refused before a launch."""
    assert HopperGemms(_cpu_schedule(), 2, MoKConfig()).runs_pulls
    assert not HopperGemms(_cpu_schedule(), 2, MoKConfig(swiglu_epilogue=True)).runs_pulls
    gemms = HopperGemms(_cpu_schedule(), 2, MoKConfig())
    rows, weight = torch.zeros(512, 128), torch.zeros(2, 256, 128)
    with pytest.raises(ValueError, match="`pull` runs beside the backward's d_h GEMM"):
        gemms.linear(rows, weight, pull=object())


@pytest.mark.parametrize(("ctas", "minibatch", "want"), [(40, 4096, 3), (2, 256, 2), (8, 256, 8)])
def test_a_pull_beside_a_gemm_takes_no_more_ctas_than_minibatches(monkeypatch, ctas, minibatch,
                                                                   want):  # fmt: skip
    """Each CTA of the pull copies whole minibatches: CTAs past the minibatch count would only
    hold SMs from the GEMM, so the pull (and the SMs the GEMM leaves it) is capped there."""
    rows = 9000  # 3 minibatches of 4096, 36 of 256
    schedule = (torch.zeros(rows, dtype=torch.int32),) * 2 + (torch.zeros(1, dtype=torch.int32),)
    launched = {}

    class Module:
        @staticmethod
        def comm_overlapped_pull(**kwargs):
            launched.update(kwargs)
            return "native"

    def operands(ws, name, sched, out, source):
        return torch.zeros(4, 128), 0, sched

    monkeypatch.setattr(pull_beside.cuda_comm, "pull_operands", operands)
    monkeypatch.setattr(pull_beside.extension, "module_for_device", lambda device: Module)
    ws = SimpleNamespace(device=torch.device("cpu"), topk=2, ep_size=1, status=torch.zeros(1),
                         peer_ptr_tables={"x_buffer": torch.zeros(1)})  # fmt: skip
    out = torch.zeros(rows, 128)
    pull = pull_beside.overlapped_pull(
        ws, "x_buffer", schedule, out, ctas=ctas, minibatch_rows=minibatch, sync_before=False
    )
    assert launched["ctas"] == pull.ctas == want
    assert pull.arrivals.numel() == -(-rows // minibatch)
