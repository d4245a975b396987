"""GPU tier fixtures. Run one pytest process per rank through torchrun, e.g.

    torchrun --nproc-per-node=2 -m pytest tests/gpu -m multi_gpu

A test needing a GPU skips with the reason when there is none, or no mok module for its arch
(tests/gpu_helpers.py: gpu_skip_reason, requires_gpu_module, skip_without_gpu_module).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from comm_helpers import WORLD, shared_seed, workspace_cache
from gpu_helpers import skip_without_gpu_module, skip_without_grouped_gemms

for _name in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def pytest_configure(config):
    """Under torchrun every rank is a pytest process: give each its own JUnit file (rank 0 keeps
    the name asked for), or the ranks would write one file at once."""
    rank = os.environ.get("RANK", "0")
    if rank != "0" and getattr(config.option, "xmlpath", None):
        config.option.xmlpath = f"{config.option.xmlpath}.rank{rank}"


@pytest.fixture(scope="session")
def nccl_group():
    """The torchrun world as an NCCL group on this rank's GPU (a 1-rank world without torchrun)."""
    skip_without_gpu_module()
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


# The comm tests' fixtures (test_comm.py, test_comm_pipeline.py). A module that draws its own seed
# (test_epilogue_cuda.py, ...) defines its own `seed` fixture, which takes precedence here.


@pytest.fixture(scope="module")
def device(nccl_group) -> torch.device:
    """This rank's GPU, with the NCCL world up (torchrun's, or one rank without torchrun); skips
    with the reason when there is no GPU or no module."""
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="module")
def seed(device, request) -> int:
    """One seed per test module, the same on every rank; printed as e.g. "comm pipeline test seed"
    for test_comm_pipeline.py."""
    value = shared_seed(device)
    label = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", " ")
    print(f"\n{label} test seed: MOK_TEST_SEED={value} (EP={WORLD}, rank {dist.get_rank()})")
    return value


@pytest.fixture(scope="module")
def workspaces(device):
    """shape -> workspace of this module, created on first use."""
    return workspace_cache(device)


@pytest.fixture
def grouped_gemms():
    """Skips (saying why) unless GPU 0's mok module carries the grouped GEMMs (sm_90a); GEMM
    test modules use it through pytest.mark.usefixtures."""
    skip_without_grouped_gemms()
