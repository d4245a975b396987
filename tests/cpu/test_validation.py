"""Every argument check of build_schedule / forward / backward: the documented exception type,
a message naming the argument, and no buffer written when a check fails."""

from __future__ import annotations

import pytest
import torch

from mok import functional as F
from mok import ops

T, H, I, E, K = 16, 128, 128, 2, 2


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


@pytest.fixture
def setup(single_rank_group):
    config = F.MoKConfig()
    ws = F.create_workspace(
        config, single_rank_group, device="cpu", num_local_tokens=T, hidden_size=H, topk=K
    )
    schedule = F.build_schedule(ws, config, torch.randint(0, E, (T, K)), num_local_experts=E)
    args = {
        "x": _bf16(T, H),
        "router_weights": torch.rand(T, K),
        "shared_gate_weights": _bf16(I, H),
        "shared_up_weights": _bf16(I, H),
        "shared_down_weights": _bf16(H, I),
        "routed_gate_weights": _bf16(E, I, H),
        "routed_up_weights": _bf16(E, I, H),
        "routed_down_weights": _bf16(E, H, I),
    }
    return config, ws, schedule, args


SCHEDULE_ERRORS = {
    "int32-ids": (lambda te: te.int(), TypeError, "`top_experts` must be int64 \\[T, k\\]"),
    "wrong-T": (
        lambda te: te[:-1],
        ValueError,
        "`top_experts` must be int64 \\[T, k\\] = \\[16, 2\\]",
    ),
    "not-tensor": (lambda te: te.tolist(), TypeError, "`top_experts` must be a tensor"),
    "non-contiguous": (lambda te: te.T.contiguous().T, ValueError, "must be contiguous"),
}


@pytest.mark.parametrize("case", SCHEDULE_ERRORS.values(), ids=SCHEDULE_ERRORS.keys())
def test_build_schedule_errors(setup, case):
    config, ws, _, _ = setup
    change, error, fragment = case
    with pytest.raises(error, match=fragment):
        F.build_schedule(
            ws, config, change(torch.zeros(T, K, dtype=torch.int64)), num_local_experts=E
        )


def test_build_schedule_num_local_experts(setup):
    config, ws, _, _ = setup
    with pytest.raises(ValueError, match="`num_local_experts` must be in"):
        F.build_schedule(ws, config, torch.zeros(T, K, dtype=torch.int64), num_local_experts=0)


FORWARD_ERRORS = {
    "x-float32": ("x", lambda a: a.float(), TypeError, "`x` must be bf16 \\[T, H\\]"),
    "x-shape": (
        "x",
        lambda a: a[:, :64],
        ValueError,
        "`x` must be bf16 \\[T, H\\] = \\[16, 128\\], got bf16 \\[16, 64\\]",
    ),
    "rw-bf16": (
        "router_weights",
        lambda a: a.bfloat16(),
        TypeError,
        "`router_weights` must be float32",
    ),
    "rw-shape": (
        "router_weights",
        lambda a: a[:, :1],
        ValueError,
        "`router_weights` must be float32 \\[T, k\\]",
    ),
    "gate-shape": (
        "routed_gate_weights",
        lambda a: a[:, :, :64],
        ValueError,
        "`routed_gate_weights` must be bf16 \\[E, I, H\\]",
    ),
    "down-shape": (
        "routed_down_weights",
        lambda a: a[:, :, :64],
        ValueError,
        "`routed_down_weights` must be bf16 \\[E, H, I\\]",
    ),
    "up-dtype": (
        "routed_up_weights",
        lambda a: a.half(),
        TypeError,
        "`routed_up_weights` must be bf16",
    ),
    "experts-mismatch": (
        "routed_gate_weights",
        lambda a: torch.cat([a, a]),
        ValueError,
        r"`routed_gate_weights` holds 4 local experts \(bf16 \[4, 128, 128\] on cpu\) but "
        r"`schedule` was built for num_local_experts=2",
    ),
    "no-experts": (
        "routed_gate_weights",
        lambda a: a[:0],
        ValueError,
        r"`routed_gate_weights` holds 0 local experts",
    ),
    "shared-partial": (
        "shared_up_weights",
        lambda a: None,
        ValueError,
        r"`shared_up_weights` None but not the others: .* all None \(no shared expert\) or all",
    ),
    "gate-list-selects-mxfp8": (
        "routed_gate_weights",
        lambda a: a.tolist(),
        TypeError,
        r"`routed_up_weights` must be a 2-tuple in MXFP8 mode, got bf16 .* \(a tuple or list as "
        r"`routed_gate_weights` selects MXFP8 mode; BF16 mode takes three bf16 tensors\)",
    ),
    "shared-shape": (
        "shared_down_weights",
        lambda a: a[:64],
        ValueError,
        "`shared_down_weights` must be bf16 \\[H, I\\]",
    ),
    "mxfp8-tuple-size": (
        "routed_gate_weights",
        lambda a: (a,),
        TypeError,
        "must be a 2-tuple in MXFP8 mode",
    ),
}


