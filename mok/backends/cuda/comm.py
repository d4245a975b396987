"""NVLink communication on CUDA: barrier, routing all-gather, dispatch pull and combine push (the
combine epilogues that follow are mok.backends.cuda.epilogue's). Same semantics as
mok.backends.reference, bit for bit.

Data moves through the peer pointers of the workspace's symmetric buffers
(`MoKWorkspace.peer_ptr_tables`); no multicast, no host sync, no allocation but the outputs, so
every function is capturable in a CUDA graph. All run on `torch.cuda.current_stream()`.

Synchronisation. `barrier(ws)` is a device-side barrier: each rank stores `epoch + 1` into its
slot of every peer's `barrier_buffer` (release, system scope), waits until every peer's store has
reached its own (acquire), and keeps the epoch in `ws.barrier_target`. One epoch counter serves
every op of the workspace, and all ranks run the same sequence of barriers, so flags are never
cleared. A wait gives up after MOK_COMM_TIMEOUT_S seconds (mok.settings; default 5) and sets
`mok.status.TIMEOUT` in `ws.status` instead of hanging. Every rank must call the functions below
in the same order with the same `sync_*` choices, and one workspace serves one stream at a time;
each barrier carries a tag naming what it separates ("pull x_buffer", ...), and a rank whose
peer reached the same barrier under another tag records `mok.status.OUT_OF_STEP`. A barrier also
ORs every peer's status word into each rank's, so what one rank recorded before it is every
rank's verdict after it.

By default every op is safe on its own, whatever ran before or runs after it:

| op                      | sequence                                                          |
|-------------------------|-------------------------------------------------------------------|
| all_gather_top_experts  | barrier, store into every rank's buffer, barrier                  |
| pull_rows / _router_w.  | barrier (sources written), pull, barrier (sources free to reuse)  |
| push_rows               | zero own unpushed rows, barrier, push, barrier (rows arrived)     |

A caller that already has a barrier in the right place (e.g. one pass that pushes right after it
pulled) may drop the redundant one with `sync_before=False` / `sync_after=False`; the table says
what each barrier protects. Routes that nobody pushes (invalid expert ids, capacity overflow) read
as zero because each rank zeroes them in its own destination buffer before the barrier that
precedes the pushes (`zero_fill=True`, `zero_destination`); a caller that passes
`zero_fill=False` must have zeroed them before an earlier barrier.
"""

from __future__ import annotations

import math
import zlib

import torch

from mok import settings
from mok import status as device_status
from mok.backends.cuda import comm_operands as operands
from mok.backends.cuda import extension as _extension
from mok.workspace import Buffer, MoKWorkspace


def _run(ws: MoKWorkspace, kernel: str, **arguments) -> None:
    """Call the extension's `kernel` on the workspace device's current stream."""
    if ws.device.type != "cuda" or not ws.peer_ptr_tables:
        raise ValueError(
            f"the CUDA comm kernels need a workspace created on a CUDA device, got {ws.device}"
        )
    _extension.launch(ws.device, kernel, **arguments)


def _default_ctas(device: torch.device) -> int:
    """One CTA of 512 threads per SM: standalone copies own the GPU (DESIGN.md section 5 measures
    8-16 CTAs saturating NVLink at EP=2; local rows and zero rows go at HBM speed)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def zero_destination(ws: MoKWorkspace, name: str, routes: torch.Tensor | None = None):
    """Zero the rows of this rank's push destination `name` (one of the combine buffers) that
    no rank will push, and return it; they read as zero once a barrier has followed (see
    `push_rows`). With the schedule's `routes` (this rank's int32 routing, given when the
    capacity rules out dropped routes: MoKSchedule.unpushed_routes) those are the rows of this
    rank's invalid expert ids; without them every row is zeroed (docs/exchanges.md)."""
    dest = operands.buffer_named(ws, name, operands.PUSH_DESTINATIONS)
    if routes is None:
        dest.zero_()
        return dest
    _run(ws, "comm_zero_unrouted", routing=routes.data_ptr(), dest=dest.data_ptr(),
         slots=routes.numel(), row_bytes=dest.nbytes // routes.numel(),
         ctas=_default_ctas(ws.device))  # fmt: skip
    return dest


