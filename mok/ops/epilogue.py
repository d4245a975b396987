"""The combine epilogues as custom ops: each token's k routed rows summed onto its shared row."""

from __future__ import annotations

import torch
from torch.library import custom_op

from mok import _moe_arguments, backends


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
    _moe_arguments.check_fwd_epilogue(y_shared, combine_buffer, topk_weights)
    backend = backends.for_device(combine_buffer.device)
    return backend.fwd_epilogue(y_shared, combine_buffer, topk_weights)


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
    topk = _moe_arguments.check_bwd_epilogue(d_x_shared, d_x_routed_buffer, topk)
    backend = backends.for_device(d_x_routed_buffer.device)
    return backend.bwd_epilogue(d_x_shared, d_x_routed_buffer, topk)


@bwd_epilogue.register_fake
def _(d_x_shared, d_x_routed_buffer, topk=None):
    tokens = d_x_routed_buffer.shape[0] // topk if topk else d_x_shared.shape[0]
    return d_x_routed_buffer.new_empty((tokens, d_x_routed_buffer.shape[1]))
