"""MoKSchedule: which routed rows a rank computes (mok.functional.build_schedule makes it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mok import status as device_status


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
    | route_rows (mok)  | int32 | [T*k] | each route's row here, -1 where none, or None        |

    build_schedule keeps `routes` with the schedule it made from them: a route of an invalid id
    contributes exactly zero, whatever its router weight (mok.functional.forward). When the
    workspace's capacity also rules out dropped routes (EP * T * k rows: always at EP <= 2, or
    with schedule_capacity_multiplier >= 1), `routes_complete` is set: the rows nobody pushes
    are then exactly the invalid routes, and the combine zeroes only those instead of its whole
    destination (docs/exchanges.md). At EP 1 build_schedule also keeps `route_rows`, the row
    of every route (token * topk + slot) in this schedule: the passes then send nothing home
    and the combine epilogues read the routed rows in place through it (docs/exchanges.md,
    EP 1). A schedule built any other way has none of the three.
    """

    peer_rank: torch.Tensor
    peer_token_idx: torch.Tensor
    num_tokens: torch.Tensor
    tokens_per_expert: torch.Tensor
    routes: torch.Tensor | None = None
    routes_complete: bool = False
    route_rows: torch.Tensor | None = None

    def unpushed_routes(self) -> torch.Tensor | None:
        """The routes whose -1 entries are every row no rank pushes, or None if unknown."""
        return self.routes if self.routes_complete else None

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.peer_rank, self.peer_token_idx, self.num_tokens, self.tokens_per_expert)

    def valid_route_weights(self, router_weights: torch.Tensor) -> torch.Tensor:
        """The router weights with those of invalid routes zeroed: such a route's combined row
        is zero, and a NaN or Inf weight would otherwise make the token's output NaN (0 * NaN).
        Unchanged without `routes`."""
        if self.routes is None:
            return router_weights
        return torch.where(self.routes >= 0, router_weights, 0.0)


def route_rows_to_fill(ep_size: int, routes: int, device) -> torch.Tensor | None:
    """The int32 [routes] tensor the schedule fills with each route's row at EP 1, where every
    route stays on its rank, so that the combine reads the routed rows in place (`route_rows`);
    None beyond EP 1 and while torch.compile traces (the flat ops it calls push)."""
    if ep_size > 1 or torch.compiler.is_compiling():
        return None
    return torch.empty(routes, dtype=torch.int32, device=device)


def rows_of_routes(rows: torch.Tensor, route_rows: torch.Tensor) -> torch.Tensor:
    """[T * k, ...]: row route_rows[r] of `rows` for each route r, zeros where it is -1 (or
    outside `rows`): what a combine buffer holds after the pushes, read in place."""
    valid = (route_rows >= 0) & (route_rows < rows.shape[0])
    picked = rows[route_rows.clamp(0, rows.shape[0] - 1).long()]
    return torch.where(valid.view(-1, *[1] * (rows.dim() - 1)), picked, 0)


def contained(schedule: MoKSchedule, ep_size: int, routes_per_rank: int, status) -> MoKSchedule:
    """`schedule` with what it cannot mean made harmless, on the device (no sync): rows whose
    peer rank lies outside [-1, EP) or, on a row with a peer, whose token index lies outside
    [0, T * k) become padding rows; counts that disagree (num_tokens not a multiple of 256 or
    beyond the rows, tokens_per_expert negative, not multiples of 256 or not summing to
    num_tokens) make every count zero. Either records INVALID_SCHEDULE in `status`. For
    schedules not made by build_schedule, whose rows the kernels would otherwise skip or the
    reference index out of range without a word."""
    peer_rank, peer_token_idx, num_tokens, tokens_per_expert = schedule.as_tuple()
    rows = torch.arange(peer_rank.shape[0], device=peer_rank.device)
    used = rows < num_tokens.to(torch.int64)
    has_peer = peer_rank >= 0
    bad_index = (peer_token_idx < 0) | (peer_token_idx >= routes_per_rank)
    bad_row = used & ((peer_rank < -1) | (peer_rank >= ep_size) | (has_peer & bad_index))
    total = tokens_per_expert.to(torch.int64).sum()
    bad_counts = (
        (num_tokens < 0) | (num_tokens > peer_rank.shape[0]) | (num_tokens % 256 != 0)
        | (tokens_per_expert < 0).any() | (tokens_per_expert % 256 != 0).any()
        | (total != num_tokens.to(torch.int64))
    )  # fmt: skip
    device_status.record(status, device_status.INVALID_SCHEDULE, bad_row.any() | bad_counts)
    padding = torch.full_like(peer_rank, -1)
    return MoKSchedule(
        torch.where(bad_row, padding, peer_rank),
        torch.where(bad_row, padding, peer_token_idx),
        torch.where(bad_counts, 0, num_tokens),
        torch.where(bad_counts, 0, tokens_per_expert),
    )
