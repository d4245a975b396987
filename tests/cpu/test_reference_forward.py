"""The forward pass (`mok.functional.forward`, reference backend) on EP 1, 2 and 4 gloo ranks.

Every scenario of moe_scenarios (BF16 and MXFP8, shared expert present or absent, clamp on or
off, skewed / hot / invalid routing, wide token magnitudes) runs once per EP size in worker
processes (the `mok_runs` fixture); each test below only reads those results, so one failing
check hides no other.

- against `moe_oracle.dense` (exact float64 math), with the error bf16 storage and MXFP8
  quantization are allowed (DESIGN.md §7's bounds: sum|diff|/sum|ref| <= 0.01 BF16, 0.1 MXFP8);
- against `moe_oracle.rounded` (float64 with the reference's documented rounding points), tight;
- the rows each rank computes: exactly the routes to its experts, in the documented order;
- invalid expert ids: exactly zero contribution, and `check_status` names the problem;
- bitwise repeatability on a reused and on a fresh workspace.
"""

from __future__ import annotations

import pytest
import torch
from moe_oracle import (
    check_ranks,
    dense,
    expected_schedule,
    rounded,
    same_bits,
    swiglu,
    zero_bits,
)
from moe_scenarios import EP_SIZES, LIMIT, REPEATED, SCENARIOS, TOPK, make_inputs

from mok import experts as reference_experts

# Output vs exact float64: DESIGN.md §7's bounds. Its max|diff| bounds (0.5 BF16, 1.0 MXFP8) are
# for outputs of order one; here they scale with max|ref| (up to ~4, and ~60 in "wide").
# Measured: BF16 <= 0.004 (max|diff| <= 0.01 max|ref|), MXFP8 <= 0.075 (<= 0.07 max|ref|).
DENSE_REL = {"bf16": 0.01, "mxfp8": 0.1}
DENSE_MAX_FRACTION = {"bf16": 0.05, "mxfp8": 0.25}
# Output vs the same rounding points in float64: only fp32-vs-float64 accumulation differs, which
# flips a bf16 rounding now and then (one ulp). Measured: <= 1.2e-5, max|diff| <= 0.0055 max|ref|.
ROUNDED_REL = 2e-4
ROUNDED_MAX_FRACTION = 1 / 64
# The same, per token (measured <= 6e-4): small tokens count as much as large ones, which is what
# catches a wrong MXFP8 block direction in the "wide" scenario.
ROUNDED_ROW_REL = 5e-3

ALL = [pytest.param(ep, name, id=f"ep{ep}-{name}") for ep in EP_SIZES for name in SCENARIOS]
BF16 = [p for p in ALL if SCENARIOS[p.values[1]].mode == "bf16"]
VALID = [p for p in ALL if SCENARIOS[p.values[1]].routing != "invalid"]
INVALID = [p for p in ALL if SCENARIOS[p.values[1]].routing == "invalid"]
REPEATS = [
    pytest.param(ep, name, run, id=f"ep{ep}-{name}-{run}")
    for ep in EP_SIZES
    for name in REPEATED.values()
    for run in ("again", "fresh")
]


@pytest.mark.parametrize(("ep", "name"), ALL)
def test_output_matches_dense_float64(mok_runs, ep, name):
    mode = SCENARIOS[name].mode
    expected = [o["out"] for o in dense(name, ep)]
    scale = max(e.abs().max().item() for e in expected)
    actual = [r["out"] for r in mok_runs.results(ep, name)]
    check_ranks(
        actual, expected, "out", rel=DENSE_REL[mode], max_abs=scale * DENSE_MAX_FRACTION[mode]
    )


@pytest.mark.parametrize(("ep", "name"), ALL)
def test_output_matches_rounding_points(mok_runs, ep, name):
    actual = [r["out"] for r in mok_runs.results(ep, name)]
    expected = [o["out"] for o in rounded(name, ep)]
    scale = max(e.abs().max().item() for e in expected)
    tolerance = {"rel": ROUNDED_REL, "max_abs": scale * ROUNDED_MAX_FRACTION}
    check_ranks(actual, expected, "out", row_rel=ROUNDED_ROW_REL, **tolerance)


def _expected_rows(top: torch.Tensor, ep: int, dest: int, capacity: int):
    """(peer_rank, peer_token_idx, tokens_per_expert) of the documented schedule of `dest`."""
    peer_rank, peer_token, padded = [], [], []
    for segment in expected_schedule(top, ep, dest):
        pad = -len(segment) % 256
        peer_rank += [src for src, _ in segment] + [-1] * pad
        peer_token += [flat for _, flat in segment] + [-1] * pad
        padded.append(len(segment) + pad)
    tail = [-1] * (capacity - len(peer_rank))
    return peer_rank + tail, peer_token + tail, padded


