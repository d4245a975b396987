"""Every multi-rank path of the CUDA backend, on whichever EP group the machine has.

Under torchrun with several processes (one GPU each) the group is the torchrun world:

    torchrun --nproc-per-node=N -m pytest tests/gpu/test_ep_group.py -m multi_gpu

Otherwise (one process) the same test bodies run on mok.testing.OneDeviceGroup: EP 2, 4 and 8 as
threads of this process on one GPU, each rank with its own workspace and stream. Each body says
what every rank does (`step(rank, ws)`) and checks every rank it ran:

- exactness against the reference backend (MOK_BACKEND=reference, the same group) with
  DESIGN.md section 7's tolerances: BF16 and MXFP8, with and without the shared expert, uniform
  and skewed routing (all tokens to one expert, empty experts, one rank receiving everything);
- invalid expert ids on one rank and a capacity overflow on one rank: every rank's verdict;
- bitwise-identical results over 5 runs;
- one CUDA graph capturing a whole step of every rank, replayed on new inputs;
- a group the GPU cannot serve is refused before any kernel runs.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from fault_helpers import status_message
from gpu_steps import CASES, GRAD_NAMES, compare, drawn_seed, make, step

from mok import functional as F
from mok.testing import OneDeviceGroup

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
ONE_GPU_SIZES = (2, 4, 8)
pytestmark = [pytest.mark.gpu, *([pytest.mark.multi_gpu] if WORLD > 1 else [])]
EXACT_CASES = ("smallest", "qwen3-235b-like", "all-to-one-expert", "empty-experts",
               "one-rank-receives-all")  # fmt: skip


class WorldGroup:
    """The torchrun world: this process runs its own rank of each step."""

    def __init__(self, config, tokens, hidden, topk):
        self.ep_size, rank = dist.get_world_size(), dist.get_rank()
        ws = F.create_workspace(config, None, device=torch.device("cuda"),
                                num_local_tokens=tokens, hidden_size=hidden, topk=topk)  # fmt: skip
        self.workspaces = {rank: ws}

    def run(self, rank_step) -> dict:
        return {rank: rank_step(rank, ws) for rank, ws in self.workspaces.items()}

    def capture(self, graph, rank_step) -> dict:
        with torch.cuda.graph(graph):
            return self.run(rank_step)


class OneGpuGroup:
    """N ranks on this process's GPU (mok.testing.OneDeviceGroup), with WorldGroup's face."""

    def __init__(self, ep_size, config, tokens, hidden, topk):
        self.group = OneDeviceGroup(ep_size, config, device="cuda", num_local_tokens=tokens,
                                    hidden_size=hidden, topk=topk)  # fmt: skip
        self.ep_size, self.workspaces = ep_size, dict(enumerate(self.group.workspaces))

    def run(self, rank_step) -> dict:
        return dict(enumerate(self.group.run(rank_step)))

    def capture(self, graph, rank_step) -> dict:
        return dict(enumerate(self.group.capture(graph, rank_step)))


@pytest.fixture(params=[WORLD] if WORLD > 1 else ONE_GPU_SIZES, ids=lambda n: f"ep{n}")
def new_group(request, device):
    """config, tokens, hidden, topk -> the EP group of this parameter (see the module doc)."""
    ep = request.param

    def factory(config, tokens, hidden, topk):
        if WORLD > 1:
            return WorldGroup(config, tokens, hidden, topk)
        return OneGpuGroup(ep, config, tokens, hidden, topk)

    factory.ep_size = ep
    return factory


def _seed() -> int:
    seed = drawn_seed()
    if WORLD > 1:
        tensor = torch.tensor([seed], device="cuda")
        dist.broadcast(tensor, 0)
        seed = int(tensor)
    print(f"seed {seed} (replay with MOK_TEST_SEED)")
    return seed


def _config(multiplier=1.0):
    return F.MoKConfig(fwd_num_comm_sms=16, bwd_num_comm_sms=16,
                       schedule_capacity_multiplier=multiplier)  # fmt: skip


def _inputs(new_group, case, seed, shared=True, multiplier=1.0):
    """(group, config, rank -> inputs) for `case`."""
    ep = new_group.ep_size
    data = {rank: make(CASES[case], seed, rank, ep) for rank in range(ep)}
    if not shared:
        for inputs in data.values():
            inputs["shared"] = (None, None, None)
    tokens, hidden = data[0]["x"].shape
    config = _config(multiplier)
    return new_group(config, tokens, hidden, data[0]["top"].shape[1]), config, data


def _steps(group, config, data, mode):
    return group.run(lambda rank, ws: step(ws, config, data[rank], mode)[0])


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "no-shared"])
@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("case", EXACT_CASES)
def test_matches_reference(new_group, monkeypatch, case, mode, shared):
    group, config, data = _inputs(new_group, case, _seed(), shared)
    got = _steps(group, config, data, mode)
    monkeypatch.setenv("MOK_BACKEND", "reference")
    want = _steps(group, config, data, mode)
    for rank, results in got.items():
        for name, g, r in zip(("out", *GRAD_NAMES), results, want[rank], strict=True):
            if g is None or r is None:
                assert g is None and r is None, f"rank {rank} {name}: present in one backend only"
                continue
            compare(name, g, r, mode, where=f"rank {rank} ")


def _verdicts(group, config, top_of) -> dict:
    """Each rank's check_status message (None if clean) after scheduling top_of(rank, ws)."""

    def schedule_and_check(rank, ws):
        F.build_schedule(ws, config, top_of(rank, ws), num_local_experts=2)
        return status_message(ws)

    return group.run(schedule_and_check)