def barrier(ws: MoKWorkspace, label: str = "") -> None:
    """Device-side barrier over the workspace's group (no-op at EP=1). `label` names what it
    separates: a peer that reaches the same barrier under another label ran other code, and
    the status word records OUT_OF_STEP ("" checks nothing: the original's barrier_all)."""
    if ws.ep_size == 1:
        return
    tag = (zlib.crc32(label.encode()) | 1) if label else 0
    if ws.host_group is not None:  # ranks that are threads of one process launch in step
        ws.host_group.lockstep(lambda: _launch_barrier(ws, tag))
    else:
        _launch_barrier(ws, tag)


def _launch_barrier(ws: MoKWorkspace, tag: int) -> None:
    _run(
        ws,
        "comm_barrier",
        flag_table=ws.peer_ptr_tables["barrier_buffer"].data_ptr(),
        flags=ws.barrier_buffer.data_ptr(),
        epoch=ws.barrier_target.data_ptr(),
        status=ws.status.data_ptr(),
        rank=ws.ep_rank,
        ep=ws.ep_size,
        timeout_ns=settings.comm_timeout_ns(),
        tag=tag,
    )


def all_gather_top_experts(
    ws: MoKWorkspace, top_experts: torch.Tensor, *, sync_before: bool = True, chunk_bytes: int = 0
) -> torch.Tensor:
    """Every rank's routing, in rank order: returns `ws.all_gather_top_experts_buffer`
    (int32 [EP, T, k]), complete in stream order on every rank.

    | argument    | dtype | shape  |
    |-------------|-------|--------|
    | top_experts | int32 | [T, k] |

    `sync_before=False` skips the barrier that keeps this rank from overwriting a peer's buffer
    while the peer still reads the previous all-gather. Each CTA copies `chunk_bytes` at a time
    (MoKConfig.all_gather_top_experts_chunk_bytes; 0: 32 KiB), at most 64 CTAs a peer.
    """
    operands.check_operand("top_experts", top_experts, torch.int32, ws.device)
    shape = (ws.num_local_tokens, ws.topk)
    if tuple(top_experts.shape) != shape:
        raise ValueError(
            f"`top_experts` must be int32 {list(shape)}, got {list(top_experts.shape)}"
        )
    src = _extension.aligned(top_experts)
    if sync_before:
        barrier(ws, "routing gather")
    table = ws.peer_ptr_tables["all_gather_top_experts_buffer"].data_ptr()
    _run(ws, "comm_all_gather", src=src.data_ptr(), dst_table=table, bytes=src.numel() * 4,
         rank=ws.ep_rank, ep=ws.ep_size, chunk_bytes=chunk_bytes)  # fmt: skip
    barrier(ws, "routing gathered")
    return ws.all_gather_top_experts_buffer


def combine_status(ws: MoKWorkspace, num_local_experts: int) -> None:
    """OR every rank's status word into each rank's, and flag ranks that passed another
    num_local_experts (mok.status.combine): this rank's (status, num_local_experts) goes into
    row `rank` of every peer's `status_gather_buffer`, then one barrier. No barrier is needed
    before the stores: a peer read its rows of the previous step before the routing all-gather's
    barriers, which every rank passes before it gets here again. Nothing at EP 1, nor in a
    workspace built with the original's fields alone (no gather buffer)."""
    if ws.ep_size == 1 or ws.status_gather_buffer is None:
        return
    mine = device_status.word(ws.status, num_local_experts)
    _run(
        ws,
        "comm_all_gather",
        src=mine.data_ptr(),
        dst_table=ws.peer_ptr_tables["status_gather_buffer"].data_ptr(),
        bytes=mine.nbytes,
        rank=ws.ep_rank,
        ep=ws.ep_size,
    )
    barrier(ws, "status gathered")
    device_status.combine(ws.status, ws.status_gather_buffer, num_local_experts)


