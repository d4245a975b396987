"""The MXFP8 GEMM on f16 operands rebased per row (Kind.M_GROUPED_MXFP8_NT_F16_ROWS).

Experimental (MOK_MXFP8_F16=1; docs/grouped-gemm.md). Converting E4M3 to bf16 inside the GEMM
costs five instructions a pair, to f16 two. f16 holds every E4M3 value, but not every scaled one
(2^-24 .. 65504), so each operand row is rebased: a row of activations is stored as `values` f16
with one exponent byte R (its values are values * 2^(R - 127)), chosen so that the row's largest
magnitude lands in [2^14, 2^15) (and its MXFP8 rounding at most at 2^15); `rebase_weight`
rebases each weight row alike from its scale bytes, once per weight, and the GEMM multiplies the
sums back. Within a row, values more than ~21 binades under its largest lose their low bits
(f16's subnormals); MXFP8-rounded rows, whose blocks rarely span that much, come out bit for bit
as M_GROUPED_MXFP8_NT's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mok import mxfp8 as mxfp8_format
from mok._arguments import check_tensor
from mok.backends.cuda import extension, grouped_gemm

# Bytes the GEMM may read past the last row's exponent (aligned 272-byte windows per tile).
EXPONENT_PADDING = 272


class RebasedRows(NamedTuple):
    """Rows [R, K] as f16 `values` and uint8 `exponents` [R]: row r is values[r] * 2^(e_r - 127)."""

    values: torch.Tensor
    exponents: torch.Tensor


def row_exponents(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [R]: each row's exponent byte for bf16 x [R, K] (K a multiple of 8), one kernel
    pass: the biased exponent of the row's largest magnitude minus 14, at least 0, so that
    x * 2^(127 - R) puts that magnitude in [2^14, 2^15) (zero rows: 0), and the MXFP8 rounding
    of the row, which can round it up a binade, at most at 2^15. `out`: where to write."""
    check_tensor("x", x, dtype=torch.bfloat16, shape=[None, None], dims=["R", "K"],
                 device=x.device)  # fmt: skip
    if x.shape[1] % 8:
        raise ValueError(f"`x` needs K a multiple of 8, got {x.shape[1]}")
    if out is None:
        out = torch.empty(x.shape[0], dtype=torch.uint8, device=x.device)
    check_tensor("out", out, dtype=torch.uint8, shape=[x.shape[0]], dims=["R"], device=x.device)
    extension.launch(x.device, "mxfp8_row_exponents", x=extension.aligned(x).data_ptr(),
                      out=out.data_ptr(), rows=x.shape[0], cols=x.shape[1])  # fmt: skip
    return out


def rebase_rows(x: torch.Tensor) -> RebasedRows:
    """bf16 x [R, K] as RebasedRows (exponents by `row_exponents`, with the padding
    M_GROUPED_MXFP8_NT_F16_ROWS reads past them); exact for rows whose nonzero magnitudes are at
    least 2^-31 of the row's largest (scaled, their 8 bits stay above f16's subnormal spacing
    2^-24): every MXFP8-rounded row whose blocks' scales span at most ~21 binades."""
    storage = torch.empty(x.shape[0] + EXPONENT_PADDING, dtype=torch.uint8, device=x.device)
    exponents = row_exponents(x, storage[: x.shape[0]])
    scale = torch.exp2(127 - exponents.float())[:, None]
    return RebasedRows((x.float() * scale).half(), exponents)


def padded_exponents(exponents: torch.Tensor) -> torch.Tensor:
    """`exponents` if M_GROUPED_MXFP8_NT_F16_ROWS may read EXPONENT_PADDING bytes past them (16-byte
    aligned, contiguous, with that much of their storage left: rebase_rows's and pull_round's),
    else a padded copy."""
    spare = exponents.untyped_storage().nbytes() - exponents.storage_offset() - exponents.numel()
    if exponents.is_contiguous() and exponents.data_ptr() % 16 == 0 and spare >= EXPONENT_PADDING:
        return exponents
    padded = exponents.new_zeros(exponents.shape[0] + EXPONENT_PADDING)
    padded[: exponents.shape[0]] = exponents
    return padded


