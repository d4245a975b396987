"""Workspaces: fields, the cache (reuse and isolation), errors before any collective."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mok import functional as F
from mok.backends.cuda import comm

SIZES = {"num_local_tokens": 16, "hidden_size": 128, "topk": 2}


def test_fields_and_buffers(single_rank_group):
    ws = F.create_workspace(F.MoKConfig(), single_rank_group, device="cpu", **SIZES)
    assert (ws.ep_rank, ws.ep_size, ws.device) == (0, 1, torch.device("cpu"))
    assert ws.x_buffer.shape == (16, 128) and ws.x_buffer.dtype == torch.bfloat16
    assert ws.combine_buffer.shape == (32, 128)
    assert ws.d_x_routed_buffer.shape == (32, 128)
    assert ws.router_weight_buffer.dtype == torch.float32
    assert ws.d_router_weight_buffer.shape == (16, 2)
    assert ws.all_gather_top_experts_buffer.shape == (1, 16, 2)
    assert ws.x_buffer_ptrs == [0] and ws.x_buffer_handle is None
    assert ws.barrier_buffer_multicast_ptr == 0
    assert ws.schedule_capacity == 16 * 2 * 2  # the original's T * k * max(2, ceil(EP * 0.5))
    assert ws.schedule_rows(3) == 256 + 3 * 256


def test_get_workspace_reuses_same_key(single_rank_group):
    config = F.MoKConfig()
    first = F.get_workspace(config, single_rank_group, device="cpu", **SIZES)
    again = F.get_workspace(
        F.MoKConfig(minibatch_size=256, macrobatch_size=512),
        single_rank_group,
        device="cpu",
        **SIZES,
    )
    assert first is again


@pytest.mark.parametrize(
    "change",
    [{"num_local_tokens": 32}, {"hidden_size": 256}, {"topk": 3}, {"multiplier": 1.0}],
    ids=["tokens", "hidden", "topk", "capacity-multiplier"],
)
def test_get_workspace_isolates_keys(single_rank_group, change):
    sizes = {**SIZES, **{k: v for k, v in change.items() if k != "multiplier"}}
    config = F.MoKConfig(schedule_capacity_multiplier=change.get("multiplier", 0.5))
    base = F.get_workspace(F.MoKConfig(), single_rank_group, device="cpu", **SIZES)
    other = F.get_workspace(config, single_rank_group, device="cpu", **sizes)
    assert other is not base
    assert other.x_buffer.data_ptr() != base.x_buffer.data_ptr()


def test_create_workspace_is_uncached(single_rank_group):
    cached = F.get_workspace(F.MoKConfig(), single_rank_group, device="cpu", **SIZES)
    fresh = F.create_workspace(F.MoKConfig(), single_rank_group, device="cpu", **SIZES)
    assert fresh is not cached


def test_clear_workspace_cache(single_rank_group):
    first = F.get_workspace(F.MoKConfig(), single_rank_group, device="cpu", **SIZES)
    F.clear_workspace_cache()
    assert F.get_workspace(F.MoKConfig(), single_rank_group, device="cpu", **SIZES) is not first


@pytest.mark.parametrize(
    ("change", "error", "fragment"),
    [
        ({"num_local_tokens": 0}, ValueError, "`num_local_tokens` must be >= 1, got 0"),
        ({"hidden_size": 192}, ValueError, "`hidden_size` must be a multiple of 128"),
        ({"topk": 0}, ValueError, r"`topk` must be in \[1, 255\], got 0"),
        ({"topk": 256}, ValueError, r"`topk` must be in \[1, 255\], got 256"),
        ({"topk": 2.0}, TypeError, "`topk` must be an int"),
    ],
    ids=["zero-tokens", "hidden-192", "topk-0", "topk-256", "topk-float"],
)
def test_invalid_sizes(single_rank_group, change, error, fragment):
    with pytest.raises(error, match=fragment):
        F.create_workspace(F.MoKConfig(), single_rank_group, device="cpu", **{**SIZES, **change})


@pytest.mark.parametrize(
    ("device", "fragment"),
    [("meta", "`device` must be a CPU or CUDA device, got meta"),
     ("gpu0", "`device` must name a CPU or CUDA device, got 'gpu0'"),
     (1.5, "`device` must name a CPU or CUDA device, got 1.5")],
    ids=["meta", "unknown-name", "float"],
)  # fmt: skip
def test_unsupported_devices_are_named(single_rank_group, device, fragment):
    with pytest.raises(ValueError, match=fragment):
        F.create_workspace(F.MoKConfig(), single_rank_group, device=device, **SIZES)


def test_config_and_group_types(single_rank_group):
    with pytest.raises(TypeError, match="`config` must be a MoKConfig, got dict"):
        F.create_workspace({}, single_rank_group, device="cpu", **SIZES)
    with pytest.raises(TypeError, match="`group` must be a torch.distributed ProcessGroup"):
        F.create_workspace(F.MoKConfig(), "world", device="cpu", **SIZES)


def test_uninitialised_distributed_is_runtime_error():
    code = (
        "import mok.functional as F\n"
        "try:\n"
        "    F.create_workspace(F.MoKConfig(), None, device='cpu', num_local_tokens=8,"
        " hidden_size=128, topk=1)\n"
        "except RuntimeError as e:\n"
        "    print('RuntimeError:', e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "RuntimeError: torch.distributed is not initialised" in result.stdout


def test_zero_destination_names_the_combine_buffers_only(single_rank_group):
    """The push destinations are zeroed by name before a pass's pushes; any other name is refused
    before anything is written."""
    ws = F.create_workspace(F.MoKConfig(), single_rank_group, device="cpu", **SIZES)
    ws.d_x_routed_buffer.fill_(7.0)
    ws.x_buffer.fill_(3.0)
    assert not comm.zero_destination(ws, "d_x_routed_buffer").any()
    with pytest.raises(ValueError, match="buffer name must be one of"):
        comm.zero_destination(ws, "x_buffer")
    assert (ws.x_buffer == 3.0).all()