def _pull(ws, name, source, schedule, out, divisor, sync, num_ctas, zero_rest, src_direct=0):
    """The checks of a pull (`pull_rows`, `pull_router_weights`), then `launch_pull`."""
    schedule_rows = operands.schedule_rows(ws, schedule)
    if out is None:
        out = source.new_empty((schedule_rows[0].shape[0], *source.shape[1:]))
    operands.check_out(ws, name, out, source, schedule_rows[0].shape[0])
    return launch_pull(ws, name, source, schedule_rows, out, divisor, sync, num_ctas, zero_rest,
                       src_direct)  # fmt: skip


def launch_pull(ws, name, source, schedule_rows, out, divisor, sync, num_ctas, zero_rest,
                src_direct=0):  # fmt: skip
    """A pull of `source`'s rows (buffer `name`, or the caller's rows at `src_direct`) into
    `out` by (peer_rank, peer_token_idx, num_tokens), on operands already checked: by `_pull`,
    or by the entry whose arguments the engine passes on (docs/compat-edge.md)."""
    run_pull(
        ws,
        "comm_pull_rows",
        name,
        schedule_rows,
        sync,
        out=out.data_ptr(),
        rows=out.shape[0],
        row_bytes=math.prod(source.shape[1:]) * source.element_size(),
        src_rows=source.shape[0],
        divisor=divisor,
        ctas=num_ctas or _default_ctas(ws.device),
        zero_rest=zero_rest,
        src_direct=src_direct,
    )
    return out


def run_pull(ws, kernel: str, name: str, schedule_rows, sync, **arguments) -> None:
    """Runs a kernel that reads the peers' `name` buffers by the schedule rows (peer_rank,
    peer_token_idx, num_tokens) between the barriers `sync` = (before, after) asks for; the
    peer table, the schedule and the group size are passed along with `arguments`."""
    peer_rank, peer_token_idx, num_tokens = schedule_rows
    sync_before, sync_after = sync
    if sync_before:
        barrier(ws, f"pull {name}")
    _run(
        ws,
        kernel,
        src_table=ws.peer_ptr_tables[name].data_ptr(),
        peer_rank=peer_rank.data_ptr(),
        peer_token_idx=peer_token_idx.data_ptr(),
        num_tokens=num_tokens.data_ptr(),
        ep=ws.ep_size,
        **arguments,
    )
    if sync_after:
        barrier(ws, f"pulled {name}")


