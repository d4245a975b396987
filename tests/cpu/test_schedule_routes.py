"""MoKSchedule.routes: build_schedule keeps this rank's routing with the schedule where no valid
route can be dropped, so that a push clears only the rows of the routes nobody pushes (the
kernel and its bits against a push into a zeroed destination: tests/gpu/test_comm.py)."""

from __future__ import annotations

import torch

from mok import functional as F


def _step(group, multiplier: float, *, ep_tokens: int = 8):
    config = F.MoKConfig(schedule_capacity_multiplier=multiplier)
    ws = F.create_workspace(config, group, device="cpu", num_local_tokens=ep_tokens,
                            hidden_size=128, topk=2)  # fmt: skip
    top = torch.tensor([[0, 1], [5, -1]] * (ep_tokens // 2))  # 2 experts: 5 and -1 are invalid
    return top, F.build_schedule(ws, config, top, num_local_experts=2)


def test_build_schedule_keeps_its_routing(single_rank_group):
    top, schedule = _step(single_rank_group, 0.5)
    assert torch.equal(schedule.routes, torch.where((top >= 0) & (top < 2), top, -1).int())
    assert schedule.routes_complete  # EP 1 can drop no route
    assert schedule.unpushed_routes() is schedule.routes


def test_a_schedule_built_elsewhere_has_none():
    """The low-level ops.schedule (and a hand-built MoKSchedule) carry no routes: their pushes
    zero the whole destination."""
    tensors = [torch.zeros(4, dtype=torch.int32) for _ in range(3)] + [torch.zeros(1).int()]
    assert F.MoKSchedule(*tensors).unpushed_routes() is None
    assert len(F.MoKSchedule(*tensors).as_tuple()) == 4
