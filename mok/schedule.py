"""MoKSchedule: which routed rows a rank computes (mok.functional.build_schedule makes it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class MoKSchedule:
    """Which routed rows this rank computes, grouped by local expert.

    | field             | dtype | shape | meaning                                              |
    |-------------------|-------|-------|------------------------------------------------------|
    | peer_rank         | int32 | [C]   | source rank of each row, -1 on padding rows          |
    | peer_token_idx    | int32 | [C]   | `token * topk + slot` on the source rank, -1 on pad  |
    | num_tokens        | int32 | [1]   | padded total rows (a multiple of 256), on the device |
    | tokens_per_expert | int32 | [E]   | padded rows of each local expert                     |
    | routes (mok)      | int32 | [T, k]| this rank's expert ids, -1 where invalid, or None    |

    build_schedule keeps `routes` with the schedule it made from them: a route of an invalid id
    contributes exactly zero, whatever its router weight (mok.functional.forward). When the
    workspace's capacity also rules out dropped routes (EP * T * k rows: always at EP <= 2, or
    with schedule_capacity_multiplier >= 1), `routes_complete` is set: the rows nobody pushes
    are then exactly the invalid routes, and the combine zeroes only those instead of its whole
    destination (docs/exchanges.md). A schedule built any other way has neither.
    """

    peer_rank: torch.Tensor
    peer_token_idx: torch.Tensor
    num_tokens: torch.Tensor
    tokens_per_expert: torch.Tensor
    routes: torch.Tensor | None = None
    routes_complete: bool = False

    def unpushed_routes(self) -> torch.Tensor | None:
        """The routes whose -1 entries are every row no rank pushes, or None if unknown."""
        return self.routes if self.routes_complete else None

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.peer_rank, self.peer_token_idx, self.num_tokens, self.tokens_per_expert)
