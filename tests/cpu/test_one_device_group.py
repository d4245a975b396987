"""mok.testing.OneDeviceGroup on the CPU (reference backend): N ranks as threads of one process.

- the same bits as the gloo group of separate processes (`mok_runs`) at EP 2 and 4, for every
  moe_scenarios scenario: output, gradients, schedule and every rank's status verdict;
- EP 8 (no gloo run) against the float64 oracle with the reference's rounding points;
- the status word is combined across ranks: a capacity overflow seen by one rank, or one rank's
  invalid ids, is every rank's verdict;
- faults stay contained: a rank that raises, or ranks whose calls fall out of step, give a clear
  error on the caller within the group's timeout, and the group runs again afterwards;
- bad arguments are refused before anything is allocated, and the SM budget rule.
"""

from __future__ import annotations

import pytest
import torch
from moe_oracle import check_ranks, rounded, same_bits
from moe_scenarios import (
    CONFIG_KWARGS,
    GRAD_NAMES,
    HIDDEN,
    LOCAL_EXPERTS,
    SCENARIOS,
    SCHEDULE_FIELDS,
    TOPK,
    _step,
    make_inputs,
    status_message,
)

from mok import functional as F
from mok.backends.reference import exchange
from mok.testing import HostGroupError, OneDeviceGroup, waiting_ctas_fit


def _group(ep: int, tokens: int, **config_kwargs) -> tuple[OneDeviceGroup, F.MoKConfig]:
    config = F.MoKConfig(**(config_kwargs or CONFIG_KWARGS))
    group = OneDeviceGroup(
        ep, config, device="cpu", num_local_tokens=tokens, hidden_size=HIDDEN, topk=TOPK
    )
    return group, config


def _run_scenario(ep: int, name: str) -> list[dict]:
    scenario = SCENARIOS[name]
    inputs = make_inputs(name, ep)
    group, config = _group(ep, scenario.tokens)

    def step(rank, ws):
        result, schedule, _ = _step(ws, config, scenario, inputs, rank)
        result["schedule"] = dict(zip(SCHEDULE_FIELDS, schedule.as_tuple(), strict=True))
        result["status"] = status_message(ws)
        return result

    return group.run(step)


def _differences(got: dict, want: dict) -> list[str]:
    pairs = [("out", got["out"], want["out"], "status")]
    pairs += [(g, got["grads"][g], want["grads"][g], None) for g in GRAD_NAMES]
    pairs += [(f, got["schedule"][f], want["schedule"][f], None) for f in SCHEDULE_FIELDS]
    found = [name for name, a, b, _ in pairs if not same_bits(a, b)]
    if got["status"] != want["status"]:
        found.append(f"status {got['status']!r} != {want['status']!r}")
    return found


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("ep", [2, 4])
def test_same_bits_as_a_group_of_processes(mok_runs, ep, name):
    got = _run_scenario(ep, name)
    want = mok_runs.results(ep, name)
    problems = [f"rank {r}: {d}" for r in range(ep) for d in _differences(got[r], want[r])]
    assert not problems, "one-device group differs from the gloo group: " + "; ".join(problems)


@pytest.mark.parametrize(
    "name", ["bf16-shared-clamp", "mxfp8-noshared-clamp", "bf16-shared-clamp-hot"]
)
def test_ep8_matches_the_rounding_points(name):
    got = _run_scenario(8, name)
    expected = rounded(name, 8)
    tolerance = {"rel": 2e-4 if SCENARIOS[name].mode == "bf16" else 5e-3}
    check_ranks([r["out"] for r in got], [e["out"] for e in expected], f"{name} out", **tolerance)
    assert all(r["status"] is None for r in got)


def test_invalid_ids_of_one_rank_are_every_ranks_verdict():
    group, config = _group(4, 8)

    def step(rank, ws):
        top = torch.arange(8 * TOPK).reshape(8, TOPK) % (4 * LOCAL_EXPERTS)
        if rank == 2:
            top[3, 1] = 4 * LOCAL_EXPERTS  # one id past the last expert, on rank 2 only
        F.build_schedule(ws, config, top, num_local_experts=LOCAL_EXPERTS)
        return status_message(ws), status_message(ws)

    verdicts = group.run(step)
    assert all(first and "expert id outside" in first for first, _ in verdicts), verdicts
    assert all(second is None for _, second in verdicts), "check_status must clear the word"


