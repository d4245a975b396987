"""`torch.ops.mok.*`: the low-level ops, as torch.library custom ops with fake implementations.

Names, argument order and return order are the original package's; mok adds optional trailing
arguments (`group_name`, peer pointer lists, `status`). Each op runs the CUDA extension where it
has a kernel for the tensor's device and the reference backend otherwise; the fake
implementations let `torch.compile(fullgraph=True)` trace a whole step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mok import _validate, backends
from mok import mxfp8 as mxfp8_format
from mok._checks import check_multiple, check_tensor
from mok._custom_op import custom_op
from mok._moe_bwd_ops import (  # noqa: F401  (re-exported: the fused passes)
    dispatch_mlp_swiglu_combine_bwd_bf16,
    dispatch_mlp_swiglu_combine_bwd_mxfp8,
)
from mok._moe_ops import (  # noqa: F401
    dispatch_mlp_swiglu_combine_fwd_bf16,
    dispatch_mlp_swiglu_combine_fwd_mxfp8,
)
from mok.backends import reference
from mok.workspace import same_layout, workspace_at, workspace_of_group, workspace_owning


@custom_op("mok::all_gather_top_experts", mutates_args=("all_gather_top_experts_buffer",))
def all_gather_top_experts(
    top_experts: torch.Tensor,
    all_gather_top_experts_buffer: torch.Tensor,
    all_gather_top_experts_buffer_multicast_ptr: int,
    rank: int,
    chunk_bytes: int,
    group_name: str = "",
) -> None:
    """Every rank gets the whole routing table.

    | argument                      | dtype | shape              |
    |-------------------------------|-------|--------------------|
    | top_experts                   | int32 | [T, k]             |
    | all_gather_top_experts_buffer | int32 | [EP, T, k] (out)   |

    The multicast pointer is accepted for compatibility and ignored (mok uses no multicast).
    """
    buffer = all_gather_top_experts_buffer
    check_tensor("top_experts", top_experts, dtype=torch.int32, shape=(None, None), dims=("T", "k"))
    check_tensor(
        "all_gather_top_experts_buffer",
        buffer,
        dtype=torch.int32,
        shape=(None, *top_experts.shape),
        dims=("EP", "T", "k"),
        device=top_experts.device,
    )
    if not 0 <= rank < buffer.shape[0]:
        raise ValueError(f"`rank` must be in [0, {buffer.shape[0]}), got {rank}")
    check_multiple("chunk_bytes", chunk_bytes, 16)
    if backends.uses_cuda(top_experts.device):
        from mok.backends import cuda_comm

        name = "all_gather_top_experts_buffer"
        workspace = workspace_owning(buffer) or workspace_of_group(group_name, name, buffer)
        cuda_comm.all_gather_top_experts(_owner(workspace, name, buffer), top_experts)
        gathered = getattr(workspace, name)
        if buffer.data_ptr() != gathered.data_ptr():  # a functional copy (torch.compile)
            buffer.copy_(gathered)
        return
    reference.all_gather_top_experts(top_experts, buffer, group_name)


@all_gather_top_experts.register_fake
def _(top_experts, buffer, multicast_ptr, rank, chunk_bytes, group_name=""):
    return None


@custom_op("mok::barrier_all", mutates_args=("barrier_buffer", "target"))
def barrier_all(
    barrier_buffer: torch.Tensor,
    barrier_buffer_ptrs: list[int],
    barrier_buffer_multicast_ptr: int,
    target: torch.Tensor,
    group_name: str = "",
) -> None:
    """Barrier over the EP group; `target` is the epoch counter (int32 [1]), bumped by one."""
    if backends.uses_cuda(barrier_buffer.device):
        from mok.backends import cuda_comm

        workspace = workspace_at(barrier_buffer_ptrs)
        cuda_comm.barrier(_owner(workspace, "barrier_buffer", barrier_buffer))
        return
    dist.barrier(group=reference.resolve_group(group_name))
    target.add_(1)


def _owner(workspace, name: str, buffer: torch.Tensor):
    """The workspace the CUDA kernels run on (they need its peer tables), found for the op's
    `name` argument: that buffer itself, or under torch.compile a functional copy of it."""
    if workspace is None or not same_layout(getattr(workspace, name), buffer):
        raise ValueError(f"on CUDA, `{name}` must be the `{name}` of a mok workspace")
    return workspace


@barrier_all.register_fake
def _(barrier_buffer, barrier_buffer_ptrs, barrier_buffer_multicast_ptr, target, group_name=""):
    return None


def schedule(
    topk_all: torch.Tensor,
    num_local_experts: int,
    schedule_capacity: int,
    rank: int,
    status: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routed-row schedule of destination `rank` (see reference.schedule for the order).

    | output            | dtype | shape |
    |-------------------|-------|-------|
    | peer_rank         | int32 | [C]   |
    | peer_token_idx    | int32 | [C]   |
    | num_tokens        | int32 | [1]   |
    | tokens_per_expert | int32 | [E]   |

    `status` (mok; int32 [1], optional) records a capacity overflow instead of trapping. Without
    it an overflow could not be reported, so `schedule_capacity` must then cover the worst
    case, every route of `topk_all` to this rank (`schedule_worst_case_rows`). The op itself,
    `torch.ops.mok.schedule` (`schedule_op`), takes `status` always: torch's custom ops cannot
    leave out a tensor they write.
    """
    if status is None:
        _check_schedule_args(topk_all, num_local_experts, schedule_capacity)
        worst = schedule_worst_case_rows(topk_all.numel(), num_local_experts)
        if schedule_capacity < worst:
            raise ValueError(
                f"`schedule_capacity` must be at least {worst} without `status` (every one of "
                f"topk_all's {topk_all.numel()} routes to this rank, each of "
                f"{num_local_experts} experts padded to 256 rows), got {schedule_capacity}: "
                "pass `status` (int32 [1]) to have an overflow recorded instead"
            )
        status = torch.zeros(1, dtype=torch.int32, device=topk_all.device)
    return schedule_op(topk_all, num_local_experts, schedule_capacity, rank, status)


