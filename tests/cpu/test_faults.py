"""Faults stay contained (issue 48): a bad value reaches only what float64 autograd says it
reaches, on the reference backend at EP 1."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from distributed import run_on_ranks
from fault_workers import create_with_rank_multiplier, gather_out_of_step

from mok import MoELayer, ops
from mok import functional as F

TOKENS, HIDDEN, INTER, EXPERTS, TOPK = 8, 128, 128, 4, 1


def _weights(gen):
    def w(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).bfloat16()

    return w(EXPERTS, INTER, HIDDEN), w(EXPERTS, INTER, HIDDEN), w(EXPERTS, HIDDEN, INTER)


def test_a_non_finite_token_reaches_only_its_experts_weight_gradients(single_rank_group):
    """Token 0 holds a NaN and goes to expert 0 alone; experts 1-3 keep finite gradients
    (the masked weight-gradient product once let 0 * NaN into every expert's)."""
    gen = torch.Generator().manual_seed(0)
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=TOKENS,
                            hidden_size=HIDDEN, topk=TOPK)  # fmt: skip
    top = torch.tensor([[0], [1], [2], [3], [1], [2], [3], [1]])
    x = torch.randn(TOKENS, HIDDEN, generator=gen).bfloat16()
    x[0, 5] = float("nan")
    rw = torch.rand(TOKENS, TOPK, generator=gen)
    routed = _weights(gen)
    schedule = F.build_schedule(ws, config, top, num_local_experts=EXPERTS)
    out, ctx = F.forward(config, ws, schedule, x, rw, None, None, None, *routed)
    grad = torch.randn(TOKENS, HIDDEN, generator=gen).bfloat16()
    grads = F.backward(config, ws, schedule, ctx, grad, x, rw, None, None, None, *routed)
    for name, g in zip(("gate", "up", "down"), grads[2:5], strict=True):
        assert not torch.isfinite(g[0]).all(), f"d_{name}[0] should see the NaN token"
        assert torch.isfinite(g[1:]).all(), f"d_{name} of experts 1-3 got the NaN"
    assert torch.isfinite(out[1:]).all() and torch.isfinite(grads[0][1:]).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"group": "x"}, TypeError, r"`group` must be a ProcessGroup, got str"),
        ({"config": "bogus"}, TypeError, r"`config` must be a MoKConfig, got str"),
        ({"mxfp8": "no"}, TypeError, r"`mxfp8` must be a bool, got str"),
        ({"shared_expert": 1}, TypeError, r"`shared_expert` must be a bool, got int"),
        ({"device": "cpu:1"}, ValueError, r"`device` must be 'cpu' \(there is one CPU device\)"),
    ],
    ids=["group", "config", "mxfp8", "shared_expert", "device"],
)
def test_layer_arguments_are_checked_at_construction(single_rank_group, kwargs, error, message):
    with pytest.raises(error, match=message):
        MoELayer(HIDDEN, INTER, EXPERTS, TOPK, **kwargs)


def test_a_huge_capacity_multiplier_is_named():
    """multiplier * EP * T * k once overflowed (math.ceil of inf) with an error naming nothing;
    the capacity is computed exactly and one beyond what an op can take names the field."""
    config = F.MoKConfig(schedule_capacity_multiplier=1e308)
    with pytest.raises(ValueError, match=r"`schedule_capacity_multiplier` must be at most "
                       r"140737488355328 at EP 8, T 512, k 8 .* got 1e\+308"):  # fmt: skip
        config.schedule_capacity(8, 512, 8)
    assert F.MoKConfig(schedule_capacity_multiplier=1e6).schedule_capacity(8, 512, 8) == (
        512 * 8 * 8_000_000
    )


@pytest.mark.parametrize("weight", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_an_invalid_route_contributes_zero_whatever_its_weight(single_rank_group, weight):
    """Expert id 99 does not exist: the route adds exactly nothing, even with a NaN or Inf
    router weight (its weight once multiplied the zero row into NaN)."""
    gen = torch.Generator().manual_seed(1)
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=TOKENS,
                            hidden_size=HIDDEN, topk=2)  # fmt: skip
    top = torch.tensor([[0, 99], [1, 2], [2, 3], [3, 0]] * 2)
    x = torch.randn(TOKENS, HIDDEN, generator=gen).bfloat16()
    rw = torch.rand(TOKENS, 2, generator=gen)
    routed = _weights(gen)
    outs = []
    for bad in (weight, 0.0):
        rw[0, 1] = bad
        schedule = F.build_schedule(ws, config, top, num_local_experts=EXPERTS)
        outs.append(F.forward(config, ws, schedule, x, rw, None, None, None, *routed)[0])
    ws.status.zero_()
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])


