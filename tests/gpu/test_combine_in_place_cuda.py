"""The combine at EP 1 reads the routed rows in place on CUDA (MoKSchedule.route_rows, written
by the schedule kernel; the epilogue kernels read through it): the bits of the same step with
the pushes, and no push runs. The reference's in-place path: tests/cpu/test_combine_in_place.py.

Run: torchrun --nproc-per-node=1 -m pytest tests/gpu/test_combine_in_place_cuda.py (at EP > 1
the schedule keeps no route rows, which the last test checks).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from gpu_steps import CASES, GRAD_NAMES, make, step, workspace

from mok import backends
from mok import functional as F
from mok.backends.cuda import comm as cuda_comm
from mok.backends.cuda import epilogue as cuda_epilogue
from mok.backends.reference import kernels as reference
from mok.backends.reference import schedule as reference_schedule

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("case", ["qwen3-235b-like", "dsv4-like", "empty-experts"])
def test_in_place_combine_gives_the_bits_of_the_pushes(nccl_group, monkeypatch, case, mode):
    if dist.get_world_size() > 1:
        pytest.skip("route rows exist at EP 1 only (see the last test)")
    data = make(CASES[case], 1234, 0, 1)
    config, ws = workspace(nccl_group, data)
    pushes = []
    original = cuda_comm.push_rows

    def counted(*args, **kwargs):
        pushes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(cuda_comm, "push_rows", counted)
    in_place, schedule = step(ws, config, data, mode)
    assert schedule.route_rows is not None and not pushes, "EP 1 reads the rows in place"
    pushed, _ = step(ws, config, data, mode,
                     edit_schedule=lambda s: dataclasses.replace(s, route_rows=None))  # fmt: skip
    assert pushes, "without route rows the passes push"
    for name, a, b in zip(("out", *GRAD_NAMES), in_place, pushed, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), f"{name}: reading in place changed the result"


def test_schedule_kernel_route_rows_match_the_reference(nccl_group):
    gen = torch.Generator().manual_seed(5)
    tokens, topk, experts = 1000, 6, 24
    top = torch.randint(-2, experts + 2, (1, tokens, topk), generator=gen, dtype=torch.int32)
    capacity = 256 * (tokens * topk // 256 + 1 + experts)
    want = torch.empty(tokens * topk, dtype=torch.int32)
    reference_schedule.schedule(top, experts, capacity, 0, torch.zeros(1, dtype=torch.int32),
                                route_rows=want)  # fmt: skip
    got = torch.full((tokens * topk,), 7, dtype=torch.int32, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    backends.for_device(got.device).schedule(top.cuda(), experts, capacity, 0, status,
                                             route_rows=got)  # fmt: skip
    assert torch.equal(got.cpu(), want)
    assert (want == -1).any() and (want >= 0).any()


@pytest.mark.parametrize("weighted", [True, False], ids=["forward", "backward"])
def test_epilogue_kernel_reads_rows_in_place_like_the_reference(nccl_group, weighted):
    gen = torch.Generator().manual_seed(9)
    tokens, topk, hidden, rows = 300, 5, 256, 2048
    routed = torch.randn(rows, hidden, generator=gen).bfloat16()
    route_rows = torch.randint(-1, rows, (tokens * topk,), generator=gen, dtype=torch.int32)
    route_rows[::7] = rows + 3  # out of range: reads as a zero row, as -1 does
    shared = torch.randn(tokens, hidden, generator=gen).bfloat16()
    weights = torch.rand(tokens, topk, generator=gen)
    if weighted:
        want = reference.fwd_epilogue(shared, routed, weights, route_rows)
        got = cuda_epilogue.fwd_epilogue(shared.cuda(), routed.cuda(), weights.cuda(),
                                         route_rows.cuda())  # fmt: skip
    else:
        want = reference.bwd_epilogue(shared, routed, topk, route_rows)
        got = cuda_epilogue.bwd_epilogue(shared.cuda(), routed.cuda(), topk, route_rows.cuda())
    assert torch.equal(got.cpu(), want)


def test_beyond_ep_1_the_schedule_keeps_no_route_rows(nccl_group):
    if dist.get_world_size() == 1:
        pytest.skip("needs EP >= 2 (torchrun --nproc-per-node=2)")
    data = make(CASES["qwen3-235b-like"], 1234, dist.get_rank(), dist.get_world_size())
    config, ws = workspace(nccl_group, data)
    local = data["routed"][0].shape[0]
    schedule = F.build_schedule(ws, config, data["top"], num_local_experts=local)
    assert schedule.route_rows is None
