"""The reference backend's exchanges: collectives (gloo on CPU, NCCL on CUDA) with the semantics
of the CUDA kernels' peer loads and stores: pull-dispatch of token rows into the schedule order,
push-combine of expert rows into the source rank's `combine_buffer[token * topk + k]`. Tensors
cross ranks as raw bytes, so any dtype works on any backend.

`group` names the EP group: a torch.distributed group's name ("" for the default group), or the
mok.host_group.HostGroup of a group whose ranks are threads of one process (mok.testing).
"""

from __future__ import annotations

import zlib
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from mok import settings
from mok.host_group import HostGroup


def resolve_group(group_name: str) -> dist.ProcessGroup:
    if not group_name:
        return dist.group.WORLD
    return dist.distributed_c10d._resolve_process_group(group_name)


def rank_in(group: str | HostGroup) -> int:
    """The calling rank's index in `group`."""
    if isinstance(group, HostGroup):
        return group.rank
    return dist.get_rank(resolve_group(group))


# A header's first word for "this rank raised before the exchange" (a CRC-32 is never < 0).
_FAILED = -1
# Bytes of a failing rank's message that its peers receive.
_MESSAGE_BYTES = 1024


def all_gather(tensor: torch.Tensor, group: str | HostGroup, label: str = "") -> torch.Tensor:
    """[EP, *tensor.shape]: every rank's tensor, in rank order. `label` names what is exchanged:
    every rank must gather the same label, shape and dtype at the same point, so ranks whose
    calls fell out of step raise the same ValueError on every rank instead of mixing different
    tensors (or crashing on different sizes); "" names nothing but the shape and dtype."""
    if isinstance(group, HostGroup):
        return group.all_gather(tensor, label)
    group = resolve_group(group)
    raw = tensor.contiguous().view(torch.uint8)
    _check_in_step(raw, label, tensor, group)
    return _gathered(raw, group, label).view(tensor.dtype)


