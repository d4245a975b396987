"""The schedule op: the routing table -> the routed-row schedule of one destination rank."""

from __future__ import annotations

import torch
from torch.library import custom_op

from mok import backends
from mok import status as device_status
from mok._arguments import check_multiple, check_range, check_tensor


def schedule(
    topk_all: torch.Tensor,
    num_local_experts: int,
    schedule_capacity: int,
    rank: int,
    status: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routed-row schedule of destination `rank` (see reference.schedule for the order).

    | output            | dtype | shape |
    |-------------------|-------|-------|
    | peer_rank         | int32 | [C]   |
    | peer_token_idx    | int32 | [C]   |
    | num_tokens        | int32 | [1]   |
    | tokens_per_expert | int32 | [E]   |

    `status` (mok; int32 [1], optional) is the word a capacity overflow or an invalid expert
    id is recorded in, never a trap. Without it (the original's call form, which works with
    the original's capacity `T * k * max(2, ceil(EP * multiplier))`) they are recorded in the
    device's own word, `schedule_status(device)`, which `mok.status.check` reads and clears.
    The op itself, `torch.ops.mok.schedule` (`schedule_op`), takes `status` always: torch's
    custom ops cannot leave out a tensor they write.
    """
    if status is None:
        status = schedule_status(topk_all.device if isinstance(topk_all, torch.Tensor) else None)
    return schedule_op(topk_all, num_local_experts, schedule_capacity, rank, status)


# One word per device for `schedule` called without one (keyed by the device, not by an
# object's address: the word outlives any schedule recorded in it).
_DEVICE_WORDS: dict[torch.device, torch.Tensor] = {}


def schedule_status(device: torch.device | str | None = None) -> torch.Tensor:
    """The status word (int32 [1]) that `schedule` records into when it is called without one,
    on `device` (default: the CPU): check it with `mok.status.check(schedule_status(device))`,
    which raises for what was recorded and clears it."""
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _DEVICE_WORDS:  # setdefault: threads of one process agree on one word
        _DEVICE_WORDS.setdefault(device, torch.zeros(1, dtype=torch.int32, device=device))
    return _DEVICE_WORDS[device]


def schedule_worst_case_rows(routes: int, num_local_experts: int) -> int:
    """The most rows a schedule of `routes` routes over `num_local_experts` experts can need:
    each expert's segment is padded to a multiple of 256, so at most min(E, routes) segments
    add at most 255 rows each."""
    check_multiple("num_local_experts", num_local_experts, 1)
    padded = routes + 255 * min(num_local_experts, routes)
    return padded // 256 * 256


def _check_schedule_args(topk_all, num_local_experts: int, schedule_capacity: int, rank,
                         status) -> None:  # fmt: skip
    check_tensor(
        "topk_all", topk_all, dtype=torch.int32, shape=(None, None, None), dims=("EP", "T", "k")
    )
    # A rank outside the group would schedule no real route and every invalid one as a row.
    check_range("rank", rank, 0, topk_all.shape[0] - 1)
    if schedule_capacity <= 0 or schedule_capacity % 256:
        raise ValueError(
            f"`schedule_capacity` must be a positive multiple of 256, got {schedule_capacity}"
        )
    check_multiple("num_local_experts", num_local_experts, 1)
    check_tensor("status", status, dtype=torch.int32, shape=(1,), device=topk_all.device)


@custom_op("mok::schedule", mutates_args=("status",))
def schedule_op(
    topk_all: torch.Tensor,
    num_local_experts: int,
    schedule_capacity: int,
    rank: int,
    status: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`schedule` with its status word (int32 [1]) given. An id at or past EP * E (or below -1,
    which marks a route already found invalid) is skipped and recorded as INVALID_EXPERT_ID."""
    _check_schedule_args(topk_all, num_local_experts, schedule_capacity, rank, status)
    num_experts = topk_all.shape[0] * num_local_experts
    invalid = (topk_all >= num_experts) | (topk_all < -1)
    device_status.record(status, device_status.INVALID_EXPERT_ID, invalid)
    backend = backends.for_device(topk_all.device)
    return backend.schedule(topk_all, num_local_experts, schedule_capacity, rank, status)


@schedule_op.register_fake
def _(topk_all, num_local_experts, schedule_capacity, rank, status):
    index = topk_all.new_empty((schedule_capacity,))
    return (
        index,
        torch.empty_like(index),
        topk_all.new_empty((1,)),
        topk_all.new_empty((num_local_experts,)),
    )
