"""Helpers of the GPU comm kernel tests (tests/gpu/test_comm.py, test_comm_pipeline.py): shapes,
workspaces, the shared seed, random routing scenarios, reference schedules, the loop of calls,
poisoning, bitwise comparison and the epilogue oracle (timing is in gpu_helpers.py). It sits at
the top of tests/ because that directory is on pytest's `pythonpath` (pyproject.toml), so it
imports by name under --import-mode=importlib.

Every rank is one pytest process; tests do all collective work first and compare afterwards, so
a mismatch on one rank never leaves another rank waiting in a collective.
"""

from __future__ import annotations

import os
import random
import secrets
import zlib

import torch
import torch.distributed as dist

from mok import status as device_status
from mok.backends.reference import exchange as reference_exchange
from mok.backends.reference import schedule as reference_schedule
from mok.config import MoKConfig
from mok.workspace import create_workspace

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
POISON_BYTE = 0xFF  # bf16 0xFFFF and fp32 0xFFFFFFFF are NaN; int32 -1
CALLS = 5  # back-to-back calls per test, nothing cleared in between
# (T, H, k, local experts): odd T*k (the 4-byte all-gather path), DSV4-Pro-like H, Qwen3-like
# top-8 with H 4224 (rows of 528 vectors: four whole column slices of the pull and a part one).
SHAPES = [(101, 128, 3, 2), (256, 7168, 6, 4), (64, 4224, 8, 3)]
SHAPE_IDS = ["T101-H128-k3", "T256-H7168-k6", "T64-H4224-k8"]


def make_workspace(device, tokens: int, hidden: int, topk: int):
    return create_workspace(
        MoKConfig(), None, device=device, num_local_tokens=tokens, hidden_size=hidden, topk=topk
    )


def workspace_cache(device):
    """shape -> workspace, created on first use (in test order, the same on every rank)."""
    cache = {}

    def get(shape):
        if shape not in cache:
            cache[shape] = make_workspace(device, *shape[:3])
        return cache[shape]

    return get


def expect_clean(ws, problems: list[str | None]) -> None:
    """No mismatches, and no device error (e.g. a barrier timeout) recorded on this rank."""
    torch.cuda.synchronize()
    value = int(ws.status.item())
    ws.status.zero_()
    found = [p for p in problems if p]
    if value:
        try:
            device_status.raise_for(value)
        except device_status.MoKDeviceError as error:
            found.append(f"rank {dist.get_rank()}: {error}")
    assert not found, "\n".join(found)


def shared_seed(device: torch.device) -> int:
    """MOK_TEST_SEED, else a fresh one drawn on rank 0; the same on every rank."""
    value = int(os.environ.get("MOK_TEST_SEED") or secrets.randbits(31))
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(tensor, src=0)
    return int(tensor.item())


def _mix(seed: int, salt: tuple) -> int:
    # zlib.crc32, not hash(): str hashes change from process to process.
    return zlib.crc32(repr((seed, dist.get_rank(), *salt)).encode())


def generator(seed: int, *salt: object) -> torch.Generator:
    """A CUDA generator for this rank and purpose (different data on every rank)."""
    return torch.Generator(device="cuda").manual_seed(_mix(seed, salt))


def host_random(seed: int, *salt: object) -> random.Random:
    """A host generator for this rank and purpose (draws need no device sync)."""
    return random.Random(_mix(seed, salt))


def ws_and_draws(workspaces, seed: int, tag: str, shape: tuple, *more: object):
    """(ws, gen, rng): a test's workspace of `shape` (from workspace_cache), and its CUDA and host
    generators, both salted with (tag, shape, *more)."""
    salt = (tag, shape, *more)
    return workspaces(shape), generator(seed, *salt), host_random(seed, *salt)


# "overflow" routes everything to rank 0 and builds schedules of only 256 rows, so routes are
# dropped for capacity: their destination slots must read as zero after a push.
ROUTINGS = ("uniform", "invalid_ids", "one_rank", "one_expert", "empty_experts", "overflow")