def schedule_worst_case_rows(routes: int, num_local_experts: int) -> int:
    """The most rows a schedule of `routes` routes over `num_local_experts` experts can need:
    each expert's segment is padded to a multiple of 256, so at most min(E, routes) segments
    add at most 255 rows each."""
    check_multiple("num_local_experts", num_local_experts, 1)
    padded = routes + 255 * min(num_local_experts, routes)
    return padded // 256 * 256


def _check_schedule_args(topk_all, num_local_experts: int, schedule_capacity: int) -> None:
    check_tensor(
        "topk_all", topk_all, dtype=torch.int32, shape=(None, None, None), dims=("EP", "T", "k")
    )
    if schedule_capacity <= 0 or schedule_capacity % 256:
        raise ValueError(
            f"`schedule_capacity` must be a positive multiple of 256, got {schedule_capacity}"
        )
    check_multiple("num_local_experts", num_local_experts, 1)


@custom_op("mok::schedule", mutates_args=("status",))
def schedule_op(
    topk_all: torch.Tensor,
    num_local_experts: int,
    schedule_capacity: int,
    rank: int,
    status: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`schedule` with its status word (int32 [1]) given."""
    _check_schedule_args(topk_all, num_local_experts, schedule_capacity)
    if backends.uses_cuda(topk_all.device):
        from mok.backends import cuda_schedule

        return cuda_schedule.schedule(topk_all, num_local_experts, schedule_capacity, rank, status)
    return reference.schedule(topk_all, num_local_experts, schedule_capacity, rank, status)


@schedule_op.register_fake
def _(topk_all, num_local_experts, schedule_capacity, rank, status):
    index = topk_all.new_empty((schedule_capacity,))
    return (
        index,
        torch.empty_like(index),
        topk_all.new_empty((1,)),
        topk_all.new_empty((num_local_experts,)),
    )


@custom_op(
    "mok::mxfp8_quantize",
    mutates_args=(),
    schema="(Tensor x_bf16, bool return_normal, bool return_transposed)"
    " -> (Tensor?, Tensor?, Tensor?, Tensor?)",
)
def mxfp8_quantize(x_bf16: torch.Tensor, return_normal: bool, return_transposed: bool):
    """MXFP8 quantization (see mok.mxfp8): (x_fp8, x_sc, x_fp8_t, x_sc_t), unrequested = None."""
    cuda = _cuda_backend(x_bf16)
    if cuda is not None:
        return cuda.mxfp8_quantize(x_bf16, return_normal, return_transposed)
    return mxfp8_format.quantize(x_bf16, return_normal, return_transposed)


@mxfp8_quantize.register_fake
def _(x_bf16, return_normal, return_transposed):
    *batch, rows, cols = x_bf16.shape
    groups = x_bf16.numel() // (rows * cols)

    def layout(r, c):
        data = x_bf16.new_empty((*batch, r, c), dtype=torch.float8_e4m3fn)
        return data, x_bf16.new_empty((groups * r // 128, c // 128, 32, 16), dtype=torch.uint8)

    normal = layout(rows, cols) if return_normal else (None, None)
    transposed = layout(cols, rows) if return_transposed else (None, None)
    return (*normal, *transposed)


def _cuda_backend(tensor: torch.Tensor):
    """The CUDA backend module when it serves this tensor's device (see mok.backends), else None."""
    if not backends.uses_cuda(tensor.device):
        return None
    from mok.backends import cuda

    return cuda


@custom_op("mok::fwd_epilogue", mutates_args=())
def fwd_epilogue(
    y_shared: torch.Tensor | None, combine_buffer: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """out[t] = bf16(y_shared[t] + sum_j w[t, j] * combine_buffer[t * k + j]), fp32, j in order.

    | argument       | dtype | shape          |
    |----------------|-------|----------------|
    | y_shared       | bf16  | [T, H] or None |
    | combine_buffer | bf16  | [T * k, H]     |
    | topk_weights   | fp32  | [T, k]         |
    """
    if backends.uses_cuda(combine_buffer.device):
        from mok.backends import cuda_epilogue

        return cuda_epilogue.fwd_epilogue(y_shared, combine_buffer, topk_weights)
    _validate.check_fwd_epilogue(y_shared, combine_buffer, topk_weights)
    tokens, topk = topk_weights.shape
    routed = combine_buffer.float().reshape(tokens, topk, -1)
    total = torch.zeros_like(routed[:, 0]) if y_shared is None else y_shared.float()
    for slot in range(topk):
        total = total + topk_weights[:, slot, None] * routed[:, slot]
    return total.to(torch.bfloat16)


@fwd_epilogue.register_fake
def _(y_shared, combine_buffer, topk_weights):
    return combine_buffer.new_empty((topk_weights.shape[0], combine_buffer.shape[1]))


@custom_op("mok::bwd_epilogue", mutates_args=())
def bwd_epilogue(
    d_x_shared: torch.Tensor | None, d_x_routed_buffer: torch.Tensor, topk: int | None = None
) -> torch.Tensor:
    """d_x[t] = bf16(d_x_shared[t] + sum_j d_x_routed_buffer[t * k + j]), fp32, j in order.

    `topk` (mok) may be left out when `d_x_shared` is given (k = rows / T, as the original
    infers it); without a shared expert it says how the rows group into tokens."""
    if backends.uses_cuda(d_x_routed_buffer.device):
        from mok.backends import cuda_epilogue

        return cuda_epilogue.bwd_epilogue(d_x_shared, d_x_routed_buffer, topk)
    topk = _validate.check_bwd_epilogue(d_x_shared, d_x_routed_buffer, topk)
    routed = d_x_routed_buffer.float().reshape(-1, topk, d_x_routed_buffer.shape[1])
    total = torch.zeros_like(routed[:, 0]) if d_x_shared is None else d_x_shared.float()
    for slot in range(topk):
        total = total + routed[:, slot]
    return total.to(torch.bfloat16)


@bwd_epilogue.register_fake
def _(d_x_shared, d_x_routed_buffer, topk=None):
    tokens = d_x_routed_buffer.shape[0] // topk if topk else d_x_shared.shape[0]
    return d_x_routed_buffer.new_empty((tokens, d_x_routed_buffer.shape[1]))
