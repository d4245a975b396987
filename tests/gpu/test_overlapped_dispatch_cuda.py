"""The forward's dispatch pull beside its gate/up GEMM and the backward's reverse pull beside its
d_h GEMM (CudaEngine.pull_beside; the pull counts each minibatch's arrival and the GEMM's
producer waits for a tile's rows, common/arrivals.cuh; the GEMM, on every SM, hands out its
tiles on demand, gemm/sm90/on_demand_scheduler.cuh):
the same bits as the pull run alone first, at every comm-SM count and minibatch size, at EP 1
and in a one-device group. The pulled rows and the GEMM's products are poisoned with NaN first,
so a GEMM tile that did not wait for its rows, or that no cluster took, shows.

Run: torchrun --nproc-per-node=1 -m pytest tests/gpu/test_overlapped_dispatch_cuda.py
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gpu_steps import CASES, GRAD_NAMES, make, step, workspace

from mok import functional as F
from mok.backends.cuda import grouped_gemm, pull_beside
from mok.passes import overlaps_shared
from mok.testing import OneDeviceGroup

pytestmark = [pytest.mark.gpu]

# (comm SMs of each pass, minibatch_size)
KNOBS = [(2, 256), (8, 4096), (16, 512), (40, 256)]


def _poisoned(monkeypatch) -> list:
    """Every overlapped pull's rows, and the products of the GEMM beside it, NaN before they
    are written: a tile that did not wait for its rows reads NaN, and a tile that no cluster
    took (the GEMM hands out tiles on demand) leaves NaN. Returns the list of the buffers the
    pulls read."""
    launched = []
    original_pull, original_launch = pull_beside.overlapped_pull, grouped_gemm._launch

    def poisoned_pull(ws, name, schedule, out, **options):
        out.fill_(float("nan"))
        launched.append(name)
        return original_pull(ws, name, schedule, out, **options)

    def poisoned_launch(kind, sets, *args, pull=None, **options):
        if pull is not None:
            for _, _, product in sets:
                product.fill_(float("nan"))
        return original_launch(kind, sets, *args, pull=pull, **options)

    monkeypatch.setattr(pull_beside, "overlapped_pull", poisoned_pull)
    monkeypatch.setattr(grouped_gemm, "_launch", poisoned_launch)
    return launched


def _assert_same(got, want, where=""):
    for name, a, b in zip(("out", *GRAD_NAMES), got, want, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), f"{where}{name}: the overlapped dispatch changed the bits"


def _config(comm_sms, minibatch, overlap=True):
    return F.MoKConfig(fwd_num_comm_sms=comm_sms, bwd_num_comm_sms=comm_sms,
                       minibatch_size=minibatch, overlap_dispatch=overlap)  # fmt: skip


def _overlapped(data) -> list:
    """The buffers a step's overlapped pulls read: x, and d_y unless the backward pulls it in
    the background of a large shared expert."""
    shared = data["shared"] if data["shared"][0] is not None else None
    background = overlaps_shared(shared, data["top"].shape[1])
    return ["x_buffer"] + ([] if background else ["d_y_buffer"])


@pytest.mark.parametrize("case", ["qwen3-235b-like", "dsv4-like", "empty-experts",
                                  "all-to-one-expert"])  # fmt: skip
def test_overlapped_dispatch_gives_the_bits_of_the_pull_alone(nccl_group, monkeypatch, case):
    if dist.get_world_size() > 1:
        pytest.skip("one rank here; the one-device group test covers EP 2 and 4")
    data = make(CASES[case], 4321, 0, 1)
    config, ws = workspace(nccl_group, data)
    alone, _ = step(ws, _config(40, 4096, overlap=False), data, "bf16")
    launched = _poisoned(monkeypatch)
    for comm_sms, minibatch in KNOBS:
        config = _config(comm_sms, minibatch)
        got, _ = step(ws, config, data, "bf16")
        _assert_same(got, alone, f"{comm_sms} comm SMs, minibatch {minibatch}: ")
    assert launched == _overlapped(data) * len(KNOBS), "every pass overlapped its pulls"


@pytest.mark.parametrize("ep", [2, 4])
def test_overlapped_dispatch_in_a_one_device_group(nccl_group, monkeypatch, ep):
    data = {rank: make(CASES["qwen3-235b-like"], 77, rank, ep) for rank in range(ep)}
    tokens, hidden = data[0]["x"].shape
    topk = data[0]["top"].shape[1]

    def run(config):
        group = OneDeviceGroup(ep, config, device="cuda", num_local_tokens=tokens,
                               hidden_size=hidden, topk=topk)  # fmt: skip
        return group.run(lambda rank, ws: step(ws, config, data[rank], "bf16")[0])

    alone = run(_config(16, 512, overlap=False))
    launched = _poisoned(monkeypatch)
    got = run(_config(8, 256))
    assert sorted(launched) == sorted(_overlapped(data[0]) * ep)
    for rank in range(ep):
        _assert_same(got[rank], alone[rank], f"rank {rank}: ")
