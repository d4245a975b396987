"""The MXFP8 passes' pulls, each in one pass with the roundings of the rows it pulls.

The MXFP8 forward reads the routed rows of x only as their MXFP8 rounding (what a GEMM reads
for their normal layout) and their transposed (fp8, scale) pair (saved for the weight
gradient). `pull_round` gathers the rows from the peers' symmetric buffers and writes those two
outputs directly, so the pulled bf16 rows are never stored and read back: at EP 1 that saves a
write and a read of every routed row, and beyond it the rounding rides on the NVLink loads.
Bit for bit `mxfp8.mxfp8_round(cuda_comm.pull_rows(...), transposed=True, used_rows=num_tokens)`
on the rows below the schedule's `num_tokens` (GPU tests). The backward reads its d_out rows
only as their rounding and, for d_W_down, the rounding in blocks of 32 rows of the rows times
their router weights: `pull_round_rows` writes those two.
"""

from __future__ import annotations

import torch

from mok._arguments import check_tensor
from mok.backends.cuda import comm_operands as operands
from mok.backends.cuda import mxfp8
from mok.backends.cuda.comm import run_pull
from mok.backends.cuda.experimental import f16_rows
from mok.workspace import MoKWorkspace

_TILE = 128


def pull_round(
    ws: MoKWorkspace,
    source_buffer_name: str,
    schedule,
    *,
    sync_before: bool = True,
    sync_after: bool = True,
    num_ctas: int | None = None,
    rebased: bool = False,
    source: torch.Tensor | None = None,
):
    """(values, (data_t, scale_t)) of the rows `pull_rows(ws, source_buffer_name, schedule)`
    would give: `values` bf16 [C, H] their rounded values, `data_t` fp8 [H, C] and `scale_t`
    uint8 [H/128, C/128, 32, 16] their transposed pair. 128-row tiles at or past the schedule's
    `num_tokens` (read on the device) are left unwritten, as nothing reads them.

    C (the schedule's rows) and H must be multiples of 128. `num_ctas` limits the kernel to that
    many CTAs (an exchange in the background); None gives one per 128 x 128 tile. Barriers as
    in `pull_rows`.

    `rebased` (EP 1): `values` is a f16_rows.RebasedRows instead, the same values as f16
    times 2^(127 - R) with R the exponent byte of the source token (f16_rows.row_exponents
    of the source buffer, one more pass over the T local tokens), the MXFP8 GEMM on f16
    operands' input (f16_rows.linear_mx_f16). `source` (EP 1): the caller's rows, read in place
    instead of the buffer (comm_operands.direct_source).
    """
    named, schedule_rows, (rows, cols) = _tiled_pull(ws, source_buffer_name, schedule, num_ctas,
                                                     source)  # fmt: skip
    if rebased and ws.ep_size != 1:
        raise ValueError(f"`rebased` rows need the local source (EP 1), got EP {ws.ep_size}")
    dtype = torch.float16 if rebased else torch.bfloat16
    values = torch.empty((rows, cols), dtype=dtype, device=ws.device)
    data_t, scale_t = mxfp8.mxfp8_layout((cols, rows), ws.device)
    exponents = {}
    if rebased:
        storage = torch.empty(rows + f16_rows.EXPONENT_PADDING, dtype=torch.uint8,
                              device=ws.device)  # fmt: skip
        exponents = {
            "src_exponents": f16_rows.row_exponents(named[1]).data_ptr(),
            "row_exponents": storage.data_ptr(),
        }
    sync = (sync_before, sync_after)
    _run_pull_round(ws, named, schedule_rows, sync, num_ctas, values, out_t=data_t.data_ptr(),
                    scale_t=scale_t.data_ptr(), **exponents)  # fmt: skip
    if rebased:
        values = f16_rows.RebasedRows(values, storage[:rows])
    return values, (data_t, scale_t)


def pull_round_rows(
    ws: MoKWorkspace,
    source_buffer_name: str,
    schedule,
    row_weights: torch.Tensor,
    *,
    sync_before: bool = True,
    sync_after: bool = True,
    num_ctas: int | None = None,
    source: torch.Tensor | None = None,
):
    """The MXFP8 backward's d_out pull and both of its roundings in one pass: (values,
    rounded_rows), bf16 [C, H] each, bit for bit `mxfp8.mxfp8_round(rows, used_rows=num_tokens)`
    and `mxfp8.mxfp8_round_rows(rows, num_tokens, row_scale=row_weights)` of
    `rows = cuda_comm.pull_rows(ws, source_buffer_name, schedule)` on the tiles below the
    schedule's `num_tokens` (the later ones are left unwritten). `row_weights`: fp32 [C], the
    routed rows' router weights (`pull_router_weights`), read on the device, so enqueue it on
    this stream before. Sizes, `num_ctas`, barriers and `source` as in `pull_round`."""
    named, schedule_rows, (rows, cols) = _tiled_pull(ws, source_buffer_name, schedule, num_ctas,
                                                     source)  # fmt: skip
    check_tensor("row_weights", row_weights, dtype=torch.float32, shape=[rows], device=ws.device)
    values = torch.empty((rows, cols), dtype=torch.bfloat16, device=ws.device)
    rounded_rows = torch.empty_like(values)
    sync = (sync_before, sync_after)
    _run_pull_round(ws, named, schedule_rows, sync, num_ctas, values,
                    out_t=0, scale_t=0, rounded_rows=rounded_rows.data_ptr(),
                    row_scale=row_weights.data_ptr())  # fmt: skip
    return values, rounded_rows


def _run_pull_round(ws, named_source, schedule_rows, sync, num_ctas, values, **outputs):
    """One comm_pull_round launch from `named_source` = (buffer name, rows read, their address
    if read in place else 0: `_tiled_pull`) into `values` ([C, H]) and the other `outputs`
    (addresses)."""
    source_buffer_name, source, direct = named_source
    rows, cols = values.shape
    run_pull(
        ws,
        "comm_pull_round",
        source_buffer_name,
        schedule_rows,
        sync,
        rows=rows,
        cols=cols,
        src_rows=source.shape[0],
        divisor=ws.topk,
        rounded=values.data_ptr(),
        ctas=num_ctas or 0,
        src_direct=direct,
        **outputs,
    )


def _tiled_pull(ws: MoKWorkspace, source_buffer_name: str, schedule, num_ctas, direct=None):
    """((name, source, its address if read in place else 0), schedule rows, (C, H)) of a tiled
    pull, its sizes and `num_ctas` checked; the source is the buffer, or `direct` (checked:
    comm_operands.direct_source) where given."""
    source = operands.buffer_named(ws, source_buffer_name, operands.PULL_SOURCES)
    address = operands.direct_source(ws, source_buffer_name, source, direct)
    source = source if direct is None else direct
    schedule_rows = operands.schedule_rows(ws, schedule)
    rows, cols = schedule_rows[0].shape[0], source.shape[1]
    if rows % _TILE or cols % _TILE:
        raise ValueError(
            "pull_round needs schedule rows and hidden size that are multiples of 128, got "
            f"{rows} rows of {cols}"
        )
    if num_ctas is not None and num_ctas < 1:
        raise ValueError(f"`num_ctas` must be >= 1 or None, got {num_ctas}")
    return (source_buffer_name, source, address), schedule_rows, (rows, cols)
