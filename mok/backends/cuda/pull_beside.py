"""The dispatch pull run beside the grouped GEMM that reads its rows (docs/overlap.md): what
CudaEngine.pull_beside hands the GEMM engine, which passes it to grouped_gemm's launch. The
launch enqueues the pull after the GEMM's tables, on the pass's comm SMs, and the GEMM as its
programmatic dependent on every SM (its clusters take tiles on demand, so those that start on the
pull's SMs as it exits take what is left); the pull counts each minibatch's arrival and the
GEMM's producer waits for a tile's rows (csrc/common/arrivals.cuh)."""

from __future__ import annotations

import torch

from mok import settings
from mok.backends.cuda import comm as cuda_comm
from mok.backends.cuda import extension
from mok.workspace import MoKWorkspace


class OverlappedPull:
    """The extension's pull arguments, the arrival counters they point at (kept alive until the
    launch that uses them is enqueued) and the pull's CTAs."""

    __slots__ = ("native", "arrivals", "ctas")

    def __init__(self, native, arrivals: torch.Tensor, ctas: int):
        self.native, self.arrivals, self.ctas = native, arrivals, ctas


def overlapped_pull(
    ws: MoKWorkspace,
    source_buffer_name: str,
    schedule,
    out: torch.Tensor,
    *,
    ctas: int,
    minibatch_rows: int,
    sync_before: bool = True,
    source: torch.Tensor | None = None,
) -> OverlappedPull:
    """`cuda_comm.pull_rows(ws, source_buffer_name, schedule, out, sync_after=False,
    zero_rest=False)` made to run beside the grouped GEMM that reads `out` (grouped_gemm's
    `pull`), counting the arrival of every `minibatch_rows` rows. A CTA copies whole
    minibatches, so it runs on `ctas` CTAs or one a minibatch if there are fewer: a CTA without
    one would only hold an SM the GEMM could use. The barrier before it (`sync_before`) is
    enqueued now; the rows are there once that GEMM has run."""
    buffer, direct, (peer_rank, peer_token_idx, num_tokens) = cuda_comm.pull_operands(
        ws, source_buffer_name, schedule, out, source
    )
    if sync_before:
        cuda_comm.barrier(ws, f"pull {source_buffer_name}")
    rows = peer_rank.shape[0]
    minibatches = max(-(-rows // minibatch_rows), 1)
    ctas = min(ctas, minibatches)
    arrivals = torch.empty(minibatches, dtype=torch.int32, device=ws.device)
    native = extension.module_for_device(ws.device).comm_overlapped_pull(
        src_table=ws.peer_ptr_tables[source_buffer_name].data_ptr(),
        peer_rank=peer_rank.data_ptr(),
        peer_token_idx=peer_token_idx.data_ptr(),
        num_tokens=num_tokens.data_ptr(),
        rows=rows,
        row_bytes=buffer[0].numel() * buffer.element_size(),
        src_rows=buffer.shape[0],
        divisor=ws.topk,
        ep=ws.ep_size,
        ctas=ctas,
        zero_rest=False,
        src_direct=direct,
        arrivals=arrivals.data_ptr(),
        minibatch_rows=minibatch_rows,
        status=ws.status.data_ptr(),
        timeout_ns=settings.comm_timeout_ns(),
    )
    return OverlappedPull(native, arrivals, ctas)
