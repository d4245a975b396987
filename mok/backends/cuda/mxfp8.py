"""The CUDA backend: thin wrappers that allocate outputs with torch and call the extension.

The extension takes raw device addresses and a cudaStream_t as integers (no torch headers), so
this file owns everything torch-specific: validation, allocation, the device guard and the
current stream. Kernels run asynchronously on `torch.cuda.current_stream(x.device)`.
"""

from __future__ import annotations

import torch

from mok import mxfp8 as mxfp8_format
from mok._arguments import check_tensor
from mok.backends.cuda import extension as _extension


def available(device: torch.device | int | str | None = None) -> bool:
    """True when `device` is a CUDA device this installation has a compiled module for."""
    try:
        return _extension.is_supported(device)
    except (RuntimeError, ValueError, AssertionError):
        return False  # no driver, bad index, ...: the reference backend serves instead


def mxfp8_quantize(
    x: torch.Tensor, return_normal: bool = True, return_transposed: bool = False
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """MXFP8-quantize a CUDA bf16 tensor with the extension kernel; same contract as
    `mok.mxfp8.quantize` (bit-identical results):

    | output    | dtype          | shape                                   |
    |-----------|----------------|-----------------------------------------|
    | `x_fp8`   | float8_e4m3fn  | `[M, N]` / `[E, M, N]`, blocks along N  |
    | `x_sc`    | uint8          | `[E*M/128, N/128, 32, 16]` swizzled     |
    | `x_fp8_t` | float8_e4m3fn  | `[N, M]` / `[E, N, M]`, blocks along M  |
    | `x_sc_t`  | uint8          | `[E*N/128, M/128, 32, 16]` swizzled     |

    `x` is bf16 `[M, N]` or `[E, M, N]` on a CUDA device, M and N multiples of 128. A pair not
    asked for is `(None, None)`. NotImplementedError if no module serves the device.
    """
    mxfp8_format._check_flags(return_normal, return_transposed)
    x_fp8, x_sc, x_fp8_t, x_sc_t, _ = _quantize(x, return_normal, return_transposed, None, None)
    return x_fp8, x_sc, x_fp8_t, x_sc_t


def mxfp8_round(x: torch.Tensor, transposed: bool = False, used_rows: torch.Tensor | None = None):
    """(values, pair_t) in one pass over bf16 `x` [M, N]: `values` bf16 [M, N] are what a GEMM
    reads for x's normal MXFP8 layout, i.e. `mxfp8_dequantize(*mxfp8_quantize(x)[:2])` bit for
    bit without storing that layout; `pair_t` is x's transposed (fp8, scale) pair, or None.

    `used_rows` (int32 [1] on the device, the schedule's `num_tokens`): 128-row tiles at or past
    it are left unwritten in every output, for routed rows, which nothing reads past it.
    """
    *_, data_t, scale_t, values = _quantize(x, False, transposed, "rounded", used_rows)
    return values, ((data_t, scale_t) if transposed else None)


def mxfp8_round_rows(
    x: torch.Tensor, used_rows: torch.Tensor | None = None, row_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """bf16 [M, N]: the values a GEMM reads for x's transposed MXFP8 layout (blocks of 32 rows),
    in x's layout, i.e. `mxfp8_dequantize(*mxfp8_quantize(x, False, True)[2:], transposed=True)`
    bit for bit, in one pass. `used_rows` as in `mxfp8_round`. `row_scale` (fp32 [M], or [E*M]
    for [E, M, N]) rounds bf16(row_scale[r] * x[r]) instead (what `scale_rows` writes), in the
    same pass: the scaled rows are never stored."""
    return _quantize(x, False, False, "rounded_rows", used_rows, row_scale)[-1]


def mxfp8_layout(shape: tuple[int, ...], device: torch.device):
    """An empty (fp8 data, swizzled scales) pair for a [.., R, C] matrix, blocks along C."""
    *batch, rows, cols = shape
    experts = batch[0] if batch else 1
    data = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
    scale = torch.empty(
        (experts * rows // 128, cols // 128, 32, 16), dtype=torch.uint8, device=device
    )
    return data, scale


def _quantize(x, normal: bool, transposed: bool, rounded: str | None, used_rows, row_scale=None):
    """One quantize launch; `rounded` names the bf16 values output wanted ("rounded" or
    "rounded_rows"), returned last; `row_scale` (rounded rows only) scales x's rows first."""
    mxfp8_format._check_matrix("x", x, torch.bfloat16)
    if not x.is_cuda:
        raise ValueError(f"`x` must be on a CUDA device, got {x.device}")
    if used_rows is not None:
        check_tensor("used_rows", used_rows, dtype=torch.int32, shape=[1], device=x.device)
    if row_scale is not None:
        rows = x.numel() // x.shape[-1]
        check_tensor("row_scale", row_scale, dtype=torch.float32, shape=[rows], device=x.device)
    _extension.module_for_device(x.device)  # NotImplementedError before any allocation
    x = _extension.aligned(x)
    *batch, rows, cols = x.shape
    experts = batch[0] if batch else 1
    x_fp8, x_sc = mxfp8_layout(x.shape, x.device) if normal else (None, None)
    t_shape = (*batch, cols, rows)
    x_fp8_t, x_sc_t = mxfp8_layout(t_shape, x.device) if transposed else (None, None)
    values = torch.empty_like(x) if rounded else None
    value_outputs = {"rounded": 0, "rounded_rows": 0}
    if rounded:
        value_outputs[rounded] = values.data_ptr()
    if experts == 0:
        return x_fp8, x_sc, x_fp8_t, x_sc_t, values  # nothing to launch (no valid address)
    _extension.launch(
        x.device,
        "mxfp8_quantize",
        x=x.data_ptr(),
        out=_extension.address(x_fp8),
        scale=_extension.address(x_sc),
        out_t=_extension.address(x_fp8_t),
        scale_t=_extension.address(x_sc_t),
        **value_outputs,
        used_rows=_extension.address(used_rows),
        experts=experts,
        rows=rows,
        cols=cols,
        row_scale=_extension.address(row_scale),
    )
    return x_fp8, x_sc, x_fp8_t, x_sc_t, values


def check_mxfp8_pair(data, scales, names=("data", "scales")) -> None:
    """An MXFP8 pair as mxfp8_quantize writes it, on a CUDA device: `data` float8_e4m3fn
    `[R, C]` / `[E, R, C]` (R, C multiples of 128) with blocks along C, `scales` uint8
    `[E*R/128, C/128, 32, 16]` on the same device; `names` are the two arguments' in errors."""
    data_name, scales_name = names
    mxfp8_format._check_matrix(data_name, data, torch.float8_e4m3fn)
    if not data.is_cuda:
        raise ValueError(f"`{data_name}` must be on a CUDA device, got {data.device}")
    rows, cols = data.numel() // data.shape[-1], data.shape[-1]
    expected = [rows // 128, cols // 128, 32, 16]
    if (
        not isinstance(scales, torch.Tensor)
        or scales.dtype != torch.uint8
        or list(scales.shape) != expected
        or scales.device != data.device
    ):
        got = (f"{scales.dtype} {list(scales.shape)} on {scales.device}"
               if isinstance(scales, torch.Tensor) else type(scales).__name__)  # fmt: skip
        raise ValueError(
            f"`{scales_name}` must be uint8 {expected} on {data.device} for `{data_name}` of "
            f"shape {list(data.shape)}, got {got}"
        )


def mxfp8_dequantize(
    data: torch.Tensor, scales: torch.Tensor, transposed: bool = False
) -> torch.Tensor:
    """bf16 values of an MXFP8 pair as a bf16 GEMM reads them: bf16(data * 2^(scale - 127)),
    i.e. `mok.mxfp8.dequantize(data, scales).to(torch.bfloat16)` bit for bit, in one pass;
    `transposed=True` returns the same values with the last two dims swapped, contiguous.

    `data` float8_e4m3fn `[R, C]` / `[E, R, C]` with blocks along C, `scales` uint8
    `[E*R/128, C/128, 32, 16]` on the same CUDA device.
    """
    check_mxfp8_pair(data, scales)
    rows, cols = data.numel() // data.shape[-1], data.shape[-1]
    data, scales = _extension.aligned(data), _extension.aligned(scales)
    shape = (*data.shape[:-2], data.shape[-1], data.shape[-2]) if transposed else data.shape
    out = torch.empty(shape, dtype=torch.bfloat16, device=data.device)
    if rows == 0:
        return out
    _extension.launch(
        data.device,
        "mxfp8_dequantize",
        data=data.data_ptr(),
        scale=scales.data_ptr(),
        out=out.data_ptr(),
        rows=rows,
        cols=cols,
        transposed=transposed,
        experts=data.shape[0] if data.dim() == 3 else 1,
    )
    return out
