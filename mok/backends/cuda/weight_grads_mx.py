"""The MXFP8 backward's weight gradients on activations read as stored (grouped GEMM
K_GROUPED_MXFP8_TN).

The MXFP8 forward saves x and hidden as transposed (fp8, scale) pairs, blocks of 32 rows, as
`cuda.mxfp8_round(..., transposed=True)` writes them; a weight gradient d_out[seg]^T @ x[seg]
reads x's pair directly (E4M3 converted exactly to bf16 in the GEMM's mainloop, as the forward's
GEMMs read the weights) instead of a bf16 copy dequantized first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mok._arguments import check_tensor
from mok.backends.cuda import extension, grouped_gemm


class MxRowsT(NamedTuple):
    """An activation a [R, K] as its transposed MXFP8 pair (blocks of 32 rows along R), for
    `weight_grads_mx`."""

    data: torch.Tensor  # float8_e4m3fn [K, R]
    scales: torch.Tensor  # uint8 [K/128, R/128, 32, 16]


def weight_grads_mx(pairs, rows: torch.Tensor, row_source=None) -> list[torch.Tensor]:
    """`grouped_gemm.weight_grads` with each pair's a given as MxRowsT and read as stored:
    d_out[seg]^T @ a[seg] per expert for (d_out [R, N], MxRowsT of a) pairs of one shape (one
    launch) -> bf16 [E, N, K] each, the products of d_out and the pair's mxfp8_dequantize
    values summed in fp32 over each segment's rows in order. N, K and R must be multiples of
    128 and every segment start at a multiple of 128 rows (the schedule pads segments to 256;
    an expert whose segment does not gets NaN). Experts without rows get exact zeros; the
    padding rows `row_source` marks are left out of the sums."""
    grouped_gemm._check_sets("pairs", pairs)
    first = pairs[0][0]
    grouped_gemm._experts(rows, first, "pairs[0][0] (d_out)")
    total, n_out = first.shape
    data0 = pairs[0][1][0]
    k_in = data0.shape[0] if isinstance(data0, torch.Tensor) and data0.dim() == 2 else None
    for i, (d_out, (data, scales)) in enumerate(pairs):
        grouped_gemm._shaped(f"pairs[{i}][0] (d_out)", d_out, [total, n_out], "R N", first.device)
        check_tensor(f"pairs[{i}][1][0] (data)", data, dtype=torch.float8_e4m3fn,
                     shape=[k_in, total], dims=["K", "R"], device=first.device)  # fmt: skip
        if n_out % 128 or k_in % 128 or total % 128:
            raise ValueError(
                f"MXFP8 weight gradients need N, K and R multiples of 128, got N={n_out}, "
                f"K={k_in}, R={total}"
            )
        check_tensor(f"pairs[{i}][1][1] (scales)", scales, dtype=torch.uint8,
                     shape=[k_in // 128, total // 128, 32, 16],
                     dims=["K/128", "R/128", "32", "16"], device=first.device)  # fmt: skip
    d_outs = [grouped_gemm._bf16(d_out) for d_out, _ in pairs]
    outs = [d_outs[0].new_empty((rows.shape[0], n_out, k_in)) for _ in pairs]
    sets = [(d_out, extension.aligned(pair[0]), out)
            for d_out, (_, pair), out in zip(d_outs, pairs, outs, strict=True)]  # fmt: skip
    scales = [extension.aligned(pair[1]) for _, pair in pairs]
    kind = grouped_gemm.Kind.K_GROUPED_MXFP8_TN
    grouped_gemm._launch(kind, sets, rows, k_in, n_out, total, row_source,
                      scales)  # fmt: skip
    return outs