@pytest.mark.parametrize("case", FORWARD_ERRORS.values(), ids=FORWARD_ERRORS.keys())
def test_forward_errors_write_nothing(setup, case):
    config, ws, schedule, args = setup
    name, change, error, fragment = case
    before = [t.clone() for t in (ws.x_buffer, ws.combine_buffer, ws.status)]
    with pytest.raises(error, match=fragment):
        F.forward(config, ws, schedule, **{**args, name: change(args[name])})
    after = (ws.x_buffer, ws.combine_buffer, ws.status)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(
    ("limit", "error"),
    [(-1.0, ValueError), (float("nan"), ValueError), ("1", TypeError)],
    ids=["negative", "nan", "string"],
)
def test_swiglu_limit(setup, limit, error):
    config, ws, schedule, args = setup
    with pytest.raises(error, match="`swiglu_limit`"):
        F.forward(config, ws, schedule, **args, swiglu_limit=limit)


def test_schedule_from_other_expert_count(setup):
    config, ws, _, args = setup
    other = F.build_schedule(ws, config, torch.zeros(T, K, dtype=torch.int64), num_local_experts=3)
    with pytest.raises(ValueError, match="rows but this workspace builds|local experts"):
        F.forward(config, ws, other, **args)


def test_backward_errors_write_nothing(setup):
    config, ws, schedule, args = setup
    out, ctx = F.forward(config, ws, schedule, **args)
    before = [t.clone() for t in (ws.d_y_buffer, ws.d_x_routed_buffer, ws.d_router_weight_buffer)]
    with pytest.raises(TypeError, match="`grad_output` must be bf16"):
        F.backward(config, ws, schedule, ctx, out.float(), **args)
    with pytest.raises(TypeError, match="`forward_context` must be a MoKForwardContext"):
        F.backward(config, ws, schedule, (), out, **args)
    with pytest.raises(TypeError, match="must be a 4-tuple in MXFP8 mode"):
        q = ops.mxfp8_quantize(args["routed_gate_weights"], True, False)[:2]
        F.backward(config, ws, schedule, ctx, out, **{**args, "routed_gate_weights": q})
    after = (ws.d_y_buffer, ws.d_x_routed_buffer, ws.d_router_weight_buffer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(
    ("args", "error", "fragment"),
    [
        ((torch.zeros(128, 128), True, False), TypeError, "bf16"),
        ((_bf16(100, 128), True, False), ValueError, "128"),
        ((_bf16(128, 128), False, False), ValueError, "at least one|both"),
    ],
    ids=["float32", "rows-100", "no-layout"],
)
def test_mxfp8_quantize_errors(args, error, fragment):
    with pytest.raises(error, match=fragment):
        ops.mxfp8_quantize(*args)


def test_check_status_argument():
    with pytest.raises(TypeError, match="`workspace` must be a MoKWorkspace"):
        F.check_status(None)


def test_fused_op_checks_its_own_arguments(setup):
    """The ops validate too (users call them directly): a bad shared weight, before any work."""
    config, ws, schedule, args = setup
    bad_down = args["shared_down_weights"][:64]
    with pytest.raises(ValueError, match="`shared_down_weights` must be bf16 \\[H, I\\]"):
        ops.dispatch_mlp_swiglu_combine_fwd_bf16(
            ws.x_buffer, ws.x_buffer_ptrs, ws.combine_buffer, ws.combine_buffer_ptrs,
            args["shared_gate_weights"], args["routed_gate_weights"], args["shared_up_weights"],
            args["routed_up_weights"], bad_down, args["routed_down_weights"],
            *schedule.as_tuple(), ws.topk, None, 8, 512, 256,
        )  # fmt: skip
    with pytest.raises(TypeError, match="`x` must be bf16"):
        ops.dispatch_mlp_swiglu_combine_fwd_bf16(
            ws.x_buffer.float(), ws.x_buffer_ptrs, ws.combine_buffer, ws.combine_buffer_ptrs,
            None, args["routed_gate_weights"], None, args["routed_up_weights"], None,
            args["routed_down_weights"], *schedule.as_tuple(), ws.topk, None, 8, 512, 256,
        )  # fmt: skip