def pull_rows(
    ws: MoKWorkspace,
    source_buffer_name: str,
    schedule,
    out: torch.Tensor | None = None,
    *,
    sync_before: bool = True,
    sync_after: bool = True,
    num_ctas: int | None = None,
    zero_rest: bool = True,
    source: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dispatch: out[i] = rank peer_rank[i]'s `source[peer_token_idx[i] // topk]`; zero on
    padding rows (peer_rank < 0) and on rows at or past num_tokens (read on the device), or,
    when not `zero_rest`, those rows left as they are (for buffers nothing reads past there).
    `source` (EP 1): the caller's rows, read in place instead of the buffer (`direct_source`).

    | argument            | dtype       | shape                                   |
    |---------------------|-------------|-----------------------------------------|
    | source_buffer_name  | -           | "x_buffer" or "d_y_buffer" (bf16 [T, H]) |
    | schedule            | int32       | MoKSchedule (or its tuple), C rows      |
    | out (optional)      | bf16        | [C, H], allocated when None             |

    `sync_before` waits until every rank has written its source buffer; `sync_after` keeps the
    sources from being overwritten while a peer still pulls from them.
    """
    buffer = operands.buffer_named(ws, source_buffer_name, operands.PULL_SOURCES)
    sync = (sync_before, sync_after)
    direct = operands.direct_source(ws, source_buffer_name, buffer, source)
    return _pull(ws, source_buffer_name, buffer, schedule, out, ws.topk, sync, num_ctas,
                 zero_rest, direct)  # fmt: skip


def pull_operands(ws: MoKWorkspace, name: str, schedule, out: torch.Tensor, source=None):
    """(buffer `name`, its in-place address or 0, the schedule rows) of a pull into `out`."""
    buffer = operands.buffer_named(ws, name, operands.PULL_SOURCES)
    schedule_rows = operands.schedule_rows(ws, schedule)
    operands.check_out(ws, name, out, buffer, schedule_rows[0].shape[0])
    return buffer, operands.direct_source(ws, name, buffer, source), schedule_rows


def pull_router_weights(
    ws: MoKWorkspace,
    schedule,
    out: torch.Tensor | None = None,
    *,
    sync_before: bool = True,
    sync_after: bool = True,
    num_ctas: int | None = None,
    zero_rest: bool = True,
    source: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reverse-combine helper: out[i] = rank peer_rank[i]'s `router_weight_buffer` at flat index
    peer_token_idx[i] (fp32 [C]); 0 on padding rows. Barriers, `zero_rest` and `source` (EP 1:
    the caller's fp32 [T, k] router weights, read in place) as in `pull_rows`."""
    buffer = ws.router_weight_buffer
    direct = operands.direct_source(ws, Buffer.ROUTER_WEIGHT, buffer, source)
    sync = (sync_before, sync_after)
    return _pull(ws, Buffer.ROUTER_WEIGHT, buffer.view(-1), schedule, out, 1, sync, num_ctas,
                 zero_rest, direct)  # fmt: skip


def push_rows(
    ws: MoKWorkspace,
    rows: torch.Tensor,
    schedule,
    dest_buffer_name: str,
    *,
    zero_fill: bool = True,
    sync_before: bool = True,
    sync_after: bool = True,
    num_ctas: int | None = None,
) -> None:
    """Combine: row i goes to `dest[peer_token_idx[i]]` on rank peer_rank[i]; on return (in
    stream order, with `sync_after`) this rank's destination holds every route's row, and zero
    for the routes nobody pushed.

    | argument         | dtype | shape                                          |
    |------------------|-------|------------------------------------------------|
    | rows             | bf16  | [C, H] for combine_buffer / d_x_routed_buffer  |
    |                  | fp32  | [C] for d_router_weight_buffer (viewed [T*k])  |
    | dest_buffer_name | -     | one of the three buffers above ([T*k] rows)    |

    `zero_fill` zeroes this rank's destination before the barrier that precedes the pushes
    (needs `sync_before`); `sync_after` waits until every rank's rows have arrived.
    """
    if zero_fill and not sync_before:
        raise ValueError("`zero_fill=True` needs `sync_before=True`: the zeros must land first")
    dest = operands.buffer_named(ws, dest_buffer_name, operands.PUSH_DESTINATIONS)
    peer_rank, peer_token_idx, num_tokens = operands.schedule_rows(ws, schedule)
    operands.check_operand("rows", rows, dest.dtype, ws.device)
    slots = ws.num_local_tokens * ws.topk
    row_elems = dest.numel() // slots
    expected = (peer_rank.shape[0], *([row_elems] if rows.dim() == 2 else []))
    if tuple(rows.shape) != expected or (rows.dim() == 1 and row_elems != 1):
        raise ValueError(
            f"`rows` must be {dest.dtype} [C, {row_elems}] (or [C] for 1-element rows) with "
            f"C = {peer_rank.shape[0]} schedule rows for `{dest_buffer_name}`, "
            f"got {list(rows.shape)}"
        )
    rows = _extension.aligned(rows)
    if zero_fill:
        unpushed = schedule.unpushed_routes() if hasattr(schedule, "unpushed_routes") else None
        zero_destination(ws, dest_buffer_name, unpushed)
    if sync_before:
        barrier(ws, f"push {dest_buffer_name}")
    _run(
        ws,
        "comm_push_rows",
        rows_data=rows.data_ptr(),
        dst_table=ws.peer_ptr_tables[dest_buffer_name].data_ptr(),
        peer_rank=peer_rank.data_ptr(),
        peer_token_idx=peer_token_idx.data_ptr(),
        num_tokens=num_tokens.data_ptr(),
        rows=peer_rank.shape[0],
        row_bytes=row_elems * dest.element_size(),
        dst_rows=slots,
        ep=ws.ep_size,
        ctas=num_ctas or _default_ctas(ws.device),
    )
    if sync_after:
        barrier(ws, f"pushed {dest_buffer_name}")
