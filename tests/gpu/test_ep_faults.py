"""Fault injection on the CUDA backend (issue 48), in one-GPU EP groups of 2 and 3 ranks
(mok.testing.OneDeviceGroup): one rank gets a bad argument, a non-finite input or a call sequence
that differs from its peers', and the step ends in a clear error (on every rank where the device
sees it) or in a correct result: never a silently wrong one, a trap or a hang. The CPU tier's
twin, on the reference backend, is tests/cpu/test_fault_injection.py.
"""

from __future__ import annotations

import os

import pytest
import torch
from fault_helpers import spoiled, status_message
from gpu_helpers import requires_gpu_module
from gpu_steps import make, step

from mok import MoKDeviceError, status
from mok import functional as F
from mok.backends.cuda import comm
from mok.testing import HostGroupError, OneDeviceGroup

pytestmark = [
    pytest.mark.gpu,
    requires_gpu_module(),
    pytest.mark.skipif(int(os.environ.get("WORLD_SIZE", "1")) > 1, reason="one-GPU groups"),
]

CASE = (64, 1024, 512, 2, 2, "uniform")  # tokens, hidden, inter, local experts, topk, routing
CONFIG = F.MoKConfig(fwd_num_comm_sms=16, bwd_num_comm_sms=16)
CLEAR = (ValueError, TypeError, MoKDeviceError, HostGroupError)


@pytest.fixture(params=[2, 3], ids=lambda n: f"ep{n}")
def group(request):
    tokens, hidden, _, _, topk, _ = CASE
    return OneDeviceGroup(request.param, CONFIG, device="cuda", num_local_tokens=tokens,
                          hidden_size=hidden, topk=topk, timeout_s=60)  # fmt: skip


def _inputs(ep, seed=11):
    return [make(CASE, seed, rank, ep) for rank in range(ep)]


def _run(group, inputs, change=None, **options):
    """Every rank's step (gpu_steps.step, check_status included); the last rank's inputs pass
    through `change` first. Returns each rank's [out, *grads]."""
    last = group.ep_size - 1

    def rank_step(rank, ws):
        data = change(inputs[rank]) if change and rank == last else inputs[rank]
        return step(ws, CONFIG, data, "bf16", **(options if rank == last else {}))[0]

    return group.run(rank_step)


def _clean_step_follows(group, inputs):
    """Nothing is left broken: the same group then runs a clean step."""
    for result in _run(group, inputs):
        assert all(torch.isfinite(t.float()).all() for t in result if t is not None)


@pytest.mark.parametrize(
    ("fault", "change", "message"),
    [
        ("x float32", lambda d: {**d, "x": d["x"].float()}, r"`x`"),
        ("top_experts int32", lambda d: {**d, "top": d["top"].int()}, r"top_experts"),
        ("grad of another shape", lambda d: {**d, "grad": d["grad"][:-1]}, r"grad_output"),
        ("expert id past the last", lambda d: {**d, "top": d["top"].clone().fill_(10**6)},
         r"expert id outside"),
    ],
    ids=["x-float32", "top-experts-int32", "grad-of-another-shape", "expert-id-past-the-last"],
)  # fmt: skip
def test_a_fault_on_one_rank_is_a_clear_error(group, fault, change, message):
    inputs = _inputs(group.ep_size)
    with pytest.raises(CLEAR, match=message):
        _run(group, inputs, change)
    _clean_step_follows(group, inputs)


def test_a_nan_token_reaches_only_what_it_touches(group):
    """A NaN in one token's x (last rank) leaves every other token's output and d_x bit for bit
    as in the clean step, and the weight gradients of the experts it did not reach finite."""
    inputs = _inputs(group.ep_size)
    clean = _run(group, inputs)
    poisoned = inputs[-1]["x"].clone()
    poisoned[0] = float("nan")
    got = _run(group, inputs, lambda d: {**d, "x": poisoned})
    for rank, (bad, good) in enumerate(zip(got, clean, strict=True)):
        rows = slice(1, None) if rank == group.ep_size - 1 else slice(None)
        assert torch.equal(bad[0][rows], good[0][rows]), f"rank {rank}: another token's output"
        assert torch.equal(bad[1][rows], good[1][rows]), f"rank {rank}: another token's d_x"
    reached = {int(e) for e in inputs[-1]["top"][0]}  # global ids of the NaN token's experts
    local = CASE[3]
    for rank, result in enumerate(got):
        for index in (3, 4, 5):  # d_routed_gate, d_routed_up, d_routed_down [E, ...]
            for expert in range(local):
                finite = torch.isfinite(result[index][expert].float()).all()
                assert finite or rank * local + expert in reached, (rank, index, expert)