def test_backward_refuses_a_context_of_another_schedule(single_rank_group):
    """A context made with one schedule, handed to backward with another of the same shapes,
    once gave gradients off by 1.2-2.1x; now it is a clear error."""
    gen = torch.Generator().manual_seed(2)
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=TOKENS,
                            hidden_size=HIDDEN, topk=TOPK)  # fmt: skip
    x = torch.randn(TOKENS, HIDDEN, generator=gen).bfloat16()
    rw = torch.rand(TOKENS, TOPK, generator=gen)
    routed = _weights(gen)
    first = F.build_schedule(ws, config, torch.arange(TOKENS)[:, None] % EXPERTS,
                             num_local_experts=EXPERTS)  # fmt: skip
    other = F.build_schedule(ws, config, torch.arange(TOKENS)[:, None] // 2 % EXPERTS,
                             num_local_experts=EXPERTS)  # fmt: skip
    _, ctx = F.forward(config, ws, first, x, rw, None, None, None, *routed)
    with pytest.raises(ValueError, match="made by forward with another schedule"):
        F.backward(config, ws, other, ctx, x, x, rw, None, None, None, *routed)


# MoKWorkspace's fields that mok adds to the original's (all with defaults).
MOK_FIELDS = ("status", "capacity_multiplier", "peer_ptr_tables", "status_gather_buffer",
              "status_gather_buffer_handle", "status_gather_buffer_ptrs", "host_group")  # fmt: skip


def test_ranks_with_different_capacity_multipliers_are_refused_at_creation():
    """At EP 3 a rank with another schedule_capacity_multiplier once crashed (SIGABRT) in the
    collectives of its first step; creation now compares it on every rank."""
    errors = run_on_ranks(create_with_rank_multiplier, 3, timeout_s=120, collective_timeout_s=60)
    assert all(e and "same MoKConfig.schedule_capacity_multiplier" in e for e in errors), errors


def test_ranks_out_of_step_are_an_error_on_every_rank_not_a_mix():
    """Ranks that exchange different tensors of one shape at the same point once summed one
    rank's x rows with another's d_y rows (a silently wrong output); every exchange of the
    reference now compares what each rank exchanges first."""
    errors = run_on_ranks(gather_out_of_step, 3, timeout_s=120, collective_timeout_s=60)
    assert all(e and "out of step" in e for e in errors), errors


@pytest.mark.parametrize(("bad_id", "recorded"), [(8, True), (-2, True), (-1, False)])
def test_ops_schedule_records_an_id_outside_the_group(bad_id, recorded):
    """ops.schedule once skipped ids >= EP * E without a word; -1 marks a route that
    build_schedule already found invalid (and recorded)."""
    topk_all = torch.zeros(2, 4, 1, dtype=torch.int32)  # EP 2, T 4, k 1; E 4: ids 0-7
    topk_all[1, 2, 0] = bad_id
    status = torch.zeros(1, dtype=torch.int32)
    rows = ops.schedule(topk_all, 4, 2048, 0, status)
    assert bool(int(status) & 1) == recorded
    assert int((rows[0] >= 0).sum()) == 7, "the other routes are still scheduled"


def test_the_originals_call_forms_take_the_workspace_fields(single_rank_group):
    """The original's code passes the workspace's multicast fields to the ops, which take an
    int (they once held None: a schema error), and builds MoKWorkspace from its own fields
    alone (mok's status word once had no default)."""
    config = F.MoKConfig()
    ws = F.create_workspace(config, single_rank_group, device="cpu", num_local_tokens=TOKENS,
                            hidden_size=HIDDEN, topk=2)  # fmt: skip
    routing = torch.zeros(TOKENS, 2, dtype=torch.int32)
    ops.all_gather_top_experts(routing, ws.all_gather_top_experts_buffer,
                               ws.all_gather_top_experts_buffer_multicast_ptr, 0, 2048,
                               ws.group_name)  # fmt: skip
    ops.barrier_all(ws.barrier_buffer, ws.barrier_buffer_ptrs, ws.barrier_buffer_multicast_ptr,
                    ws.barrier_target, ws.group_name)  # fmt: skip
    originals = {f.name: getattr(ws, f.name) for f in dataclasses.fields(ws)
                 if f.name not in MOK_FIELDS}  # fmt: skip
    rebuilt = F.MoKWorkspace(**originals)
    assert rebuilt.status.dtype == torch.int32 and int(rebuilt.status) == 0


