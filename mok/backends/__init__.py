"""Backend selection: which implementation serves an op for a given device.

`MOK_BACKEND` chooses: `auto` (default) runs the CUDA extension for CUDA tensors and the
reference for everything else; `reference` forces the pure-PyTorch oracle on any device; `cuda`
insists on the extension. A CUDA device the installed wheel has no module for raises
NotImplementedError naming its compute capability and the archs the wheel carries (auto and
cuda alike), so nothing silently falls back to the slow path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

CHOICES = ("auto", "reference", "cuda")


def choice() -> str:
    value = os.environ.get("MOK_BACKEND", "auto")
    if value not in CHOICES:
        raise ValueError(f"MOK_BACKEND must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


def uses_cuda(device: torch.device) -> bool:
    """True when the CUDA extension must serve tensors on `device` (raises if it cannot)."""
    selected = choice()
    if selected == "reference":
        return False
    if device.type != "cuda":
        if selected == "cuda":
            raise ValueError(f"MOK_BACKEND=cuda needs CUDA tensors, got tensors on {device}")
        return False
    from mok import _extension

    _extension.module_for_device(device)  # NotImplementedError for an unsupported device
    return True


def select_engine(
    device: torch.device,
    buffers: dict[str, torch.Tensor],
    topk: int,
    group_name: str,
    x_ptrs: Sequence[int] = (),
):
    """The engine of mok.backends.moe for tensors on `device` (see `uses_cuda`); `x_ptrs` (the
    op's pointer list of `x_buffer`) names the CUDA workspace."""
    if uses_cuda(device):
        from mok.backends.cuda_moe import CudaEngine

        return CudaEngine.for_buffers(buffers, x_ptrs)
    from mok.backends.reference import ReferenceEngine

    return ReferenceEngine(buffers, topk, group_name)
