"""The combine epilogues on CUDA: each token's output from its k routed rows (weighted by the
router in the forward) plus the shared expert's row, fp32 sums in slot order, bit for bit the
arithmetic of `mok.ops.fwd_epilogue` / `bwd_epilogue` (kernel: csrc/epilogue.cu)."""

from __future__ import annotations

import torch

from mok import _extension
from mok._checks import check_dtype_device


def _epilogue(shared, routed, weights, topk: int) -> torch.Tensor:
    check_dtype_device("routed", routed, torch.bfloat16, routed.device)
    if routed.dim() != 2 or routed.shape[0] % topk or routed.shape[1] % 8:
        raise ValueError(
            f"the routed buffer must be bf16 [T * {topk}, H] with H a multiple of 8, "
            f"got {list(routed.shape)}"
        )
    tokens, hidden = routed.shape[0] // topk, routed.shape[1]
    if shared is not None:
        check_dtype_device("shared", shared, torch.bfloat16, routed.device)
        if tuple(shared.shape) != (tokens, hidden):
            raise ValueError(
                f"the shared output must be bf16 {[tokens, hidden]}, got {list(shared.shape)}"
            )
    if weights is not None:
        check_dtype_device("topk_weights", weights, torch.float32, routed.device)
        if tuple(weights.shape) != (tokens, topk):
            raise ValueError(
                f"`topk_weights` must be fp32 {[tokens, topk]}, got {list(weights.shape)}"
            )
    out = torch.empty((tokens, hidden), dtype=torch.bfloat16, device=routed.device)
    if out.numel() == 0:
        return out
    # Hold the (possibly copied) inputs until the launch is enqueued.
    shared = None if shared is None else _extension.aligned(shared)
    weights = None if weights is None else weights.contiguous()
    routed = _extension.aligned(routed)
    _extension.launch(
        routed.device,
        "comm_epilogue",
        shared=0 if shared is None else shared.data_ptr(),
        routed=routed.data_ptr(),
        weights=0 if weights is None else weights.data_ptr(),
        out=out.data_ptr(),
        tokens=tokens,
        hidden=hidden,
        topk=topk,
    )
    return out


def fwd_epilogue(
    y_shared: torch.Tensor | None, combine_buffer: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """out[t] = bf16(y_shared[t] + sum_j w[t, j] * combine_buffer[t * k + j]), fp32, j in order
    (bit for bit `mok.ops.fwd_epilogue`'s reference arithmetic).

    | argument       | dtype | shape          |
    |----------------|-------|----------------|
    | y_shared       | bf16  | [T, H] or None |
    | combine_buffer | bf16  | [T * k, H]     |
    | topk_weights   | fp32  | [T, k]         |
    | output         | bf16  | [T, H]         |
    """
    if topk_weights.dim() != 2:
        raise ValueError(f"`topk_weights` must be fp32 [T, k], got {list(topk_weights.shape)}")
    return _epilogue(y_shared, combine_buffer, topk_weights, topk_weights.shape[1])


def bwd_epilogue(
    d_x_shared: torch.Tensor | None, d_x_routed_buffer: torch.Tensor, topk: int
) -> torch.Tensor:
    """d_x[t] = bf16(d_x_shared[t] + sum_j d_x_routed_buffer[t * k + j]), fp32, j in order
    (bit for bit `mok.ops.bwd_epilogue`'s reference arithmetic). Shapes as `fwd_epilogue`."""
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f"`topk` must be a positive int, got {topk!r}")
    return _epilogue(d_x_shared, d_x_routed_buffer, None, topk)