def routing(kind: str, tokens: int, topk: int, experts: int, gen) -> torch.Tensor:
    """int32 [T, k] global expert ids for a scenario (experts = EP * local experts); invalid ids
    are -1 as build_schedule passes them, or past the last expert."""
    shape = (tokens, topk)
    ids = torch.randint(0, experts, shape, generator=gen, device="cuda", dtype=torch.int32)
    if kind == "invalid_ids":
        pick = torch.rand(shape, generator=gen, device="cuda")
        ids = torch.where(pick < 0.1, -1, ids)
        ids = torch.where((pick >= 0.1) & (pick < 0.15), experts + 3, ids)
    elif kind in ("one_rank", "overflow"):  # every route to rank 0's experts
        local = experts // WORLD
        ids = torch.randint(0, local, shape, generator=gen, device="cuda", dtype=torch.int32)
    elif kind == "one_expert":
        ids = torch.zeros(shape, dtype=torch.int32, device="cuda")
    elif kind == "empty_experts":  # odd experts receive nothing
        ids = ids - ids % 2
    return ids


def fresh_schedule(ws, kind: str, local_experts: int, gen) -> tuple[torch.Tensor, ...]:
    """This rank's reference schedule (a 4-tuple on the device) for a fresh routing of `kind`,
    all-gathered by the reference. Capacity overflow is expected in the "overflow" scenario: its
    status goes to a scratch word, not the workspace's."""
    mine = routing(kind, ws.num_local_tokens, ws.topk, ws.ep_size * local_experts, gen)
    topk_all = reference_exchange.all_gather(mine, ws.group_name)
    status = torch.zeros(1, dtype=torch.int32, device=topk_all.device)
    rows = 256 if kind == "overflow" else ws.schedule_rows(local_experts)
    sched = reference_schedule.schedule(topk_all, local_experts, rows, ws.ep_rank, status)
    return tuple(t.contiguous() for t in sched)


def check_calls(ws, kind: str | None, local_experts: int, gen, one_call) -> None:
    """CALLS back-to-back calls of `one_call(call, sched)`, each on a fresh reference schedule for
    a routing of `kind` (None: ROUTINGS in turn); it returns its mismatches (None where none). All
    calls run first, then expect_clean checks the mismatches and the device status."""
    problems = []
    for call in range(CALLS):
        this_kind = ROUTINGS[call % len(ROUTINGS)] if kind is None else kind
        problems.extend(one_call(call, fresh_schedule(ws, this_kind, local_experts, gen)))
    expect_clean(ws, problems)


def epilogue_oracle(shared, combine, weights) -> torch.Tensor:
    """mok.ops.fwd_epilogue's arithmetic, spelled out on the CPU (bf16 [T, H])."""
    tokens, topk = weights.shape
    routed = combine.cpu().float().reshape(tokens, topk, -1)
    total = torch.zeros_like(routed[:, 0]) if shared is None else shared.cpu().float()
    for slot in range(topk):
        total = total + weights.cpu()[:, slot, None] * routed[:, slot]
    return total.to(torch.bfloat16)


def random_rows(shape: tuple[int, ...], dtype: torch.dtype, gen) -> torch.Tensor:
    """Random values with a wide per-row range (and exact zeros), in `dtype`."""
    x = torch.randn(shape, generator=gen, device="cuda")
    if len(shape) > 1:
        scale = torch.randint(-20, 20, (shape[0], *([1] * (len(shape) - 1))), device="cuda")
        x = x * torch.exp2(scale.float())
    x = torch.where(torch.rand(shape, generator=gen, device="cuda") < 0.02, 0.0, x)
    return x.to(dtype)


def poison(tensor: torch.Tensor) -> torch.Tensor:
    tensor.view(torch.uint8).fill_(POISON_BYTE)
    return tensor


def skew(rng: random.Random, max_cycles: int = 2_000_000) -> None:
    """Delay this rank's stream by up to ~1 ms, so a missing barrier shows up as wrong data."""
    torch.cuda._sleep(rng.randrange(max_cycles))


def bit_mismatch(name: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when the two tensors are bitwise equal, else a description of the first difference."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}"
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    g, w = got.contiguous().view(raw), want.contiguous().view(raw)
    bad = (g != w).nonzero()
    if bad.numel() == 0:
        return None
    first = tuple(bad[0].tolist())
    return (
        f"rank {dist.get_rank()} {name}: {bad.shape[0]} of {g.numel()} elements differ, first at "
        f"{list(first)}: kernel {got[first].item()!r} (bits {g[first].item():#x}), "
        f"reference {want[first].item()!r} (bits {w[first].item():#x})"
    )