@pytest.mark.parametrize(("ep", "name"), ALL)
def test_schedule_follows_documented_order(mok_runs, ep, name):
    """Rows grouped by local expert, 256-padded, sources round-robin (DESIGN.md §4). The MXFP8
    weight gradients quantize blocks of 32 of these rows, so the order is numerics, not style."""
    top = make_inputs(name, ep)["top"]
    failures = []
    for rank, result in enumerate(mok_runs.results(ep, name)):
        got = {k: v.tolist() for k, v in result["schedule"].items()}
        want_rank, want_token, padded = _expected_rows(top, ep, rank, len(got["peer_rank"]))
        expected = {
            "peer_rank": want_rank,
            "peer_token_idx": want_token,
            "num_tokens": [sum(padded)],
            "tokens_per_expert": padded,
        }
        failures += [f"rank {rank} {k}" for k, v in expected.items() if got[k] != v]
    assert not failures, f"schedule differs from the documented order: {failures}"


@pytest.mark.parametrize(("ep", "name"), BF16)
def test_dispatch_pulls_each_scheduled_row(mok_runs, ep, name):
    """The saved routed input row i is bitwise x[peer_rank[i]][peer_token_idx[i] // k]; zero on
    padding rows."""
    x = make_inputs(name, ep)["x"]
    for rank, result in enumerate(mok_runs.results(ep, name)):
        peer_rank = result["schedule"]["peer_rank"].long()
        token = result["schedule"]["peer_token_idx"].long() // TOPK
        pad = (peer_rank < 0)[:, None]
        expected = torch.where(pad, 0.0, x[peer_rank.clamp(min=0), token.clamp(min=0)])
        assert same_bits(result["x_routed"], expected), f"rank {rank}: x_routed rows differ"


@pytest.mark.parametrize(("ep", "name"), INVALID)
def test_invalid_routes_contribute_exactly_zero(mok_runs, ep, name):
    """Invalid routes carry router weight 1000: their combine rows must be exactly zero, and
    zeroing that weight (the twin step) must leave the output bitwise unchanged."""
    for rank, result in enumerate(mok_runs.results(ep, name)):
        assert result["combine_rows"].shape[0] > 0, f"rank {rank} has no invalid route"
        assert zero_bits(result["combine_rows"]), f"rank {rank}: combine rows not zero"
        assert same_bits(result["out"], result["twin"]["out"]), f"rank {rank}: invalid route leaked"


@pytest.mark.parametrize(("ep", "name"), INVALID)
def test_invalid_expert_ids_raise_device_error(mok_runs, ep, name):
    for rank, result in enumerate(mok_runs.results(ep, name)):
        assert result["status"] is not None, f"rank {rank}: check_status raised nothing"
        assert "expert id" in result["status"], f"rank {rank}: {result['status']}"
        assert result["status_after_check"] is None, f"rank {rank}: status not cleared"


@pytest.mark.parametrize(("ep", "name"), VALID)
def test_valid_routing_records_no_status(mok_runs, ep, name):
    statuses = [r["status"] for r in mok_runs.results(ep, name)]
    assert statuses == [None] * ep


@pytest.mark.parametrize(("ep", "name", "run"), REPEATS)
def test_output_is_bitwise_repeatable(mok_runs, ep, name, run):
    """Same inputs -> same bits: again on the reused workspace, and on a fresh workspace."""
    for rank, result in enumerate(mok_runs.results(ep, name)):
        assert same_bits(result["out"], result[run]["out"]), f"rank {rank} differs"


# ------------------------------------------------------------------------ expert math (float64)


@pytest.mark.parametrize("limit", [None, LIMIT], ids=["noclamp", "clamp"])
def test_swiglu_matches_float64(limit):
    gen = torch.Generator().manual_seed(3)
    gate = torch.randn(64, 96, generator=gen, dtype=torch.float64) * 2
    up = torch.randn(64, 96, generator=gen, dtype=torch.float64) * 2
    expected = swiglu(gate, up, limit)
    actual = reference_experts.swiglu(gate, up, limit)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-6, atol=1e-6)


def test_grouped_linear_matches_float64():
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(12, 32, generator=gen, dtype=torch.float64)
    weight = torch.randn(3, 16, 32, generator=gen, dtype=torch.float64)
    row_expert = torch.tensor([0, 0, 2, -1, 2, 0, -1, 2, 2, 0, 0, 2])
    expected = torch.zeros(12, 16, dtype=torch.float64)
    for row, expert in enumerate(row_expert.tolist()):
        if expert >= 0:
            expected[row] = weight[expert] @ a[row]
    actual = reference_experts.grouped_linear(a, weight, row_expert)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-5)