def _gathered(raw: torch.Tensor, group, label: str) -> torch.Tensor:
    """dist.all_gather of `raw` ([EP, *raw.shape]), waiting at most MOK_COMM_TIMEOUT_S where
    it is set (else the process group's timeout) before a clear error."""
    parts = [torch.empty_like(raw) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(parts, raw, group=group, async_op=True)
    seconds = settings.comm_timeout_s_if_set()
    try:
        work.wait(timeout=timedelta(seconds=seconds)) if seconds else work.wait()
    except RuntimeError as error:
        raise RuntimeError(
            f"rank {dist.get_rank(group)} of the EP group waited "
            f"{f'{seconds:g} s (MOK_COMM_TIMEOUT_S)' if seconds else 'the process group timeout'}"
            f" for every rank to exchange {label or 'a tensor'}: a rank failed, stalled or ran "
            "a different sequence of mok calls; the group cannot be used again"
        ) from error
    return torch.stack(parts)


def _check_in_step(raw: torch.Tensor, label: str, tensor: torch.Tensor, group) -> None:
    """One small collective before the exchange: every rank's (label, shape, dtype) digest,
    or a peer's notice that it raised (announce_failure)."""
    what = f"{label} {list(tensor.shape)} {tensor.dtype}"
    mine = torch.tensor([zlib.crc32(what.encode()), raw.numel()], dtype=torch.int64)
    headers = _gathered(mine.to(raw.device), group, f"the header of {label or 'a tensor'}")
    if (headers[:, 0] == _FAILED).any():
        _raise_for_failed_peer(headers, group)
    if any(not torch.equal(h, headers[dist.get_rank(group)]) for h in headers):
        raise ValueError(
            f"the ranks of the EP group are out of step: this rank (rank {dist.get_rank(group)}) "
            f"exchanges {what} while another rank exchanges something else (every rank must "
            "call the same mok functions in the same order, with the same sizes)"
        )


@contextmanager
def failures_announced(group: str | None):
    """Within it, a ValueError or TypeError (a public entry's argument checks) is announced to
    the ranks of `group` (announce_failure) before it propagates; None: nothing is announced
    (a group whose peers do not wait in these collectives)."""
    try:
        yield
    except (ValueError, TypeError) as error:
        if group is not None:
            announce_failure(group, error)
        raise


def announce_failure(group: str, error: BaseException) -> None:
    """Tell the ranks of a torch.distributed `group`, which wait in the header of their next
    exchange, that this rank raised `error` before reaching it: they raise a ValueError naming
    this rank and its message instead of waiting for the process group's timeout, and every
    rank has taken part in the same two collectives, so the group stays in step."""
    group = resolve_group(group)
    notice = torch.tensor([_FAILED, dist.get_rank(group)], dtype=torch.int64)
    headers = _gathered(notice, group, "a failure notice")
    _raise_for_failed_peer(headers, group, error)


def _raise_for_failed_peer(headers: torch.Tensor, group, own: BaseException | None = None):
    """The second collective of a failure notice: every rank's message (empty for ranks that
    did not raise); raises on ranks that did not raise themselves."""
    text = f"{type(own).__name__}: {own}" if own is not None else ""
    message = torch.zeros(_MESSAGE_BYTES, dtype=torch.uint8)
    encoded = list(text.encode()[:_MESSAGE_BYTES])
    message[: len(encoded)] = torch.tensor(encoded, dtype=torch.uint8)
    messages = _gathered(message.to(headers.device), group, "a failure message")
    if own is not None:
        return
    failed = [int(r) for r in (headers[:, 0] == _FAILED).nonzero().flatten()]
    first = bytes(messages[failed[0]].cpu().tolist()).rstrip(b"\0").decode(errors="replace")
    raise ValueError(
        f"rank {failed[0]} of the EP group raised before this exchange ({first}); "
        f"ranks that raised: {failed}. Every rank stops here, in step: fix the call and retry"
    )


def all_gather_top_experts(top_experts: torch.Tensor, buffer: torch.Tensor, group):
    gathered = all_gather(top_experts, group, "routing")
    # Checked after the collective, which every rank joins, so a bad buffer cannot hang a peer;
    # copy_ would broadcast one rank's routing over a buffer sized for more ranks.
    if gathered.shape != buffer.shape:
        raise ValueError(
            f"`all_gather_top_experts_buffer` must be int32 [EP, T, k] = "
            f"{list(gathered.shape)} for this group of {gathered.shape[0]} ranks, "
            f"got {list(buffer.shape)}"
        )
    buffer.copy_(gathered)


def pull_rows(source: torch.Tensor, peer_rank, peer_token_idx, topk: int, group, label=""):
    """Dispatch: row i = source[peer_rank[i]][peer_token_idx[i] // topk]; zero on padding rows.
    `label` names the source (all_gather)."""
    everyone = all_gather(source, group, label)
    rank = peer_rank.to(torch.int64).clamp(min=0)
    token = peer_token_idx.to(torch.int64).clamp(min=0) // topk
    rows = everyone[rank, token]
    pad = (peer_rank < 0).reshape(-1, *([1] * (rows.dim() - 1)))
    return torch.where(pad, torch.zeros((), dtype=rows.dtype, device=rows.device), rows)


def pull_router_weights(weights: torch.Tensor, peer_rank, peer_token_idx, group):
    """Reverse-combine helper: the fp32 router weight of each schedule row (0 on padding)."""
    everyone = all_gather(weights.reshape(-1), group, "router weights")
    rank = peer_rank.to(torch.int64).clamp(min=0)
    flat = peer_token_idx.to(torch.int64).clamp(min=0)
    return torch.where(peer_rank >= 0, everyone[rank, flat], 0.0)


def push_rows(rows: torch.Tensor, peer_rank, peer_token_idx, destination: torch.Tensor, group,
              label: str = "rows"):  # fmt: skip
    """Combine: row i goes to `destination[peer_token_idx[i]]` on rank `peer_rank[i]`.

    Every route is scheduled on exactly one rank, so each destination row has one writer;
    rows nobody sends (invalid expert ids, capacity overflow) are zero.
    """
    me = rank_in(group)
    all_rows = all_gather(rows, group, label).flatten(0, 1)
    all_rank = all_gather(peer_rank, group, f"{label} ranks").flatten()
    all_token = all_gather(peer_token_idx, group, f"{label} slots").flatten().to(torch.int64)
    slots = destination.shape[0]
    target = torch.where(all_rank == me, all_token, slots)
    landing = torch.zeros(slots + 1, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
    landing.index_copy_(0, target, all_rows)
    destination.copy_(landing[:slots].reshape(destination.shape))
