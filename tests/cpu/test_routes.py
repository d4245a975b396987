"""mok._routes: build_schedule keeps each schedule's routing where no valid route can be dropped,
so that a push clears only the rows of the routes nobody pushes (the kernel and its bits against
a push into a zeroed destination: tests/gpu/test_comm.py)."""

from __future__ import annotations

import gc
import types

import torch

from mok import _routes
from mok import functional as F


def _workspace(ep: int, tokens: int, topk: int, capacity: int):
    return types.SimpleNamespace(
        ep_size=ep, num_local_tokens=tokens, topk=topk, schedule_capacity=capacity
    )


def test_kept_while_the_schedule_lives():
    peer_rank = torch.zeros(4, dtype=torch.int32)
    routing = torch.tensor([[0, -1]], dtype=torch.int32)
    _routes.remember(_workspace(2, 1, 2, 4), peer_rank, routing)
    assert _routes.routing_of(peer_rank) is routing
    assert _routes.routing_of(torch.zeros(4, dtype=torch.int32)) is None
    key = id(peer_rank)
    del peer_rank
    gc.collect()
    assert key not in _routes._ROUTING


def test_not_kept_where_routes_can_be_dropped():
    peer_rank = torch.zeros(4, dtype=torch.int32)
    # EP 8, T 16, k 2: the worst case is 256 routed rows, the capacity only 128.
    _routes.remember(_workspace(8, 16, 2, 128), peer_rank, torch.zeros(16, 2, dtype=torch.int32))
    assert _routes.routing_of(peer_rank) is None


def test_build_schedule_keeps_its_routing(single_rank_group):
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=8,
                            hidden_size=128, topk=2)  # fmt: skip
    top = torch.tensor([[0, 1], [5, -1]] * 4)  # 2 experts: 5 and -1 are invalid ids
    schedule = F.build_schedule(ws, config, top, num_local_experts=2)
    kept = _routes.routing_of(schedule.peer_rank)
    assert kept is not None
    assert torch.equal(kept, torch.where((top >= 0) & (top < 2), top, -1).to(torch.int32))
    ws.status.zero_()
