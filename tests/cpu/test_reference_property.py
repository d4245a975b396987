"""A property test of the reference backend (issue 48): for any drawn EP (1 to 3), T, precision,
shared expert, clamp, routing and seed, a whole step through mok.functional (schedule, forward,
backward, check_status) on every rank agrees with `moe_oracle.rounded_for`, an independent float64
formulation that rounds exactly where the storage table says a tensor is stored, within the
tolerances of test_reference_forward.py / test_reference_backward.py; and the status verdict is
the one the routing calls for (invalid ids: every rank's; otherwise none).

The ranks are threads of this process (mok.testing.OneDeviceGroup on the CPU), which gives the bits
of a gloo group of processes (test_one_device_group.py) without spawning one per example.
"""

from __future__ import annotations

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from moe_oracle import mismatch, rounded_for
from moe_scenarios import (
    CONFIG_KWARGS,
    GRAD_NAMES,
    HIDDEN,
    TOPK,
    Scenario,
    _step,
    inputs_for,
    is_invalid,
    status_message,
)

from mok import functional as F
from mok.testing import OneDeviceGroup

# The rounding-point tolerances of test_reference_forward.py and test_reference_backward.py.
ROUNDED_REL, ROUNDED_MAX_FRACTION, ROUNDED_ROW_REL = 2e-4, 1 / 64, 5e-3
PER_TOKEN = {"out", "d_x", "d_router_weights"}
# The oracle rounds where mok stores, but from float64 values: where mok's fp32 value lies on the
# other side of a bf16 rounding boundary, a stored tensor differs by one unit in the last place,
# and that flip moves everything computed from it. Over many tokens such flips average out under
# ROUNDED_REL; over a few they cannot (T 1: one flipped up value, through hidden and y, moved 8 of
# the 128 outputs by one ulp, 2.3e-4 of the row), so below this many tokens the per-token limit
# is the whole tensor's too.
MIN_AVERAGED_TOKENS = 16

SCENARIOS = st.builds(
    Scenario,
    mode=st.sampled_from(["bf16", "mxfp8"]),
    shared=st.booleans(),
    clamp=st.booleans(),
    routing=st.sampled_from(["skewed", "hot", "invalid"]),
)


def _run(scenario: Scenario, ep: int, tokens: int, inputs: dict) -> list[dict]:
    config = F.MoKConfig(**CONFIG_KWARGS)
    group = OneDeviceGroup(ep, config, device="cpu", num_local_tokens=tokens, hidden_size=HIDDEN,
                           topk=TOPK)  # fmt: skip

    def step(rank, ws):
        result = _step(ws, config, scenario, inputs, rank)[0]
        result["status"] = status_message(ws)
        return result

    return group.run(step)


def _problems(name: str, actual: list, expected: list) -> list[str]:
    if expected[0] is None:
        return [f"{name}: present without a shared expert"] if actual[0] is not None else []
    scale = max(e.abs().max().item() for e in expected)
    per_token = name in PER_TOKEN
    averaged = not per_token or expected[0].shape[0] >= MIN_AVERAGED_TOKENS
    tolerance = {"rel": ROUNDED_REL if averaged else ROUNDED_ROW_REL,
                 "max_abs": scale * ROUNDED_MAX_FRACTION}  # fmt: skip
    row_rel = ROUNDED_ROW_REL if per_token else None
    found = []
    for rank, (a, e) in enumerate(zip(actual, expected, strict=True)):
        problem = mismatch(a, e, row_rel=row_rel, **tolerance)
        if problem is not None:
            found.append(f"rank {rank} {name}: {problem}")
    return found


@settings(max_examples=24, deadline=None)
@given(
    scenario=SCENARIOS,
    ep=st.integers(1, 3),
    tokens=st.integers(1, 24),
    seed=st.integers(0, 2**31 - 1),
)
# Found by a local run: the oracle kept d_h in float64 where mok keeps it in fp32, a rounding
# point downstream went the other way and, through an MX block of d_gate, moved a d_x row 2%.
@example(scenario=Scenario("mxfp8", False, False, "skewed"), ep=3, tokens=21, seed=2177154)
# Found by a local run: at T 1 a flip of one stored value moved 2.3e-4 of the only row
# (MIN_AVERAGED_TOKENS).
@example(scenario=Scenario("bf16", False, False, "invalid"), ep=1, tokens=1, seed=153624)
def test_a_step_matches_the_rounding_points(scenario, ep, tokens, seed):
    inputs = inputs_for(scenario, ep, seed, tokens)
    got = _run(scenario, ep, tokens, inputs)
    want = rounded_for(scenario, inputs, ep)
    problems = _problems("out", [r["out"] for r in got], [w["out"] for w in want])
    for name in GRAD_NAMES:
        actual = [r["grads"][name] for r in got]
        problems += _problems(name, actual, [w["grads"][name] for w in want])
    invalid = bool(is_invalid(inputs["top"], ep).any())
    for rank, result in enumerate(got):
        if invalid != (result["status"] is not None):
            problems.append(f"rank {rank}: status {result['status']!r} with invalid ids {invalid}")
    assert not problems, "\n".join(problems)


def test_inputs_for_a_scenario_are_its_seeds_alone():
    """The drawn inputs are a pure function of (scenario, EP, seed, T): what hypothesis shrinks
    and replays is what ran."""
    scenario = Scenario("mxfp8", True, True, "invalid")
    a, b = inputs_for(scenario, 2, 7, 5), inputs_for(scenario, 2, 7, 5)
    assert all(torch.equal(a[k], b[k]) for k in ("top", "rw", "x", "grad", "gate", "up", "down"))
