"""The benchmark's shapes (DESIGN.md §8) and how the original counts their FLOPs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shape:
    """One MoE layer per rank: T tokens, hidden H, expert intermediate I, top-k, E local experts."""

    name: str
    hidden: int
    inter: int
    topk: int
    experts: int
    tokens: int
    shared: bool

    @property
    def rows_per_expert(self) -> float:
        """Average routed rows one expert receives (independent of EP under uniform routing)."""
        return self.tokens * self.topk / self.experts


# T * k / E = 2048 rows per expert, as each expert sees at EP 64 with the original's defaults.
SHAPES = {
    s.name: s
    for s in (
        Shape("dsv4-pro", hidden=7168, inter=3072, topk=6, experts=12, tokens=4096, shared=True),
        Shape("qwen3-235b", hidden=4096, inter=1536, topk=8, experts=16, tokens=4096, shared=False),
        Shape("qwen3.5", hidden=4096, inter=1024, topk=10, experts=20, tokens=4096, shared=True),
    )
}
# The smallest sizes mok accepts (H, I multiples of 128), with and without a shared expert.
SMOKE_SHAPES = {
    s.name: s
    for s in (
        Shape("tiny", hidden=128, inter=128, topk=2, experts=2, tokens=64, shared=True),
        Shape("tiny-noshared", hidden=128, inter=256, topk=3, experts=3, tokens=48, shared=False),
    )
}


def flops(shape: Shape) -> tuple[int, int]:
    """(forward, backward) FLOPs as the original counts them: 3 GEMMs of 2·H·I per row, over
    T·k routed rows plus T shared rows when there is a shared expert; backward is 2x."""
    rows = shape.tokens * shape.topk + (shape.tokens if shape.shared else 0)
    forward = 6 * rows * shape.hidden * shape.inter
    return forward, 2 * forward
