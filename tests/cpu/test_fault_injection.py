"""Fault injection at EP 2 and 3 (issue 48): one rank gets a bad or divergent argument, or a call
sequence that differs from its peers', and the step must end in a clear error on the caller
within the group's timeout, or in a correct result — never a silently wrong one, a crash (an
error that names nothing) or a hang.

The ranks are threads of this process (mok.testing.OneDeviceGroup on the CPU, reference
backend). Each fault lands on the last rank. A "clear" error is a ValueError / TypeError naming
the argument, a MoKDeviceError from check_status on every rank, or a HostGroupError (what the
other ranks see of one rank's error). A "correct" result matches the same step without the fault
wherever the fault cannot reach (and reaches only what float64 autograd says it does).
"""

from __future__ import annotations

import re
import threading

import pytest
import torch
from fault_helpers import spoiled
from moe_oracle import same_bits
from moe_scenarios import CONFIG_KWARGS, HIDDEN, LOCAL_EXPERTS, SCENARIOS, TOPK, _local, make_inputs

from mok import MoKDeviceError
from mok import functional as F
from mok.testing import HostGroupError, OneDeviceGroup

SCENARIO = "bf16-shared-clamp"
HANG_S = 60  # a run that has not returned by then is a hang
CLEAR = (ValueError, TypeError, MoKDeviceError, HostGroupError)


def _step(ws, config, args, *, forward_twice=False, ctx_of_other=False, spoil_schedule=False):
    """schedule, forward, backward with `args` (a dict of this rank's arguments)."""
    schedule = F.build_schedule(ws, config, args["top"], num_local_experts=args["experts"])
    if spoil_schedule:  # a hand-built copy with one row's token index out of range
        schedule = spoiled(schedule, "negative-token-index")
    weights = (*args["shared"], *args["routed"])
    out, ctx = F.forward(config, ws, schedule, args["x"], args["rw"], *weights,
                         swiglu_limit=args["limit"])  # fmt: skip
    if forward_twice:
        out, ctx = F.forward(config, ws, schedule, args["x"], args["rw"], *weights,
                             swiglu_limit=args["limit"])  # fmt: skip
    if ctx_of_other:
        schedule = F.build_schedule(ws, config, args["top"].flip(0), num_local_experts=4)
    grads = F.backward(config, ws, schedule, ctx, args["grad"], args["x"], args["rw"], *weights,
                       swiglu_limit=args["limit"])  # fmt: skip
    F.check_status(ws)
    return [out, *grads]


def _arguments(inputs, rank):
    top, x, rw, grad, shared, routed = _local(inputs, rank)
    return {"top": top, "x": x, "rw": rw, "grad": grad, "shared": shared, "routed": routed,
            "experts": LOCAL_EXPERTS, "limit": SCENARIOS[SCENARIO].limit}  # fmt: skip


def _bad(name, value):
    return lambda args: {**args, name: value(args[name])}


# name: (change to the last rank's arguments, step options, expected: "error" + message regex,
# or "correct")
FAULTS = {
    "top_experts of another shape": (_bad("top", lambda t: t[:-1]), {}, r"top_experts"),
    "top_experts int32": (_bad("top", lambda t: t.int()), {}, r"top_experts"),
    "x float32": (_bad("x", lambda t: t.float()), {}, r"`x`"),
    "x of another hidden size": (_bad("x", lambda t: t[:, :-8]), {}, r"`x`"),
    "router_weights bf16": (_bad("rw", lambda t: t.bfloat16()), {}, r"router_weights"),
    "grad of another shape": (_bad("grad", lambda t: t[:-1]), {}, r"grad"),
    "one expert weight missing": (
        _bad("routed", lambda w: tuple(t[:-1] for t in w)),
        {},
        r"routed",
    ),
    "negative swiglu_limit": (_bad("limit", lambda v: -1.0), {}, r"swiglu_limit"),
    "another num_local_experts": (_bad("experts", lambda e: e + 1), {}, r"num_local_experts"),
    "expert id past the last": (
        _bad("top", lambda t: t.clone().fill_(10**6)),
        {},
        r"expert id outside",
    ),  # fmt: skip
    "forward called twice": (lambda a: a, {"forward_twice": True}, r"out of step"),
    "context of another schedule": (
        lambda a: a,
        {"ctx_of_other": True},
        r"out of step",
    ),
    "hand-built schedule out of range": (
        lambda a: a,
        {"spoil_schedule": True},
        r"a schedule not made by build_schedule",
    ),
    "NaN token": (
        _bad("x", lambda t: t.clone().index_fill_(0, torch.tensor([0]), float("nan"))),
        {},
        "correct",
    ),  # fmt: skip
    "Inf router weight of an invalid route": (
        lambda a: {
            **a,
            "top": a["top"].clone().index_fill_(0, torch.tensor([1]), -1),
            "rw": a["rw"].clone().index_fill_(0, torch.tensor([1]), float("inf")),
        },
        {},
        r"expert id outside",
    ),  # fmt: skip
}