def test_capacity_overflow_is_every_ranks_verdict():
    # Everything to expert 0 (rank 0) with the smallest capacity: only rank 0 drops rows.
    group, config = _group(4, 512, schedule_capacity_multiplier=0.01)

    def step(rank, ws):
        top = torch.zeros(512, TOPK, dtype=torch.int64)
        top[:, 1] = 1
        F.build_schedule(ws, config, top, num_local_experts=LOCAL_EXPERTS)
        return status_message(ws)

    verdicts = group.run(step)
    assert all(v and "schedule capacity" in v for v in verdicts), verdicts


def test_ranks_that_disagree_on_num_local_experts_all_get_a_clear_error():
    """The reference raises on every rank at build_schedule (the CUDA backend records
    RANKS_DISAGREE instead: tests/gpu/test_ep_group.py); the group is usable afterwards."""
    group, config = _group(3, 8)
    top = torch.zeros(8, TOPK, dtype=torch.int64)

    def step(rank, ws):
        experts = LOCAL_EXPERTS + (rank == 1)
        try:
            F.build_schedule(ws, config, top, num_local_experts=experts)
        except ValueError as error:
            return str(error)
        return None

    errors = group.run(step)
    assert all(e and "same num_local_experts" in e and "[4, 5, 4]" in e for e in errors), errors
    group.run(lambda rank, ws: F.build_schedule(ws, config, top, num_local_experts=4))


def test_a_failing_rank_is_a_clear_error_and_the_group_runs_again():
    group, config = _group(
        3,
        8,
    )
    top = torch.zeros(8, TOPK, dtype=torch.int64)

    def step(rank, ws):
        if rank == 1:
            raise ValueError("planted failure")
        F.build_schedule(ws, config, top, num_local_experts=LOCAL_EXPERTS)

    with pytest.raises(ValueError, match="planted failure") as caught:
        group.run(step)
    assert any("rank 1" in note for note in caught.value.__notes__)
    group.run(lambda rank, ws: F.build_schedule(ws, config, top, num_local_experts=LOCAL_EXPERTS))


def test_ranks_out_of_step_fail_instead_of_hanging():
    config = F.MoKConfig(**CONFIG_KWARGS)
    group = OneDeviceGroup(
        2, config, device="cpu", num_local_tokens=8, hidden_size=HIDDEN, topk=TOPK, timeout_s=2
    )
    top = torch.zeros(8, TOPK, dtype=torch.int64)

    def step(rank, ws):
        for _ in range(1 + rank):  # rank 1 schedules twice, rank 0 once
            F.build_schedule(ws, config, top, num_local_experts=LOCAL_EXPERTS)

    with pytest.raises(HostGroupError, match="did not reach the same collective"):
        group.run(step)


def test_ranks_gathering_different_things_of_one_shape_are_out_of_step():
    group, _ = _group(2, 8)

    def step(rank, ws):
        label = "x_buffer" if rank == 0 else "d_y_buffer"
        rows = torch.zeros(4, dtype=torch.int32)
        exchange.pull_rows(ws.x_buffer, rows, rows, TOPK, ws.host_group, label)

    with pytest.raises(HostGroupError, match="out of step"):
        group.run(step)


def test_ops_outside_a_rank_thread_are_refused():
    group, config = _group(2, 8)
    top = torch.zeros(8, TOPK, dtype=torch.int64)
    with pytest.raises(HostGroupError, match="inside OneDeviceGroup.run"):
        F.build_schedule(group.workspaces[0], config, top, num_local_experts=LOCAL_EXPERTS)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ep_size": 0}, "ep_size"),
        ({"ep_size": 73}, "ep_size"),
        ({"config": "bogus"}, "config"),
        ({"device": "tpu"}, "device"),
        ({"hidden_size": 100}, "hidden_size"),
        ({"topk": 0}, "topk"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, message):
    arguments = {"ep_size": 2, "config": F.MoKConfig(), "device": "cpu", "num_local_tokens": 8,
                 "hidden_size": HIDDEN, "topk": TOPK, **kwargs}  # fmt: skip
    ep_size, config = arguments.pop("ep_size"), arguments.pop("config")
    with pytest.raises((TypeError, ValueError), match=message):
        OneDeviceGroup(ep_size, config, **arguments)


def test_waiting_kernels_must_fit_the_gpu():
    assert waiting_ctas_fit(8, 132) and waiting_ctas_fit(66, 132)
    assert not waiting_ctas_fit(67, 132)