def test_an_inf_weight_of_an_invalid_route_contributes_zero(group):
    """An invalid expert id with an Inf router weight: the token's output stays finite (the
    route contributes exactly zero) and check_status names the id on every rank."""
    inputs = _inputs(group.ep_size)

    def change(d):
        top, rw = d["top"].clone(), d["rw"].clone()
        top[1, 0], rw[1, 0] = -1, float("inf")
        return {**d, "top": top, "rw": rw}

    def rank_step(rank, ws):
        data = change(inputs[rank]) if rank == group.ep_size - 1 else inputs[rank]
        schedule = F.build_schedule(ws, CONFIG, data["top"], num_local_experts=CASE[3])
        out, _ = F.forward(CONFIG, ws, schedule, data["x"], data["rw"], *data["shared"],
                           *data["routed"])  # fmt: skip
        return out, status_message(ws)

    results = group.run(rank_step)
    assert all(torch.isfinite(out.float()).all() for out, _ in results)
    assert all(v and "expert id outside" in v for _, v in results), results


def test_barriers_of_different_exchanges_are_out_of_step(group):
    """Ranks at the same device barrier from different exchanges once passed each other and
    mixed their tensors without a word; the barrier's tag now records OUT_OF_STEP on each."""

    def at_barrier(label_of):
        def rank_step(rank, ws):
            comm.barrier(ws, label_of(rank))
            value = int(ws.status.item())
            ws.status.zero_()
            return value

        return group.run(rank_step)

    last = group.ep_size - 1
    words = at_barrier(lambda rank: "pull d_y_buffer" if rank == last else "pull x_buffer")
    assert all(w & status.OUT_OF_STEP for w in words), words
    assert at_barrier(lambda rank: "pull x_buffer") == [0] * group.ep_size
    assert at_barrier(lambda rank: "" if rank == last else "pull x_buffer") == [0] * group.ep_size


def test_a_call_sequence_out_of_step_is_an_error(group):
    """The last rank runs its forward twice while its peers go on to the backward."""
    inputs = _inputs(group.ep_size)
    last = group.ep_size - 1

    def rank_step(rank, ws):
        data = inputs[rank]
        schedule = F.build_schedule(ws, CONFIG, data["top"], num_local_experts=CASE[3])
        args = (data["x"], data["rw"], *data["shared"], *data["routed"])
        out, ctx = F.forward(CONFIG, ws, schedule, *args)
        if rank == last:
            F.forward(CONFIG, ws, schedule, *args)
        else:
            F.backward(CONFIG, ws, schedule, ctx, data["grad"], *args)
        F.check_status(ws)

    with pytest.raises(CLEAR, match=r"different exchanges|gave up waiting|released"):
        group.run(rank_step)


def test_a_hand_built_schedule_out_of_range_is_contained():
    """EP 1: rows out of range in a schedule not made by build_schedule are skipped and
    recorded (INVALID_SCHEDULE), never a device fault; the output stays finite."""
    tokens, hidden, _, local, topk, _ = CASE
    group = OneDeviceGroup(1, CONFIG, device="cuda", num_local_tokens=tokens, hidden_size=hidden,
                           topk=topk)  # fmt: skip
    data = make(CASE, 5, 0, 1)

    def rank_step(rank, ws):
        built = F.build_schedule(ws, CONFIG, data["top"], num_local_experts=local)
        bad = spoiled(built, "token-index-past-T*k", routes_per_rank=tokens * topk)
        out, ctx = F.forward(CONFIG, ws, bad, data["x"], data["rw"], *data["shared"],
                             *data["routed"])  # fmt: skip
        F.backward(CONFIG, ws, bad, ctx, data["grad"], data["x"], data["rw"], *data["shared"],
                   *data["routed"])  # fmt: skip
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all()
        with pytest.raises(MoKDeviceError, match="a schedule not made by build_schedule"):
            F.check_status(ws)

    group.run(rank_step)


def test_one_ranks_bad_schedule_is_every_ranks_verdict(group):
    """The last rank's hand-built schedule holds a row out of range: its peers lose that row's
    contribution, and every rank's check_status says so (the barriers OR the status words)."""
    inputs = _inputs(group.ep_size)
    last = group.ep_size - 1

    def rank_step(rank, ws):
        data = inputs[rank]
        schedule = F.build_schedule(ws, CONFIG, data["top"], num_local_experts=CASE[3])
        if rank == last:
            schedule = spoiled(schedule, "negative-token-index")
        F.forward(CONFIG, ws, schedule, data["x"], data["rw"], *data["shared"], *data["routed"])
        return status_message(ws)

    verdicts = group.run(rank_step)
    assert all(v and "a schedule not made by build_schedule" in v for v in verdicts), verdicts
