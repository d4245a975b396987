"""Experimental (MOK_SWIGLU_EPILOGUE=1): the BF16 gate/up GEMM with SwiGLU in its epilogue
(Kind.M_GROUPED_BF16_NT_SWIGLU). The same bits as the GEMM followed by the SwiGLU kernel, but
slower on every GPU measured: the epilogue's arithmetic runs while the tensor cores idle
(docs/grouped-gemm.md)."""

from __future__ import annotations

import math

import torch

from mok.backends.cuda import grouped_gemm

# The variant's tiles put 128 gate columns beside the same 128 up columns.
SWIGLU_TILE_COLUMNS = 128


def linear_swiglu(
    a: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    rows: torch.Tensor,
    limit: float | None = None,
    row_source=None,
    zero_rest: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward's gate and up GEMMs with SwiGLU in their epilogue, one launch: (gate, up,
    hidden) bf16 [R, N] each for w_gate, w_up [E, N, K], N a multiple of 128. The bits of
    `linear(a, [w_gate, w_up], ...)` followed by mok's `swiglu(gate, up, limit)`: hidden is
    silu(min(gate, L)) * clamp(up, -L, L) of the bf16 gate and up. Rows as in `linear`."""
    experts = grouped_gemm._experts(rows, a)
    n = w_gate.shape[1] if w_gate.dim() == 3 else None
    for name, w in (("w_gate", w_gate), ("w_up", w_up)):
        grouped_gemm._shaped(name, w, [experts, n, a.shape[1]], "E N K", a.device)
    if n % SWIGLU_TILE_COLUMNS:
        raise ValueError(f"linear_swiglu needs N a multiple of {SWIGLU_TILE_COLUMNS}, got N={n}")
    if limit is not None and not (math.isfinite(limit) and limit >= 0):
        raise ValueError(f"`limit` must be None or finite and >= 0, got {limit}")
    a = grouped_gemm._bf16(a)
    gate, up, hidden = (a.new_empty((a.shape[0], n)) for _ in range(3))
    sets = [(a, grouped_gemm._bf16(w_gate), gate), (a, grouped_gemm._bf16(w_up), up)]
    total_rows = a.shape[0] if zero_rest else 0
    kind = grouped_gemm.Kind.M_GROUPED_BF16_NT_SWIGLU
    grouped_gemm._launch(kind, sets, rows, n, a.shape[1], total_rows, row_source, hidden=hidden,
                         limit=limit)  # fmt: skip
    return gate, up, hidden
