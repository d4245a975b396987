"""The eager functional API calls the ops' Python bodies directly (mok._custom_op.direct), not
through the torch dispatcher; under torch.compile it calls the ops (test_compile traces them)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mok import _custom_op, ops
from mok import functional as F

TOKENS, HIDDEN, INTER, EXPERTS, TOPK = 16, 128, 128, 2, 2


class RecordMokOps(TorchDispatchMode):
    """Names of the mok:: ops that reach the dispatcher inside the mode."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "mok":
            self.names.append(func.name())
        return func(*args, **(kwargs or {}))


def test_every_mok_op_has_a_direct_body():
    names = {op._name for op in _custom_op._BODIES}  # without the namespace
    for name in (
        "schedule",
        "all_gather_top_experts",
        "fwd_epilogue",
        "bwd_epilogue",
        "dispatch_mlp_swiglu_combine_fwd_bf16",
        "dispatch_mlp_swiglu_combine_bwd_mxfp8",
    ):
        assert name in names
    body = _custom_op.direct(ops.schedule_op)
    assert body is not ops.schedule_op and body.__name__ == "schedule_op"


def test_direct_is_the_op_while_compiling(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _custom_op.direct(ops.schedule_op) is ops.schedule_op


def test_eager_step_bypasses_the_dispatcher(single_rank_group):
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=TOKENS,
                            hidden_size=HIDDEN, topk=TOPK)  # fmt: skip
    g = torch.Generator().manual_seed(3)
    top = torch.randint(0, EXPERTS, (TOKENS, TOPK), generator=g)
    x = torch.randn(TOKENS, HIDDEN, generator=g).bfloat16()
    rw = torch.rand(TOKENS, TOPK, generator=g)
    routed = [torch.randn(EXPERTS, INTER, HIDDEN, generator=g).bfloat16() / 16 for _ in range(2)]
    routed.append(torch.randn(EXPERTS, HIDDEN, INTER, generator=g).bfloat16() / 16)
    with RecordMokOps() as mode:
        schedule = F.build_schedule(ws, config, top, num_local_experts=EXPERTS)
        out, ctx = F.forward(config, ws, schedule, x, rw, None, None, None, *routed)
        F.backward(config, ws, schedule, ctx, x, x, rw, None, None, None, *routed)
    assert mode.names == []
    with RecordMokOps() as mode:  # the op itself does reach it: the mode sees what it should
        ops.schedule(ws.all_gather_top_experts_buffer, EXPERTS, 256, 0, ws.status)
    assert mode.names == ["mok::schedule"]


@pytest.mark.parametrize("bad", [[-1, 0], [0, 2], [2**40, 1]], ids=str)
def test_reference_routing_marks_invalid_ids(bad):
    from mok import status
    from mok.backends import reference

    word = torch.zeros(1, dtype=torch.int32)
    ids = torch.tensor([[1, 0], bad], dtype=torch.int64)
    got = reference.routing(ids, 2, word)
    want = [[1, 0], [v if 0 <= v < 2 else -1 for v in bad]]
    assert got.dtype == torch.int32 and got.tolist() == want
    assert int(word) == status.INVALID_EXPERT_ID


def test_build_schedule_routing_is_traceable_while_compiling(monkeypatch):
    """Under torch.compile the routing takes the torch ops even where the CUDA kernel would
    serve eagerly (a raw launch cannot be traced)."""
    from mok import schedule
    from mok.backends import reference

    calls = []
    monkeypatch.setattr(schedule.backends, "uses_cuda", lambda device: True)
    monkeypatch.setattr(reference, "routing", lambda *args: calls.append(args) or "torch ops")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    ids = torch.zeros((2, 2), dtype=torch.int64)
    assert schedule._routing(ids, 4, torch.zeros(1, dtype=torch.int32)) == "torch ops"
    assert len(calls) == 1


def test_fused_op_bodies_skip_only_the_checks_their_caller_made(monkeypatch):
    """mok.functional calls the fused ops' bodies through `call_validated` after checking
    every argument: inside, `check_pass` is a no-op; anywhere else it raises for bad input, and
    under torch.compile the op itself is called."""
    seen = []
    op = ops.dispatch_mlp_swiglu_combine_fwd_bf16
    monkeypatch.setitem(_custom_op._BODIES, op, lambda *a: seen.append(a) or _check_bad_x())
    assert _custom_op.call_validated(op, 7) is None and seen == [(7,)]
    assert not _custom_op.arguments_validated()  # only during the call
    with pytest.raises(TypeError, match="`x` must be bf16"):
        _check_bad_x()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = []
    monkeypatch.setattr(ops, "dispatch_mlp_swiglu_combine_fwd_bf16", lambda *a: traced.append(a))
    _custom_op.call_validated(ops.dispatch_mlp_swiglu_combine_fwd_bf16, 8)
    assert traced == [(8,)] and seen == [(7,)]


def _check_bad_x():
    """check_pass on a float32 x: raises unless inside `validated()`."""
    from mok._moe_ops import check_pass

    bad = torch.zeros(2, 2)
    buffer = ("combine_buffer", bad)
    return check_pass(bad, (), 2, None, (), (), buffer, mxfp8=False, backward=False)


def test_one_rank_schedules_without_the_all_gather(single_rank_group, monkeypatch):
    """At EP 1 a rank's routing is the whole all-gather: build_schedule hands it to the
    schedule without the copy, and the schedule is the one the all-gathered copy gives."""
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=TOKENS,
                            hidden_size=HIDDEN, topk=TOPK)  # fmt: skip
    top = torch.randint(0, EXPERTS, (TOKENS, TOPK), generator=torch.Generator().manual_seed(5))
    gather, gathers = ops.all_gather_top_experts, []
    body = _custom_op._BODIES[gather]
    monkeypatch.setitem(_custom_op._BODIES, gather, lambda *a: gathers.append(a) or body(*a))
    got = F.build_schedule(ws, config, top, num_local_experts=EXPERTS)
    assert gathers == []
    chunk = config.all_gather_top_experts_chunk_bytes
    gather(top.int(), ws.all_gather_top_experts_buffer, 0, 0, chunk, ws.group_name)
    rows = ws.schedule_rows(EXPERTS)
    want = ops.schedule(ws.all_gather_top_experts_buffer, EXPERTS, rows, 0, ws.status)
    for name, a, b in zip(("peer_rank", "peer_token_idx", "num_tokens", "tokens"), got.as_tuple(),
                          want, strict=True):  # fmt: skip
        assert torch.equal(a, b), name
