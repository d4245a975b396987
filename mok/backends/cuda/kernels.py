"""The CUDA backend's face for mok.backends' registry: the same functions as
mok.backends.reference.kernels, on mok's kernels.

The functions that take a workspace's buffer as the original's flat ops give it (the routing
all-gather, the barrier, the fused ops' engine) find that buffer's workspace here, once
(mok.workspace.workspace_for): that is the compatibility edge. mok.functional passes the
workspace itself (`engine`).
"""

from __future__ import annotations

import torch

from mok.backends.cuda import comm, epilogue, mxfp8
from mok.backends.cuda import schedule as schedule_stage
from mok.backends.cuda.engine import CudaEngine
from mok.workspace import Buffer, MoKWorkspace, workspace_for

# The entries (mok.functional, the flat ops) check their arguments first: the registry's face
# launches without checking them again (docs/compat-edge.md).
routing = schedule_stage.launch_routing
schedule = schedule_stage.launch_schedule
local_schedule = schedule_stage.launch_local_schedule
mxfp8_quantize = mxfp8.mxfp8_quantize
fwd_epilogue = epilogue.fwd_epilogue
bwd_epilogue = epilogue.bwd_epilogue


def _workspace(group_name: str, name: str, tensor: torch.Tensor, ptrs=None) -> MoKWorkspace:
    workspace = workspace_for(group_name, name, tensor, ptrs)
    if workspace is None:
        raise ValueError(
            f"on CUDA, `{name}` must be the `{name}` of a live mok workspace of group "
            f"{group_name or '(default)'!r} (call mok.functional, or pass the workspace's "
            f"buffers and their `{name}_ptrs`)"
        )
    return workspace


def engine(workspace: MoKWorkspace, config=None) -> CudaEngine:
    """mok.passes' engine on the workspace's own buffers, with `config`'s speed knobs."""
    return CudaEngine(workspace, config)


def op_engine(buffers: dict[str, torch.Tensor], x_ptrs, topk: int, group_name: str, config=None):
    """The engine of a fused op called with the original's flat arguments, with `config`'s
    speed knobs (see CudaEngine.with_stand_ins for arguments that are copies of the buffers)."""
    workspace = _workspace(group_name, Buffer.X, buffers[Buffer.X], x_ptrs)
    return CudaEngine.with_stand_ins(workspace, buffers, config)


def all_gather_top_experts(top_experts, buffer, group_name: str, chunk_bytes: int = 0) -> None:
    name = "all_gather_top_experts_buffer"
    workspace = _workspace(group_name, name, buffer)
    gathered = comm.all_gather_top_experts(workspace, top_experts, chunk_bytes=chunk_bytes)
    if buffer.data_ptr() != gathered.data_ptr():  # a functional copy (torch.compile)
        buffer.copy_(gathered)


def gather_routing(workspace: MoKWorkspace, routing: torch.Tensor, chunk_bytes: int = 0):
    """Every rank's routing into the workspace's all-gather buffer (int32 [EP, T, k]), copied
    `chunk_bytes` at a time by each CTA (0: the kernel's default)."""
    return comm.all_gather_top_experts(workspace, routing, chunk_bytes=chunk_bytes)


combine_status = comm.combine_status


def barrier(barrier_buffer, barrier_buffer_ptrs, target, group_name: str) -> None:
    comm.barrier(_workspace(group_name, "barrier_buffer", barrier_buffer, barrier_buffer_ptrs))
