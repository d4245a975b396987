"""GPU tier fixtures. Run one pytest process per rank through torchrun, e.g.

    torchrun --nproc-per-node=2 -m pytest tests/gpu -m multi_gpu

A test needing a GPU skips with the reason when there is none, or no mok module for its arch.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist

for _name in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def pytest_configure(config):
    """Under torchrun every rank is a pytest process: give each its own JUnit file (rank 0 keeps
    the name asked for), or the ranks would write one file at once."""
    rank = os.environ.get("RANK", "0")
    if rank != "0" and getattr(config.option, "xmlpath", None):
        config.option.xmlpath = f"{config.option.xmlpath}.rank{rank}"


def gpu_skip_reason() -> str | None:
    """Why the CUDA backend cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none visible)"
    from mok import _extension

    try:
        _extension.module_for_device(torch.device("cuda", 0))
    except NotImplementedError as error:
        return str(error)
    return None


@pytest.fixture(scope="session")
def nccl_group():
    """The torchrun world as an NCCL group on this rank's GPU (a 1-rank world without torchrun)."""
    reason = gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group(
            "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local)
        )
    yield dist.group.WORLD
