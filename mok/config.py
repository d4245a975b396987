"""MoKConfig: the tuning knobs of the forward and backward passes, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mok._arguments import check_multiple


@dataclass(frozen=True, slots=True)
class MoKConfig:
    """Tuning knobs; field order and defaults are those of the original package.

    | field                              | meaning                                              |
    |------------------------------------|------------------------------------------------------|
    | fwd_num_comm_sms                   | SMs given to dispatch/combine in the forward (even)  |
    | bwd_num_comm_sms                   | SMs given to communication in the backward (even)    |
    | minibatch_size                     | routed rows per arrival counter (multiple of 256)    |
    | macrobatch_size                    | routed rows in the ring buffer (multiple of minibatch)|
    | schedule_capacity_multiplier       | routed rows per rank: see schedule_capacity          |
    | all_gather_top_experts_chunk_bytes | chunk of the routing all-gather (multiple of 16)     |

    Today only `schedule_capacity_multiplier` changes what runs. The other five are checked
    and passed to the ops as the original's callers expect, but nothing reads them yet: mok's
    stages run one after another, and the overlapped engine that gives them their meaning is
    still to come. Tuning them changes neither speed nor bits. mok's own process-wide switches
    are environment variables, parsed in mok.settings.
    """

    fwd_num_comm_sms: int = 40
    bwd_num_comm_sms: int = 28
    minibatch_size: int = 4096
    macrobatch_size: int = 131072
    schedule_capacity_multiplier: float = 0.5
    all_gather_top_experts_chunk_bytes: int = 2048

    def __post_init__(self) -> None:
        check_multiple("fwd_num_comm_sms", self.fwd_num_comm_sms, 2)
        check_multiple("bwd_num_comm_sms", self.bwd_num_comm_sms, 2)
        check_multiple("minibatch_size", self.minibatch_size, 256)
        check_multiple("macrobatch_size", self.macrobatch_size, self.minibatch_size)
        multiplier = self.schedule_capacity_multiplier
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise TypeError(
                f"`schedule_capacity_multiplier` must be a float, got {type(multiplier).__name__}"
            )
        if not (math.isfinite(multiplier) and multiplier > 0):
            raise ValueError(
                f"`schedule_capacity_multiplier` must be positive and finite, got {multiplier}"
            )
        check_multiple(
            "all_gather_top_experts_chunk_bytes", self.all_gather_top_experts_chunk_bytes, 16
        )

    def check_device(self, num_sms: int) -> None:
        """Comm SM counts must leave compute SMs on a device with `num_sms` multiprocessors."""
        for name in ("fwd_num_comm_sms", "bwd_num_comm_sms"):
            value = getattr(self, name)
            if value >= num_sms:
                raise ValueError(
                    f"`{name}` must be below the device's SM count ({num_sms}), got {value}"
                )

    def schedule_capacity(self, ep_size: int, num_local_tokens: int, topk: int) -> int:
        """Routed rows a rank can receive: multiplier * EP * T * k, but at least twice the mean
        load (2 * T * k) and at most the worst case (EP * T * k), rounded up to 256.

        Schedules add 256 rows per local expert for padding, so only real routes can overflow;
        a rank that receives more records a capacity-overflow error in the status word and the
        extra routes contribute zero. EP <= 2 and multiplier >= 1 can never overflow.
        """
        routes = ep_size * num_local_tokens * topk
        multiplier = self.schedule_capacity_multiplier
        # At 1 or more the worst case bounds it; a huge multiplier must not overflow on the way.
        share = routes if multiplier >= 1 else math.ceil(multiplier * routes)
        wanted = max(share, 2 * num_local_tokens * topk)
        return -(-min(wanted, routes) // 256) * 256
