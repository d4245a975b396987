"""Fixtures shared by the CPU and GPU suites."""

from __future__ import annotations

import os
import socket

import pytest
import torch.distributed as dist
from hypothesis import settings

# CI (`.ci/run` sets HYPOTHESIS_PROFILE=ci) draws the property tests' examples from a fixed seed,
# so that a build passes or fails by the code, not by the draw; other runs keep exploring, and
# what they find is reported to be fixed (a failing case is replayed from .hypothesis/).
settings.register_profile("ci", derandomize=True)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def single_rank_group():
    """A one-rank gloo group in the test process (EP=1), for API-level tests."""
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    yield dist.group.WORLD
