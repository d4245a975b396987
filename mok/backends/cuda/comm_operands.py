"""The checks of the operands the CUDA comm wrappers (mok.backends.cuda.comm, mxfp8_pulls,
pull_beside) turn into raw addresses: what a test or a benchmark that calls them directly gets
told instead of a device fault. The engine, whose operands come from checked entries, launches
without them (docs/compat-edge.md)."""

from __future__ import annotations

import torch

from mok.backends.cuda import extension as _extension
from mok.workspace import Buffer, MoKWorkspace

PULL_SOURCES = (Buffer.X, Buffer.D_Y)  # [T, H] buffers whose rows are tokens
PUSH_DESTINATIONS = (Buffer.COMBINE, Buffer.D_X_ROUTED, Buffer.D_ROUTER_WEIGHT)


def check_operand(name: str, tensor: torch.Tensor, dtype: torch.dtype, device) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != dtype:
        raise TypeError(f"`{name}` must be {dtype}, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"`{name}` must be on {device}, got {tensor.device}")


def schedule_rows(ws: MoKWorkspace, schedule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(peer_rank, peer_token_idx, num_tokens) of a MoKSchedule or its 4-tuple, checked."""
    parts = schedule.as_tuple() if hasattr(schedule, "as_tuple") else tuple(schedule)
    if len(parts) != 4:
        raise TypeError("`schedule` must be a MoKSchedule or its 4-tuple of tensors")
    peer_rank, peer_token_idx, num_tokens, _ = parts
    for name, t in (("peer_rank", peer_rank), ("peer_token_idx", peer_token_idx)):
        check_operand(name, t, torch.int32, ws.device)
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"`{name}` must be a contiguous int32 [C], got shape {list(t.shape)}")
    check_operand("num_tokens", num_tokens, torch.int32, ws.device)
    if peer_token_idx.shape != peer_rank.shape or num_tokens.shape != (1,):
        raise ValueError(
            "schedule shapes must be peer_rank [C], peer_token_idx [C], num_tokens [1]; got "
            f"{list(peer_rank.shape)}, {list(peer_token_idx.shape)}, {list(num_tokens.shape)}"
        )
    return peer_rank, peer_token_idx, num_tokens


def buffer_named(ws: MoKWorkspace, name: str, allowed: tuple[str, ...]) -> torch.Tensor:
    if name not in allowed:
        raise ValueError(f"buffer name must be one of {allowed}, got {name!r}")
    return getattr(ws, name)


def direct_source(ws: MoKWorkspace, name: str, buffer: torch.Tensor, source) -> int:
    """The address a pull reads instead of the peers' `name` buffers (0: those): at EP 1 the
    caller's own rows `source`, read in place (no copy into the buffer first). It must be what
    the buffer would hold: its dtype and shape, contiguous, on its device, 16-byte aligned."""
    if source is None:
        return 0
    if ws.ep_size != 1:
        raise ValueError(f"`source` (read in place) needs EP 1, got EP {ws.ep_size}")
    check_operand("source", source, buffer.dtype, ws.device)
    if source.shape != buffer.shape or not source.is_contiguous():
        raise ValueError(
            f"`source` must be a contiguous {list(buffer.shape)} like `{name}`, got "
            f"{list(source.shape)} with strides {list(source.stride())}"
        )
    if source.data_ptr() % _extension.ALIGNMENT:
        raise ValueError(
            f"`source` must be {_extension.ALIGNMENT}-byte aligned, got address {source.data_ptr()}"
        )
    return source.data_ptr()


def check_out(ws: MoKWorkspace, name: str, out, source: torch.Tensor, rows: int) -> None:
    """`out` takes one row of `source` (buffer `name`) per schedule row."""
    check_operand("out", out, source.dtype, ws.device)
    if tuple(out.shape) != (rows, *source.shape[1:]) or not out.is_contiguous():
        raise ValueError(
            f"`out` must be a contiguous {source.dtype} {[rows, *source.shape[1:]]} (one row per "
            f"schedule row of `{name}`), got {list(out.shape)}"
        )