class Outcome:
    """What one injected run did: ('error', exception), ('result', per-rank outputs) or hang."""

    def __init__(self, group, step):
        self.kind, self.value = "hang", None
        worker = threading.Thread(target=self._run, args=(group, step), daemon=True)
        worker.start()
        worker.join(HANG_S)

    def _run(self, group, step):
        try:
            self.kind, self.value = "result", group.run(step)
        except BaseException as error:  # classified by the test
            self.kind, self.value = "error", error


def _inject(ep, fault):
    change, options, _ = FAULTS[fault]
    inputs = make_inputs(SCENARIO, ep)
    config = F.MoKConfig(**CONFIG_KWARGS)
    group = OneDeviceGroup(ep, config, device="cpu", num_local_tokens=SCENARIOS[SCENARIO].tokens,
                           hidden_size=HIDDEN, topk=TOPK, timeout_s=20)  # fmt: skip

    def step(rank, ws):
        args = _arguments(inputs, rank)
        faulty = change(args) if rank == ep - 1 else args
        return _step(ws, config, faulty, **(options if rank == ep - 1 else {}))

    return Outcome(group, step), group, (config, inputs)


@pytest.mark.parametrize("fault", [f for f, (_, _, want) in FAULTS.items() if want != "correct"])
@pytest.mark.parametrize("ep", [2, 3])
def test_a_fault_is_a_clear_error(ep, fault):
    outcome, group, (config, inputs) = _inject(ep, fault)
    assert outcome.kind != "hang", f"{fault}: no answer within {HANG_S} s"
    assert outcome.kind == "error", f"{fault}: silently accepted"
    error = outcome.value
    assert isinstance(error, CLEAR), f"{fault}: {type(error).__name__}: {error}"
    assert re.search(FAULTS[fault][2], str(error)), str(error)
    # Nothing is left broken: the same group runs a clean step afterwards.
    clean = group.run(lambda rank, ws: _step(ws, config, _arguments(inputs, rank)))
    assert all(torch.isfinite(r[0]).all() for r in clean)


@pytest.mark.parametrize("ep", [2, 3])
def test_a_nan_token_reaches_only_what_it_touches(ep):
    outcome, group, (config, inputs) = _inject(ep, "NaN token")
    assert outcome.kind == "result", f"NaN token: {outcome.kind} {outcome.value}"
    clean = group.run(lambda rank, ws: _step(ws, config, _arguments(inputs, rank)))
    for rank, (got, want) in enumerate(zip(outcome.value, clean, strict=True)):
        out, d_x = got[0], got[1]
        if rank == ep - 1:  # the poisoned token's own output (its d_x follows the clamp masks)
            assert not torch.isfinite(out[0]).all()
            out, d_x, want = out[1:], d_x[1:], [want[0][1:], want[1][1:]]
        assert same_bits(out, want[0]), f"rank {rank}: another token's output changed"
        assert same_bits(d_x, want[1]), f"rank {rank}: another token's d_x changed"
