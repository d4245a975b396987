"""MoKConfig: field order, defaults, validation messages."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mok.functional import MoKConfig


def test_fields_order_and_defaults():
    fields = [(f.name, f.default) for f in dataclasses.fields(MoKConfig)]
    assert fields == [
        ("fwd_num_comm_sms", 40),
        ("bwd_num_comm_sms", 28),
        ("minibatch_size", 4096),
        ("macrobatch_size", 131072),
        ("schedule_capacity_multiplier", 0.5),
        ("all_gather_top_experts_chunk_bytes", 2048),
    ]


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
