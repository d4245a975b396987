"""A MoKSchedule not made by build_schedule is checked on the device (issue 48, cause 8): rows
out of range or counts that disagree become zero contributions and INVALID_SCHEDULE in the
status word, on the functional API and on the fused ops, where they once ended in an IndexError
deep inside the reference (and were skipped without a word by the CUDA kernels)."""

from __future__ import annotations

import pytest
import torch
from fault_helpers import SCHEDULE_FAULTS, spoiled, status_message
from step_setup import single_rank_step

from mok import functional as F
from mok import ops, status
from mok.ops import fused_backward
from mok.schedule import MoKSchedule

T, H, I, E, K = 16, 128, 128, 2, 2


def _bf16(*shape, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) / 8).bfloat16()


def _weights():
    return (_bf16(E, I, H, seed=7), _bf16(E, I, H, seed=8), _bf16(E, H, I, seed=9))


def _inputs():
    rw = torch.rand(T, K, generator=torch.Generator().manual_seed(3))
    return _bf16(T, H, seed=1), rw


def _spoil(schedule: MoKSchedule, fault: str) -> MoKSchedule:
    return spoiled(schedule, fault, routes_per_rank=T * K, ep_size=1)


FAULTS = list(SCHEDULE_FAULTS)


def test_a_hand_built_copy_of_a_good_schedule_gives_the_same_step(single_rank_group):
    config, ws, built = single_rank_step(single_rank_group, tokens=T, hidden=H, topk=K,
                                         experts=E, seed=5)  # fmt: skip
    x, rw = _inputs()
    want, _ = F.forward(config, ws, built, x, rw, None, None, None, *_weights())
    copy = MoKSchedule(*(t.clone() for t in built.as_tuple()))
    got, _ = F.forward(config, ws, copy, x, rw, None, None, None, *_weights())
    assert torch.equal(got, want)
    F.check_status(ws)


@pytest.mark.parametrize("fault", FAULTS)
def test_functional_records_a_bad_schedule(single_rank_group, fault):
    config, ws, built = single_rank_step(single_rank_group, tokens=T, hidden=H, topk=K,
                                         experts=E, seed=5)  # fmt: skip
    x, rw = _inputs()
    bad = _spoil(built, fault)
    out, ctx = F.forward(config, ws, bad, x, rw, None, None, None, *_weights())
    F.backward(config, ws, bad, ctx, x, x, rw, None, None, None, *_weights())
    assert torch.isfinite(out.float()).all()
    with pytest.raises(status.MoKDeviceError, match="a schedule not made by build_schedule"):
        F.check_status(ws)
    if fault in ("num-tokens-past-the-rows", "counts-disagree"):
        assert torch.equal(out, torch.zeros_like(out)), "bad counts: every row contributes zero"


@pytest.mark.parametrize("fault", FAULTS[:3])
def test_fused_ops_record_a_bad_schedule_in_the_devices_word(single_rank_group, fault):
    config, ws, built = single_rank_step(single_rank_group, tokens=T, hidden=H, topk=K,
                                         experts=E, seed=5)  # fmt: skip
    x, rw = _inputs()
    _, ctx = F.forward(config, ws, built, x, rw, None, None, None, *_weights())
    word = ops.schedule_status("cpu")
    status.check(word)
    ws.d_y_buffer.copy_(x)
    args = fused_backward.original_arguments(config, ws, _spoil(built, fault), ctx, None,
                                             _weights(), None, False)  # fmt: skip
    ops.dispatch_mlp_swiglu_combine_bwd_bf16(*args)
    with pytest.raises(status.MoKDeviceError, match="a schedule not made by build_schedule"):
        status.check(word)


@pytest.mark.parametrize("ep", [2, 3])
def test_one_ranks_bad_schedule_is_every_ranks_verdict(ep):
    """The last rank's rows out of range drop routes of its peers' tokens: every rank's
    check_status names the schedule (the status words are ORed after each pass's pushes)."""
    from mok.testing import OneDeviceGroup

    config = F.MoKConfig()
    group = OneDeviceGroup(ep, config, device="cpu", num_local_tokens=T, hidden_size=H, topk=K)
    x, rw = _inputs()

    def rank_step(rank, ws):
        top = torch.randint(0, ep * E, (T, K), generator=torch.Generator().manual_seed(rank))
        built = F.build_schedule(ws, config, top, num_local_experts=E)
        schedule = _spoil(built, "negative-token-index") if rank == ep - 1 else built
        F.forward(config, ws, schedule, x, rw, None, None, None, *_weights())
        return status_message(ws)

    verdicts = group.run(rank_step)
    assert all(v and "a schedule not made by build_schedule" in v for v in verdicts), verdicts
