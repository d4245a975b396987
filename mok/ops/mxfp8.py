"""MXFP8 quantization as a custom op (the format and its reference: mok.mxfp8)."""

from __future__ import annotations

import torch
from torch.library import custom_op

from mok import backends


@custom_op(
    "mok::mxfp8_quantize",
    mutates_args=(),
    schema="(Tensor x_bf16, bool return_normal, bool return_transposed)"
    " -> (Tensor?, Tensor?, Tensor?, Tensor?)",
)
def mxfp8_quantize(x_bf16: torch.Tensor, return_normal: bool, return_transposed: bool):
    """MXFP8 quantization (see mok.mxfp8): (x_fp8, x_sc, x_fp8_t, x_sc_t), unrequested = None."""
    backend = backends.for_device(x_bf16.device)
    return backend.mxfp8_quantize(x_bf16, return_normal, return_transposed)


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
