"""The eager functional API calls the registry's backend and mok.passes directly, not the ops
through the torch dispatcher; under torch.compile it calls the ops (test_compile)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mok import backends, ops
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


def test_every_mok_op_is_registered():
    for name in (
        "schedule",
        "all_gather_top_experts",
        "barrier_all",
        "mxfp8_quantize",
        "fwd_epilogue",
        "bwd_epilogue",
        "dispatch_mlp_swiglu_combine_fwd_bf16",
        "dispatch_mlp_swiglu_combine_fwd_mxfp8",
        "dispatch_mlp_swiglu_combine_bwd_bf16",
        "dispatch_mlp_swiglu_combine_bwd_mxfp8",
    ):
        assert hasattr(torch.ops.mok, name), name


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
    from mok.backends.reference import schedule as reference_schedule

    word = torch.zeros(1, dtype=torch.int32)
    ids = torch.tensor([[1, 0], bad], dtype=torch.int64)
    got = reference_schedule.routing(ids, 2, word)
    want = [[1, 0], [v if 0 <= v < 2 else -1 for v in bad]]
    assert got.dtype == torch.int32 and got.tolist() == want
    assert int(word) == status.INVALID_EXPERT_ID


def test_build_schedule_routing_is_traceable_while_compiling(monkeypatch):
    """Under torch.compile the routing takes the torch ops even where the CUDA kernel would
    serve eagerly (a raw launch cannot be traced): the registry hands out the reference."""
    from mok.backends.reference import kernels

    calls = []
    monkeypatch.setattr(backends, "uses_cuda", lambda device: True)
    monkeypatch.setattr(kernels, "routing", lambda *args: calls.append(args) or "torch ops")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    ids = torch.zeros((2, 2), dtype=torch.int64)
    assert F._routing(ids, 4, torch.zeros(1, dtype=torch.int32)) == "torch ops"
    assert len(calls) == 1


def test_fused_op_bodies_always_check_their_arguments():
    """The fused ops are a public entry: their bodies check every argument (mok.functional
    checks once and calls mok.passes itself, not the bodies)."""
    with pytest.raises(TypeError, match="`x` must be bf16"):
        _check_bad_x()


def _check_bad_x():
    """check_pass on a float32 x."""
    from mok.ops.fused_forward import check_pass

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
    backend = backends.for_device(ws.device)
    body = backend.all_gather_top_experts
    monkeypatch.setattr(backend, "all_gather_top_experts", lambda *a: gathers.append(a) or body(*a))
    got = F.build_schedule(ws, config, top, num_local_experts=EXPERTS)
    assert gathers == []
    chunk = config.all_gather_top_experts_chunk_bytes
    gather(top.int(), ws.all_gather_top_experts_buffer, 0, 0, chunk, ws.group_name)
    rows = ws.schedule_rows(EXPERTS)
    want = ops.schedule(ws.all_gather_top_experts_buffer, EXPERTS, rows, 0, ws.status)
    for name, a, b in zip(("peer_rank", "peer_token_idx", "num_tokens", "tokens"), got.as_tuple(),
                          want, strict=True):  # fmt: skip
        assert torch.equal(a, b), name