def test_invalid_ids_on_one_rank_are_every_ranks_verdict(new_group):
    ep = new_group.ep_size
    group = new_group(_config(), 64, 1024, 2)

    def top_of(rank, ws):
        top = torch.arange(128, device="cuda").reshape(64, 2) % (2 * ep)
        if rank == ep - 1:
            top[5, 1] = 2 * ep  # past the last expert: only the last rank has it
        return top

    verdicts = _verdicts(group, config=_config(), top_of=top_of)
    assert all(v and "expert id outside" in v for v in verdicts.values()), verdicts


def test_capacity_overflow_on_one_rank_is_every_ranks_verdict(new_group):
    # Every route to rank 0's experts, the smallest capacity: only rank 0 drops routes.
    if new_group.ep_size <= 2:
        pytest.skip("at EP <= 2 the capacity (at least 2 * T * k rows) holds every route")
    config = _config(multiplier=0.01)
    group = new_group(config, 512, 1024, 2)
    top_of = lambda rank, ws: torch.arange(2, device="cuda").repeat(512, 1)  # noqa: E731
    verdicts = _verdicts(group, config, top_of)
    assert all(v and "schedule capacity" in v for v in verdicts.values()), verdicts


def test_ranks_that_disagree_on_num_local_experts_are_every_ranks_verdict(new_group):
    ep = new_group.ep_size
    config = _config()
    group = new_group(config, 64, 1024, 2)

    def schedule_and_check(rank, ws):
        top = torch.arange(128, device="cuda").reshape(64, 2) % (2 * ep)
        F.build_schedule(ws, config, top, num_local_experts=2 + (rank == ep - 1))
        return status_message(ws)

    verdicts = group.run(schedule_and_check)
    assert all(v and "different num_local_experts" in v for v in verdicts.values()), verdicts


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
def test_bitwise_deterministic_over_five_runs(new_group, mode):
    group, config, data = _inputs(new_group, "qwen3-235b-like", _seed())
    first = _steps(group, config, data, mode)
    for run in range(4):
        again = _steps(group, config, data, mode)
        for rank, results in first.items():
            for name, a, b in zip(("out", *GRAD_NAMES), results, again[rank], strict=True):
                assert torch.equal(a, b), f"rank {rank} {name} changed in run {run + 2}"


@pytest.mark.parametrize("mode", ["bf16", "mxfp8"])
@pytest.mark.parametrize("case", ["qwen3-235b-like", "dsv4-like"])
def test_cuda_graph_of_every_rank_replays_new_inputs(new_group, case, mode):
    seed = _seed()
    group, config, static = _inputs(new_group, case, seed)
    _steps(group, config, static, mode)  # warm-up: module load, pointer tables, allocator
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured = group.capture(
        graph, lambda rank, ws: step(ws, config, static[rank], mode, capturable=True)[0]
    )
    fresh = {rank: make(CASES[case], seed + 1000, rank, group.ep_size) for rank in static}
    for rank, inputs in static.items():
        for key in ("top", "x", "rw", "grad"):
            inputs[key].copy_(fresh[rank][key])
    graph.replay()
    torch.cuda.synchronize()
    eager = _steps(group, config, static, mode)
    for rank, results in captured.items():
        for name, a, b in zip(("out", *GRAD_NAMES), results, eager[rank], strict=True):
            assert torch.equal(a, b), f"rank {rank} {name}: graph replay differs from eager"


@pytest.mark.skipif(WORLD > 1, reason="the SM budget is a one-GPU group's rule")
def test_a_group_the_gpu_cannot_serve_is_refused(device):
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    too_many = sms // 2 + 1
    if too_many > 72:
        pytest.skip(f"{sms} SMs serve every group size mok accepts (at most 72)")
    with pytest.raises(ValueError, match="too large for one"):
        OneDeviceGroup(too_many, _config(), device=device, num_local_tokens=8, hidden_size=128,
                       topk=1)  # fmt: skip