class RebasedWeight(NamedTuple):
    """An MXFP8 weight as M_GROUPED_MXFP8_NT_F16_ROWS reads it: `data` float8_e4m3fn [E, N, K] as
    stored, `factors` int16 (f16 bits) in the scale tiles' layout [E*N/128, K/128, 32, 16], each
    block's 2^(E - R) for scale byte E of a row with exponent byte R, and `row_exponents` uint8
    [E*N]."""

    data: torch.Tensor
    factors: torch.Tensor
    row_exponents: torch.Tensor


def rebase_weight(weight) -> RebasedWeight:
    """An MXFP8 (data, scales) pair as mxfp8_quantize writes it, prepared for `linear_mx_f16`
    by one kernel that reads its scale bytes twice and none of its data: each row's exponent
    byte is its largest scale byte minus 7 (448 * 2^7 < 65504; E8M0's NaN byte 255 left out, at
    least 0), each block's factor 2^(E - R) in f16 (0 below 2^-24: blocks more than 24 binades
    under their row's largest; NaN for scale byte 255)."""
    data, scales = grouped_gemm.MxWeight(*weight)
    mxfp8_format._check_matrix("weight.data", data, torch.float8_e4m3fn)
    rows, cols = data.numel() // data.shape[-1], data.shape[-1]
    check_tensor("weight.scales", scales, dtype=torch.uint8,
                 shape=[rows // 128, cols // 128, 32, 16], dims=["E*N/128", "K/128", "32", "16"],
                 device=data.device)  # fmt: skip
    factors = torch.empty(scales.shape, dtype=torch.int16, device=data.device)
    row_exponents = torch.empty(rows, dtype=torch.uint8, device=data.device)
    extension.launch(
        data.device,
        "mxfp8_rebase_weight",
        scale=extension.aligned(scales).data_ptr(),
        factors=factors.data_ptr(),
        row_exponents=row_exponents.data_ptr(),
        rows=rows,
        cols=cols,
    )
    return RebasedWeight(extension.aligned(data), factors, row_exponents)


def linear_mx_f16(
    a: RebasedRows, weights, rows: torch.Tensor, row_source=None, zero_rest: bool = True
) -> list[torch.Tensor]:
    """`grouped_gemm.linear_mx` on rebased rows: a.values f16 [R, K] with a.exponents uint8 [R],
    each weight a RebasedWeight (`rebase_weight`) of an [E, N, K] MXFP8 weight -> bf16 [R, N]
    per weight, bit for bit linear_mx's output when both operands' rows are exact in f16."""
    values, exponents = a
    check_tensor("a.values", values, dtype=torch.float16, shape=[None, None], dims=["R", "K"],
                 device=values.device)  # fmt: skip
    check_tensor("a.exponents", exponents, dtype=torch.uint8, shape=[values.shape[0]],
                 dims=["R"], device=values.device)  # fmt: skip
    weights = [_rebased(f"weights[{i}]", w) for i, w in enumerate(weights)]
    pairs = [(w.data, w.factors) for w in weights]
    data, factors = grouped_gemm.mx_weight_operands(values, pairs, rows, scale_dtype=torch.int16)
    for i, w in enumerate(weights):
        check_tensor(f"weights[{i}].row_exponents", w.row_exponents, dtype=torch.uint8,
                     shape=[w.data.shape[0] * w.data.shape[1]], dims=["E*N"],
                     device=values.device)  # fmt: skip
    padded = padded_exponents(exponents)
    return grouped_gemm._linear(
        grouped_gemm.Kind.M_GROUPED_MXFP8_NT_F16_ROWS, extension.aligned(values), data, rows,
        row_source,
        zero_rest, factors, exponents=(padded, [w.row_exponents for w in weights]),
    )  # fmt: skip


def _rebased(name: str, weight) -> RebasedWeight:
    if not isinstance(weight, RebasedWeight):
        raise TypeError(f"`{name}` must be a RebasedWeight (rebase_weight), got {type(weight)}")
    return weight
