"""MoKConfig: field order, defaults, validation messages."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mok.functional import MoKConfig


def test_fields_order_and_defaults():
    """The original's six fields first, in its order with its defaults; mok's speed knobs after
    them, keyword-only, with the environment's values as defaults."""
    fields = dataclasses.fields(MoKConfig)
    assert [(f.name, f.default) for f in fields[:6]] == [
        ("fwd_num_comm_sms", 40),
        ("bwd_num_comm_sms", 28),
        ("minibatch_size", 4096),
        ("macrobatch_size", 131072),
        ("schedule_capacity_multiplier", 0.5),
        ("all_gather_top_experts_chunk_bytes", 2048),
    ]
    mok_knobs = [
        "grouped_gemm", "overlap_ctas", "swiglu_epilogue", "mxfp8_f16_rows", "overlap_dispatch",
    ]  # fmt: skip
    assert [f.name for f in fields[6:]] == mok_knobs
    assert all(f.kw_only for f in fields[6:])
    assert MoKConfig(40, 28, 4096, 131072, 0.5, 2048) == MoKConfig()


def test_speed_knobs_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("MOK_OVERLAP_CTAS", "0")
    monkeypatch.setenv("MOK_GROUPED_GEMM", "torch")
    monkeypatch.setenv("MOK_SWIGLU_EPILOGUE", "1")
    config = MoKConfig()
    assert (config.overlap_ctas, config.grouped_gemm, config.swiglu_epilogue) == (0, "torch", True)
    assert MoKConfig(overlap_ctas=8).overlap_ctas == 8, "an argument beats the environment"
    monkeypatch.setenv("MOK_OVERLAP_CTAS", "-1")
    with pytest.raises(ValueError, match="MOK_OVERLAP_CTAS must be a CTA count >= 0"):
        MoKConfig()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"grouped_gemm": "cublas"}, ValueError, r"`grouped_gemm` must be one of auto, mok, torch"),
        ({"overlap_ctas": -1}, ValueError, r"`overlap_ctas` must be >= 0, got -1"),
        ({"overlap_ctas": 1.5}, TypeError, r"`overlap_ctas` must be an int"),
        ({"swiglu_epilogue": "yes"}, TypeError, r"`swiglu_epilogue` must be a bool"),
        ({"mxfp8_f16_rows": 1}, TypeError, r"`mxfp8_f16_rows` must be a bool"),
        ({"overlap_dispatch": "on"}, TypeError, r"`overlap_dispatch` must be a bool"),
    ],
    ids=[
        "grouped-gemm",
        "overlap-negative",
        "overlap-float",
        "epilogue-str",
        "f16-int",
        "dispatch-str",
    ],  # fmt: skip
)
def test_speed_knobs_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        MoKConfig(**kwargs)


def test_frozen_and_slotted():
    config = MoKConfig()
    assert not hasattr(config, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.minibatch_size = 256


def test_positional_order_matches_original():
    config = MoKConfig(8, 6, 512, 1024, 1.0, 32)
    assert (config.fwd_num_comm_sms, config.macrobatch_size) == (8, 1024)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"fwd_num_comm_sms": 3}, ValueError, "`fwd_num_comm_sms` must be a multiple of 2"),
        ({"fwd_num_comm_sms": 0}, ValueError, "`fwd_num_comm_sms`"),
        ({"bwd_num_comm_sms": -2}, ValueError, "`bwd_num_comm_sms`"),
        ({"bwd_num_comm_sms": 2.0}, TypeError, "`bwd_num_comm_sms` must be an int"),
        ({"minibatch_size": 100}, ValueError, "`minibatch_size` must be a multiple of 256"),
        ({"macrobatch_size": 6144}, ValueError, "`macrobatch_size` must be a multiple of 4096"),
        ({"schedule_capacity_multiplier": 0.0}, ValueError, "positive and finite, got 0.0"),
        ({"schedule_capacity_multiplier": math.inf}, ValueError, "positive and finite"),
        ({"schedule_capacity_multiplier": math.nan}, ValueError, "positive and finite"),
        ({"schedule_capacity_multiplier": "1"}, TypeError, "must be a float, got str"),
        ({"all_gather_top_experts_chunk_bytes": 24}, ValueError, "multiple of 16"),
        ({"all_gather_top_experts_chunk_bytes": True}, TypeError, "must be an int, got bool"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_values_raise(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("`", ".").replace("(", ".")):
        MoKConfig(**kwargs)


def test_comm_sms_must_leave_compute_sms():
    with pytest.raises(ValueError, match=r"`fwd_num_comm_sms` must be below the device's SM count"):
        MoKConfig(fwd_num_comm_sms=132).check_device(132)
    MoKConfig().check_device(132)


@pytest.mark.parametrize(
    ("multiplier", "ep", "tokens", "topk", "capacity"),
    [
        (0.5, 2, 100, 3, 600),  # T * k * max(2, ceil(1.0))
        (1.0, 1, 1, 1, 2),  # at least twice the mean load
        (0.5, 4, 1024, 8, 16384),  # T * k * 2
        (0.01, 8, 64, 2, 256),  # twice the mean load
        (0.3, 8, 128, 8, 3072),  # ceil(2.4) = 3
        (0.1, 16, 1000, 4, 8000),  # ceil(1.6) = 2
        (2.0, 8, 16, 2, 512),  # beyond the EP * T * k routes there are, as the original
    ],
)
def test_schedule_capacity_is_the_originals(multiplier, ep, tokens, topk, capacity):
    """C = T * k * max(2, ceil(EP * multiplier)) (API.md)."""
    config = MoKConfig(schedule_capacity_multiplier=multiplier)
    assert config.schedule_capacity(ep, tokens, topk) == capacity


def test_the_chunk_bytes_reach_the_routing_all_gather(monkeypatch):
    """build_schedule hands MoKConfig.all_gather_top_experts_chunk_bytes to the backend's
    all-gather (the CUDA kernel copies that many bytes a CTA at a time)."""
    import torch

    from mok import functional as F
    from mok.backends.reference import kernels
    from mok.testing import OneDeviceGroup

    seen, original = [], kernels.gather_routing

    def recording(workspace, routing, chunk_bytes=0):
        seen.append(chunk_bytes)
        return original(workspace, routing, chunk_bytes)

    monkeypatch.setattr(kernels, "gather_routing", recording)
    config = MoKConfig(all_gather_top_experts_chunk_bytes=48)
    group = OneDeviceGroup(2, config, device="cpu", num_local_tokens=4, hidden_size=128, topk=2)
    top = torch.zeros(4, 2, dtype=torch.int64)
    group.run(lambda rank, ws: F.build_schedule(ws, config, top, num_local_experts=2))
    assert seen == [48, 48]
