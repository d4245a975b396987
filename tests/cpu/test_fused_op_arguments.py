"""The fused ops called directly (as through torch.ops, without mok.functional's checks) check
what ties their arguments together: k against the per-route buffer's rows, and the schedule's
expert count against the weights'. On the CPU these once ran on: a k of 3 over a buffer of k =
2's rows, a schedule of 3 experts over weights of 2. They also check the launch parameters as
the original does (one comm SM, a minibatch of 128, a macrobatch of 384 and short pointer lists
once passed)."""

from __future__ import annotations

import pytest
import torch
from step_setup import single_rank_step

from mok import ops

T, H, I, E, K = 16, 128, 128, 2, 2


def _bf16(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.fixture
def forward_args(single_rank_group):
    _, ws, schedule = single_rank_step(
        single_rank_group, tokens=T, hidden=H, topk=K, experts=E, seed=2
    )
    ws.x_buffer.copy_(_bf16(T, H, seed=1))
    return {
        "x": ws.x_buffer, "x_ptrs": ws.x_buffer_ptrs, "combine_buffer": ws.combine_buffer,
        "combine_buffer_ptrs": ws.combine_buffer_ptrs, "w_shared_gate": None,
        "w_routed_gate": _bf16(E, I, H, seed=2), "w_shared_up": None,
        "w_routed_up": _bf16(E, I, H, seed=3), "w_shared_down": None,
        "w_routed_down": _bf16(E, H, I, seed=4), "schedule_peer_rank": schedule.peer_rank,
        "schedule_peer_token_idx": schedule.peer_token_idx, "num_tokens": schedule.num_tokens,
        "tokens_per_expert": schedule.tokens_per_expert, "topk": K, "swiglu_limit": None,
        "num_comm_sms": 40, "macrobatch_size": 131072, "minibatch_size": 4096,
    }  # fmt: skip


def test_consistent_arguments_run(forward_args):
    outputs = ops.dispatch_mlp_swiglu_combine_fwd_bf16(**forward_args)
    assert outputs[-1].shape == (forward_args["schedule_peer_rank"].shape[0], H)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"topk": 3}, r"`combine_buffer` must be bf16 \[T \* k, H\] = \[48, 128\], got bf16 "
         r"\[32, 128\]"),
        ({"combine_buffer": torch.zeros(T * K + 1, H, dtype=torch.bfloat16)},
         r"`combine_buffer` must be bf16 \[T \* k, H\] = \[32, 128\], got bf16 \[33, 128\]"),
        ({"tokens_per_expert": torch.full((3,), 256, dtype=torch.int32)},
         r"`routed_gate_weights` holds 2 local experts .* but `schedule` was built for "
         r"num_local_experts=3"),
        ({"num_comm_sms": 1}, r"`num_comm_sms` must be a multiple of 2 and >= 1, got 1"),
        ({"minibatch_size": 128}, r"`minibatch_size` must be a multiple of 256 and >= 1, got 128"),
        ({"macrobatch_size": 384, "minibatch_size": 256},
         r"`macrobatch_size` must be a multiple of 256 and >= 1, got 384"),
        ({"x_ptrs": []}, r"`x_ptrs` must hold one address per rank of the group \(1\), got 0"),
        ({"mok_config": "overlap_ctas=0"},
         r"`mok_config` must be a JSON object of MoKConfig fields"),
        ({"mok_config": '{"overlap_ctas": -2}'},
         r"`mok_config`: `overlap_ctas` must be >= 0, got -2"),
        ({"mok_config": '{"ctas": 2}'}, r"`mok_config`: .*ctas"),
    ],
    ids=["k-against-the-buffer", "buffer-rows", "schedule-experts", "one-comm-sm",
         "minibatch-128", "macrobatch-384", "pointer-list-short", "config-not-json",
         "config-bad-value", "config-unknown-field"],
)  # fmt: skip
def test_inconsistent_arguments_are_named(forward_args, change, message):
    with pytest.raises(ValueError, match=message):
        ops.dispatch_mlp_swiglu_combine_fwd_bf16(**{**forward_args, **change})


def test_the_config_reaches_the_engine(forward_args, monkeypatch):
    """mok's `mok_config` argument gives the pass its speed knobs (what mok.functional passes
    under torch.compile); without it the engine gets the defaults."""
    from mok import backends
    from mok.backends.reference import kernels
    from mok.config import MoKConfig

    seen, original = [], kernels.op_engine

    def recording(buffers, x_ptrs, topk, group_name, config=None):
        seen.append(config)
        return original(buffers, x_ptrs, topk, group_name, config)

    monkeypatch.setattr(kernels, "op_engine", recording)
    assert backends.for_device(torch.device("cpu")).op_engine is recording
    config = MoKConfig(overlap_ctas=8, grouped_gemm="torch")
    ops.dispatch_mlp_swiglu_combine_fwd_bf16(**forward_args, mok_config=config.to_json())
    ops.dispatch_mlp_swiglu_combine_fwd_bf16(**forward_args, mok_config=config.speed_json())
    ops.dispatch_mlp_swiglu_combine_fwd_bf16(**forward_args)
    assert seen == [config, config, MoKConfig()]
