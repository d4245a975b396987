"""The macrobatch ring (MoKConfig.macrobatch_size): how many routed rows a forward saves.

A forward computes every schedule row, but of the routed activations it saves for the backward
(x_routed, gate, up, hidden: one row per schedule row) it keeps at most R = macrobatch_size +
256 per local expert rows (the macrobatch plus the padding allowance mok's schedule adds to
the original's capacity, so that a schedule rings exactly when the original's capacity exceeds
the macrobatch), as a ring: slot s holds the last row r < num_tokens with r = s (mod R), i.e.
the rows [num_tokens - R, num_tokens) once the padded rows exceed R, as a pass over macrobatches
of R rows would leave them. The backward recomputes the rows before those (the earlier
macrobatches: the dispatch of x, the gate/up GEMMs and SwiGLU, on the schedule cut at that row:
the same kernels on the same rows, so the same bits) and puts the ring's rows back after them.
Where the schedule has no more rows than R the ring is the tensors themselves: nothing is copied
or recomputed. Everything runs on the device; num_tokens is never read on the host.

num_tokens and R are multiples of 256, so the cut and the ring move whole 128-row tiles of
MXFP8 scales and whole 32-row blocks of the transposed forms (docs/macrobatch.md).
"""

from __future__ import annotations

import torch

# The ring moves rows in blocks of 256 (num_tokens and MB are multiples of it, so the ring's
# slots map whole blocks to whole blocks); MXFP8 scale tensors hold one index per 128 rows along
# the row axis (mok.mxfp8's swizzle).
BLOCK, SCALE_ROWS = 256, 128
# Which saved routed tensors are transposed ([.., C]) in MXFP8 mode, in the saved order
# (x_routed, gate, up, hidden): x and hidden, whose blocks run along rows.
TRANSPOSED_IN_MXFP8 = (True, False, False, True)


def ring_rows(macrobatch_size: int, num_local_experts: int) -> int:
    """R: the rows a ring holds, the macrobatch plus each local expert's padding allowance."""
    return macrobatch_size + BLOCK * num_local_experts


def kept_rows(rows: int, macrobatch_size: int, num_local_experts: int) -> int:
    """Routed rows a forward saves for a schedule of `rows` rows: all of them, at most R."""
    return min(rows, ring_rows(macrobatch_size, num_local_experts))


def rings(rows: int, ring: int) -> bool:
    """Whether a schedule of `rows` rows keeps a ring of `ring` rows (it has more)."""
    return rows > ring


def slot_rows(num_tokens: torch.Tensor, ring: int) -> torch.Tensor:
    """The schedule row each slot of a `ring`-row ring holds (int64 [ring]): the last row below
    num_tokens in the slot's residue class, or the slot itself where there is none (padding)."""
    slot = torch.arange(ring, device=num_tokens.device)
    last = num_tokens.to(torch.int64) - 1
    laps = torch.div(last - slot, ring, rounding_mode="floor").clamp(min=0)
    return laps * ring + slot


def cut(schedule: tuple, ring: int) -> tuple:
    """The schedule tuple (peer_rank, peer_token_idx, num_tokens, tokens_per_expert) cut to the
    rows before the ring's: num_tokens - ring (at least 0) rows; each expert keeps its
    segment's start and the part of its rows before the cut."""
    peer_rank, peer_token_idx, num_tokens, tokens_per_expert = schedule
    end = (num_tokens - ring).clamp(min=0)
    ends = torch.cumsum(tokens_per_expert, 0, dtype=torch.int32)
    starts = ends - tokens_per_expert
    kept = (ends.clamp(max=end) - starts.clamp(max=end)).to(tokens_per_expert.dtype)
    return peer_rank, peer_token_idx, end.to(num_tokens.dtype), kept


def _block_index(num_tokens: torch.Tensor, ring: int) -> torch.Tensor:
    """The schedule block of each ring block (int64 [ring / BLOCK]): slot_rows maps whole
    blocks."""
    return slot_rows(num_tokens, ring)[::BLOCK] // BLOCK


def _words(t: torch.Tensor, axis: int) -> torch.Tensor:
    """A view of `t` with its row axis split into (blocks of BLOCK rows, indices per block) and
    its last dim as int64 words: the copies move whole blocks at copy speed (per-element indexing
    of bf16 or FP8 runs 2-4x slower). A view, never a copy, so that `restore` writes into `t`
    (gate and up may be column slices of one GEMM output)."""
    per_block = BLOCK // _rows_per_index(t)
    shape = (*t.shape[:axis], t.shape[axis] // per_block, per_block, *t.shape[axis + 1 :])
    return t.view(shape).view(torch.int64)


def _forms(value, transposed: bool):
    """(tensor, row axis) of each part of a saved value: a bf16 tensor, or an MXFP8 pair."""
    axis = 1 if transposed else 0
    if isinstance(value, torch.Tensor):
        return [(value, axis)]
    return [(part, axis) for part in value]


def _rows_per_index(t: torch.Tensor) -> int:
    """Schedule rows per index along the row axis: SCALE_ROWS for MXFP8 scales (4-D), else 1."""
    return SCALE_ROWS if t.dim() == 4 else 1


def _transposed(mxfp8: bool) -> tuple[bool, ...]:
    return TRANSPOSED_IN_MXFP8 if mxfp8 else (False,) * len(TRANSPOSED_IN_MXFP8)


def keep(saved: tuple, num_tokens: torch.Tensor, ring: int, mxfp8: bool) -> tuple:
    """The ring of each saved routed value (x_routed, gate, up, hidden): `ring` rows each, or
    the values themselves where they have no more rows."""
    if not rings(_row_count(saved[1]), ring):
        return tuple(saved)
    index = _block_index(num_tokens, ring)
    kept = []
    for value, transposed in zip(saved, _transposed(mxfp8), strict=True):
        taken = tuple(_kept_part(t, axis, index, ring) for t, axis in _forms(value, transposed))
        kept.append(taken[0] if isinstance(value, torch.Tensor) else taken)
    return tuple(kept)


def _kept_part(t: torch.Tensor, axis: int, block_index: torch.Tensor, ring: int):
    shape = list(t.shape)
    shape[axis] = ring // _rows_per_index(t)
    return _words(t, axis).index_select(axis, block_index).view(t.dtype).view(shape)


def keep_rows(rows: torch.Tensor, num_tokens: torch.Tensor, ring: int) -> torch.Tensor:
    """The ring of one [C, N] tensor of routed rows (the fused forward's y_routed)."""
    if not rings(rows.shape[0], ring):
        return rows
    return _kept_part(rows, 0, _block_index(num_tokens, ring), ring)


def restore(recomputed: tuple, kept: tuple, num_tokens: torch.Tensor, ring: int,
            mxfp8: bool) -> tuple:  # fmt: skip
    """The saved values of every schedule row: `recomputed` (the rows before the cut, computed
    again) with the rows `kept` in the ring written back into their rows, in place."""
    index = _block_index(num_tokens, ring)
    for full, part, transposed in zip(recomputed, kept, _transposed(mxfp8), strict=True):
        pairs = zip(_forms(full, transposed), _forms(part, transposed), strict=True)
        for (target, axis), (source, _) in pairs:
            _words(target, axis).index_copy_(axis, index, _words(source, axis))
    return tuple(recomputed)


def _row_count(value) -> int:
    """Schedule rows of a saved normal-layout value (gate: a bf16 tensor or an MXFP8 pair)."""
    return (value if isinstance(value, torch.Tensor) else value[0]).shape[0]
