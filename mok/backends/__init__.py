"""The one registry that chooses an implementation: reference or CUDA, and the routed GEMMs.

`MOK_BACKEND` (mok.settings) chooses: `auto` (default) runs the CUDA extension for CUDA tensors
and the reference for everything else; `reference` forces the pure-PyTorch oracle on any device;
`cuda` insists on the extension. A CUDA device the installed wheel has no module for raises
NotImplementedError naming its compute capability and the archs the wheel carries (auto and
cuda alike), so nothing silently falls back to the slow path.

Both backends are modules with the same functions, BACKEND_FUNCTIONS
(`mok.backends.reference.kernels`, `mok.backends.cuda.kernels`): the ops and the functional API
call `for_device(device).<name>` and never test which backend they got.
"""

from __future__ import annotations

from types import ModuleType

import torch

from mok import settings

# What every backend module offers (tests/cpu/test_backends.py holds both to it).
BACKEND_FUNCTIONS = ("routing", "schedule", "local_schedule", "gather_routing", "combine_status",
                     "all_gather_top_experts", "barrier", "engine", "op_engine",
                     "mxfp8_quantize", "fwd_epilogue", "bwd_epilogue")  # fmt: skip


def uses_cuda(device: torch.device) -> bool:
    """True when the CUDA extension must serve tensors on `device` (raises if it cannot)."""
    selected = settings.backend()
    if selected == "reference":
        return False
    if device.type != "cuda":
        if selected == "cuda":
            raise ValueError(f"MOK_BACKEND=cuda needs CUDA tensors, got tensors on {device}")
        return False
    from mok.backends.cuda import extension

    extension.module_for_device(device)  # NotImplementedError for an unsupported device
    return True


def for_device(device: torch.device, *, traced: bool = False) -> ModuleType:
    """The backend module that serves tensors on `device` (see `uses_cuda`). `traced`: the
    caller is being traced by torch.compile, which cannot follow a raw kernel launch, and has no
    op of its own there; the reference's torch ops (the same bits) serve it."""
    if not traced and uses_cuda(device):
        from mok.backends.cuda import kernels

        return kernels
    from mok.backends.reference import kernels

    return kernels


def engine(workspace, config=None):
    """mok.passes' engine on `workspace`'s buffers, with `config`'s speed knobs (None: a
    default MoKConfig's, i.e. the environment's)."""
    return for_device(workspace.device).engine(workspace, config)


def routed_gemms(schedule, num_experts: int, config=None):
    """The routed experts' GEMM engine for a schedule on a CUDA device: mok's grouped GEMMs
    where the module has them, `torch._grouped_mm` otherwise or when the config's
    grouped_gemm (MOK_GROUPED_GEMM) is torch."""
    from mok.backends.cuda import grouped_gemm, routed_gemms
    from mok.config import MoKConfig

    config = config or MoKConfig()
    device = schedule[3].device
    if config.grouped_gemm == "torch":
        return routed_gemms.GroupedGemms(schedule, num_experts)
    if grouped_gemm.available(device):
        return routed_gemms.HopperGemms(schedule, num_experts, config)
    if config.grouped_gemm == "mok":
        raise NotImplementedError(
            f"grouped_gemm='mok' (MOK_GROUPED_GEMM), but {device}'s module has no grouped GEMMs"
        )
    return routed_gemms.GroupedGemms(schedule, num_experts)
