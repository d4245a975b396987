"""The macrobatch ring (mok.macrobatch): a forward saves at most `macrobatch_size` routed rows
plus 256 per local expert, the backward recomputes the rows before them, and the step's
results are bitwise those of a macrobatch that holds every row (a knob changes memory and speed,
never bits).

Steps run through mok.functional on the reference backend, the ranks as threads of this process
(mok.testing.OneDeviceGroup); at T = 640 with "hot" routing (one expert gets several 256-row
segments) the schedule's padded rows exceed the ring of a 256-row macrobatch (256 rows plus 256
per local expert) and the backward has rows to recompute.
"""

from __future__ import annotations

import pytest
import torch
from moe_oracle import same_bits
from moe_scenarios import (
    CONFIG_KWARGS,
    GRAD_NAMES,
    HIDDEN,
    LOCAL_EXPERTS,
    TOPK,
    Scenario,
    _step,
    inputs_for,
)

from mok import functional as F
from mok import macrobatch
from mok.testing import OneDeviceGroup

TOKENS, SEED = 640, 5
EVERY_ROW = F.MoKConfig().macrobatch_size  # the default: more rows than any schedule here


def _rows(value) -> int:
    return (value if isinstance(value, torch.Tensor) else value[0]).shape[0]


def _run(scenario: Scenario, ep: int, macrobatch_size: int) -> list[dict]:
    config = F.MoKConfig(**CONFIG_KWARGS, minibatch_size=256, macrobatch_size=macrobatch_size)
    inputs = inputs_for(scenario, ep, SEED, TOKENS)
    group = OneDeviceGroup(ep, config, device="cpu", num_local_tokens=TOKENS, hidden_size=HIDDEN,
                           topk=TOPK)  # fmt: skip

    def step(rank, ws):
        result, schedule, ctx = _step(ws, config, scenario, inputs, rank)
        result["rows"] = schedule.peer_rank.shape[0], int(schedule.num_tokens[0])
        result["kept"] = _rows(ctx.gate_routed)
        return result

    return group.run(step)


@pytest.mark.parametrize("ep", [1, 2])
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_a_step_has_the_same_bits_at_every_macrobatch(mode, ep):
    scenario = Scenario(mode, shared=True, clamp=True, routing="hot")
    every_row = _run(scenario, ep, EVERY_ROW)
    recomputed_somewhere = False
    for size in (256, 512):
        ringed = _run(scenario, ep, size)
        for rank, (got, want) in enumerate(zip(ringed, every_row, strict=True)):
            rows, num_tokens = got["rows"]
            ring = macrobatch.ring_rows(size, LOCAL_EXPERTS)
            assert rows > ring and got["kept"] == ring, (rank, rows, got["kept"])
            recomputed_somewhere |= num_tokens > ring
            assert same_bits(got["out"], want["out"]), f"macrobatch {size}, rank {rank}: out"
            for name in GRAD_NAMES:
                same = same_bits(got["grads"][name], want["grads"][name])
                assert same, f"macrobatch {size}, rank {rank}: {name}"
    assert recomputed_somewhere, "no rank had rows before its ring: nothing was recomputed"


def test_the_ring_holds_the_last_row_of_each_residue_below_num_tokens():
    rows = macrobatch.slot_rows(torch.tensor([768], dtype=torch.int32), 512)
    assert rows[:256].tolist() == list(range(512, 768))
    assert rows[256:].tolist() == list(range(256, 512))
    short = macrobatch.slot_rows(torch.tensor([256], dtype=torch.int32), 512)
    assert short.tolist() == list(range(512))  # nothing to wrap: every slot its own row


def test_the_cut_keeps_segment_starts_and_the_rows_before_the_ring():
    schedule = (None, None, torch.tensor([1280], dtype=torch.int32),
                torch.tensor([512, 256, 512, 0], dtype=torch.int32))  # fmt: skip
    _, _, end, kept = macrobatch.cut(schedule, 512)
    assert end.tolist() == [768]
    assert kept.tolist() == [512, 256, 0, 0]
    _, _, end, kept = macrobatch.cut(schedule, 2048)
    assert end.tolist() == [0] and kept.tolist() == [0, 0, 0, 0]


def test_a_schedule_within_the_macrobatch_keeps_its_tensors_uncopied():
    saved = tuple(torch.zeros(512, 8) for _ in range(4))
    kept = macrobatch.keep(saved, torch.tensor([512], dtype=torch.int32), 512, mxfp8=False)
    assert all(k is s for k, s in zip(kept, saved, strict=True))


def test_the_ring_goes_back_into_column_slices_of_one_output():
    """gate and up may be column slices of one GEMM output: the ring is written into them, in
    place, not into a copy."""
    num_tokens, size = torch.tensor([768], dtype=torch.int32), 256
    both = torch.randn(1024, 256).bfloat16()
    gate, up = both[:, :128], both[:, 128:]
    x, hidden = torch.randn(1024, 64).bfloat16(), torch.randn(1024, 128).bfloat16()
    rows = macrobatch.slot_rows(num_tokens, size)
    saved = (x, gate, up, hidden)
    ring = macrobatch.keep(saved, num_tokens, size, mxfp8=False)
    assert all(torch.equal(r, full[rows]) for r, full in zip(ring, saved, strict=True))
    blank = torch.zeros_like(both)
    restored = (torch.zeros_like(x), blank[:, :128], blank[:, 128:], torch.zeros_like(hidden))
    macrobatch.restore(restored, ring, num_tokens, size, mxfp8=False)
    assert torch.equal(blank[rows, :128], gate[rows]) and torch.equal(blank[rows, 128:], up[rows])
    assert not blank[:512].any(), "rows before the ring were written"