def test_a_wrong_dtype_is_both_a_type_and_a_value_error():
    with pytest.raises(TypeError) as caught:
        ops.fwd_epilogue(None, torch.zeros(8, 128), torch.zeros(4, 2))
    assert isinstance(caught.value, ValueError)


def test_an_epilogue_of_no_routes_per_token_is_refused():
    """k = 0 once ended in a ZeroDivisionError."""
    with pytest.raises(
        ValueError, match=r"`k \(topk_weights.shape\[1\]\)` must be in \[1, 255\], got 0"
    ):
        ops.fwd_epilogue(None, torch.zeros(8, 128, dtype=torch.bfloat16), torch.zeros(4, 0))


@pytest.mark.parametrize("rank", [-1, 2], ids=["negative", "past-the-group"])
def test_a_schedule_for_a_rank_outside_the_group_is_refused(rank):
    """Rank -1 once scheduled every invalid route as a real row."""
    topk_all = torch.zeros(2, 4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"`rank` must be in \[0, 1\], got {rank}"):
        ops.schedule(topk_all, 2, 4096, rank, torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize(
    "status",
    [torch.zeros(1, dtype=torch.float32), torch.zeros(2, dtype=torch.int32)],
    ids=["float32", "two-words"],
)
def test_the_schedule_op_checks_its_status_word(status):
    """The backends launch without checking (the entries do): the op's word is the op's to check,
    or the CUDA kernel would OR into whatever it was given."""
    topk_all = torch.zeros(1, 4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"`status` must be int32 \[1\]"):
        ops.schedule(topk_all, 2, 4096, 0, status)


@pytest.mark.parametrize(
    ("variable", "value"), [("MOK_COMM_TIMEOUT_S", "soon"), ("MOK_GROUPED_GEMM", "cublas")]
)
def test_a_bad_setting_is_an_error_on_every_backend(single_rank_group, monkeypatch, variable,
                                                    value):  # fmt: skip
    """Off CUDA these were never read, so a bad value passed silently."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        F.create_workspace(F.MoKConfig(), single_rank_group, device="cpu",
                           num_local_tokens=TOKENS, hidden_size=HIDDEN, topk=TOPK)  # fmt: skip


@pytest.mark.parametrize("fault", ["build_schedule", "forward", "backward"])
def test_a_rank_failing_validation_is_every_ranks_error_at_once(fault):
    """A gloo rank whose arguments fail validation once left its peers waiting for the process
    group's timeout (30 minutes by default), and a retry then crashed; it now tells them, so
    every rank raises at once, names the rank and its error, and the group's retry is clean."""
    from fault_workers import last_rank_fails_validation

    results = run_on_ranks(last_rank_fails_validation, 3, fault, timeout_s=240,
                           collective_timeout_s=90)  # fmt: skip
    *peers, last = results
    assert last[0], "the last rank's own error"
    for error, elapsed, _ in peers:
        assert error and "rank 2 of the EP group raised before this exchange" in error, error
        assert last[0] in error, "the peers see the failing rank's error"
        assert elapsed < 45, f"waited {elapsed:.0f} s: the process group's timeout, not a notice"
    assert all(isinstance(r[2], float) and r[2] == r[2] for r in results), "retry failed"


def test_reference_exchanges_honour_the_comm_timeout():
    """MOK_COMM_TIMEOUT_S once bounded only the CUDA kernels' waits; where it is set, the
    reference's collectives give up after it too, with a clear error."""
    from fault_workers import last_rank_never_arrives

    results = run_on_ranks(last_rank_never_arrives, 2, 2.0, timeout_s=120,
                           collective_timeout_s=90)  # fmt: skip
    error, elapsed = results[0]
    assert "waited 2 s (MOK_COMM_TIMEOUT_S)" in error, error
    assert elapsed < 20
