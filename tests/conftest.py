"""Fixtures shared by the CPU and GPU suites."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist


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
