"""The one benchmark harness: process group, timing, FLOPs, shapes, inputs and records (the
floors, measured with its Timer, are in floors.py).

Every `bench_<system>.py` measures through this module, so all systems share one timing method
(DESIGN.md §8, device METHOD.md): warm-up, then per iteration the SLOWEST rank's time (an
all_reduce MAX of each rank's CUDA-event time), and the median over iterations. Iteration counts
adapt to a time budget, so a slow system (the reference backend) cannot eat the device lease.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from mok.bench import power
from mok.bench.shapes import SHAPES, SMOKE_SHAPES, Shape, flops  # noqa: F401 (the harness's API)

# mok never uses NVLink multicast / NVLS (DESIGN.md §2.4); NCCL and symmetric memory must not
# either, so that the baseline and mok run under the same rules.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# The source tree's root when mok runs from one (git names the commit there); in an installed
# wheel git finds no repository and the caller's MOK_GIT_COMMIT is the only source.
SOURCE_ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ process group


@dataclass(frozen=True, slots=True)
class Dist:
    rank: int
    world: int
    device: torch.device
    group: dist.ProcessGroup

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def setup_distributed(*, cpu: bool, timeout_s: float) -> Dist:
    """Join the torchrun group (NCCL with one GPU per local rank, or gloo on CPU); a process
    not started by torchrun (`mok bench` on its own) is a group of one."""
    os.environ.update(MULTICAST_OFF)
    cuda = torch.cuda.is_available() and not cpu
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    alone = {} if "RANK" in os.environ else {"store": dist.HashStore(), "rank": 0, "world_size": 1}
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        timeout=timedelta(seconds=timeout_s),
        device_id=device if cuda else None,
        **alone,
    )
    return Dist(dist.get_rank(), dist.get_world_size(), device, dist.group.WORLD)


# ------------------------------------------------------------------------------------ timing


# A sleep kernel of this many cycles (~1 ms at the H100's and H200's clocks) holds the GPU while
# the host enqueues a call timed `host_ahead`: the host's way to the call's first launch (mok's
# through Python, torch's through C++) then stays out of the call's time.
HOST_AHEAD_CYCLES = 2_000_000


def local_ms(fn: Callable[[], object], *, cuda: bool = True, host_ahead: bool = False) -> float:
    """This process's ms for one call of fn: CUDA events on the current stream (they bracket
    the GPU work fn enqueues, and any host sync inside fn, like the baseline's split sizes, is
    part of the measured time, as it should), or the host clock without CUDA. `host_ahead`: the
    start event waits behind a sleep kernel while the host enqueues fn, so the time is fn's GPU
    work and the gaps between its kernels, without the host's way to its first launch (for
    kernels timed alone, which a pass would launch behind other work). Needs no process group:
    probes that time one GPU alone use it directly."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if host_ahead:
        torch.cuda._sleep(HOST_AHEAD_CYCLES)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def timeline_ms(spans: list[tuple[float, float]]) -> tuple[float, float, float]:
    """From kernel spans (start, end in µs), the first a marker kernel enqueued just before the
    timed call: (ms from the marker's end to the call's first kernel, ms with no kernel of the
    call running between its first kernel's start and its last one's end, ms with one running).
    Kernels on several streams may overlap; the busy time counts their union once."""
    spans = sorted(spans)
    if len(spans) < 2:
        return 0.0, 0.0, 0.0
    first = spans[1][0] - spans[0][1]
    idle, reached = 0.0, spans[1][0]
    for start, end in spans[1:]:
        idle += max(0.0, start - reached)
        reached = max(reached, end)
    return first / 1e3, idle / 1e3, (reached - spans[1][0] - idle) / 1e3


def gpu_timeline_ms(fn: Callable[[], object]) -> tuple[float, float, float]:
    """timeline_ms of one call of fn started on an idle GPU, from torch.profiler's kernel
    records: the busy time is the call's GPU work without the waits for the host, which the
    events of local_ms include (and the profiler's own host cost would inflate)."""
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        marker.add_(1)
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return timeline_ms(
        [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == cuda]
    )


@dataclass(frozen=True, slots=True)
class Timing:
    """Slowest-rank ms per iteration (the median is reported); `power`: each GPU's, power.py."""

    median_ms: float
    min_ms: float
    max_ms: float
    iters: int
    warmup_iters: int
    power: list | None = None


class Timer:
    """Times `fn` as the slowest rank sees it. Every rank must call it the same number of times
    (each iteration ends in an all_reduce); stop decisions use the agreed times only, so every
    rank stops after the same iteration."""

    def __init__(self, d: Dist, *, warmup_s: float, budget_s: float, max_iters: int) -> None:
        self.d, self.warmup_s, self.budget_s, self.max_iters = d, warmup_s, budget_s, max_iters

    def agree_max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.d.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.d.group)
        return float(t.item())

    def _once(self, fn, setup, host_ahead: bool = False) -> float:
        cuda = self.d.cuda
        if setup is None:
            return self.agree_max(local_ms(fn, cuda=cuda, host_ahead=host_ahead))
        state = setup()  # untimed: e.g. the forward whose graph the timed backward consumes
        return self.agree_max(local_ms(lambda: fn(state), cuda=cuda, host_ahead=host_ahead))

    def measure(
        self, fn: Callable, setup: Callable | None = None, *, host_ahead: bool = False
    ) -> Timing:
        """Warm up (at least once, until warmup_s), then iterate until budget_s or max_iters.
        `host_ahead`: as local_ms's, the GPU's time without the host's way to the first launch."""
        return self._iterate([fn], setup, host_ahead)[0]

    def measure_interleaved(
        self, fns: Sequence[Callable], *, host_ahead: bool = False
    ) -> list[Timing]:
        """measure() of each of fns, taken in turns, one iteration of each a round, so every fn
        meets the clock the others meet: under the power cap it drifts by several % over the
        seconds between two measure() calls, which moved the ratio of two GEMMs' rates by up
        to ±4% from round to round on 1x H200 (±1% in turns). budget_s is their total; no
        power record (its samples and energy are the fns' together)."""
        return self._iterate(list(fns), None, host_ahead)

    def _iterate(
        self, fns: list[Callable], setup: Callable | None, host_ahead: bool = False
    ) -> list[Timing]:
        warm, spent = 0, 0.0
        while warm == 0 or (spent < self.warmup_s * 1e3 and warm < 5):
            spent += sum(self._once(fn, setup, host_ahead) for fn in fns)
            warm += 1
        times: list[list[float]] = [[] for _ in fns]
        total = 0.0
        with power.Sampler(self.d.device if self.d.cuda else None) as sampler:
            while not times[0] or (len(times[0]) < self.max_iters and total < self.budget_s * 1e3):
                for fn, series in zip(fns, times, strict=True):
                    series.append(self._once(fn, setup, host_ahead))
                    total += series[-1]
        watts = None
        if len(fns) == 1:
            watts = power.per_rank(sampler.summary, self.d.group, len(times[0]))
        return [Timing(statistics.median(t), min(t), max(t), len(t), warm, watts) for t in times]

    def busy_ms(self, fn: Callable, calls: int = 20) -> float | None:
        """The slowest rank's GPU busy ms per call of fn under sustained load (None without
        CUDA): `calls` calls back to back, so the clock settles where the power limit leaves
        it, then three gpu_timeline_ms of `calls` calls each, the median of their busy times
        divided by `calls` (a process's first profiler session read 7-8% low on 1x H200). Back
        to back, the host enqueues ahead of the GPU, so this is the GPU's work alone: the
        measure of a build's GPU time where the host sets a single call's time (README.md,
        "Method")."""
        if not self.d.cuda:
            return None
        for _ in range(calls):
            fn()
        sessions = [gpu_timeline_ms(lambda: [fn() for _ in range(calls)])[2] for _ in range(3)]
        return self.agree_max(statistics.median(sessions) / calls)


class Deadline:
    """Wall-clock cap of one run, agreed across ranks so all skip the same measurements."""

    def __init__(self, timer: Timer, seconds: float) -> None:
        self.timer, self.seconds, self.start = timer, seconds, time.monotonic()

    def expired(self) -> bool:
        return self.timer.agree_max(time.monotonic() - self.start) > self.seconds


# ------------------------------------------------------------------------------------ inputs


def seeded_generator(device: torch.device, *key: object) -> torch.Generator:
    # crc32, not hash(): Python randomises str hashes per process, and every rank (and every
    # run) must draw the same numbers for the same key.
    seed = zlib.crc32("/".join(map(str, key)).encode())
    return torch.Generator(device=device).manual_seed(seed)


@dataclass(frozen=True, slots=True)
class Inputs:
    """x bf16 [T, H]; top int64 [T, k] (distinct global ids); rw fp32 [T, k]; grad bf16 [T, H]."""

    x: torch.Tensor
    top: torch.Tensor
    rw: torch.Tensor
    grad: torch.Tensor


def make_inputs(shape: Shape, d: Dist, index: int) -> Inputs:
    """Input set `index` of this rank: unit-variance activations, uniformly random distinct
    top-k experts over all EP·E experts, router weights a softmax over the k picks."""
    g = seeded_generator(d.device, shape.name, "inputs", d.rank, index)
    t, h, k = shape.tokens, shape.hidden, shape.topk

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g, device=d.device)

    x = normal(t, h).bfloat16()
    scores = torch.rand(t, d.world * shape.experts, generator=g, device=d.device)
    top = scores.topk(k, dim=1).indices
    rw = torch.softmax(normal(t, k), dim=-1)
    return Inputs(x, top, rw, normal(t, h).bfloat16())


@dataclass(frozen=True, slots=True)
class Weights:
    """Local routed experts (nn.Linear layout) gate/up bf16 [E, I, H], down [E, H, I]; shared
    expert (gate [I, H], up [I, H], down [H, I]) or None."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


def make_weights(shape: Shape, owner: int, device: torch.device) -> Weights:
    """The experts of rank `owner` (any rank can regenerate any rank's experts); scaled by
    1/sqrt(fan_in) so every GEMM output stays near unit scale. The shared expert is replicated."""
    h, i, e = shape.hidden, shape.inter, shape.experts

    def linear(g: torch.Generator, *size: int) -> torch.Tensor:
        return (torch.randn(*size, generator=g, device=device) / size[-1] ** 0.5).bfloat16()

    g = seeded_generator(device, shape.name, "experts", owner)
    gate, up, down = linear(g, e, i, h), linear(g, e, i, h), linear(g, e, h, i)
    shared = None
    if shape.shared:
        gs = seeded_generator(device, shape.name, "shared")
        shared = (linear(gs, i, h), linear(gs, i, h), linear(gs, h, i))
    return Weights(gate, up, down, shared)


# ---------------------------------------------------------------------------------- records


def compare(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """max |got - ref| and sum |got - ref| / sum |ref| (the original's tolerance measures)."""
    diff = (got.double() - ref.double()).abs()
    return {
        "max_abs": float(diff.max()),
        "rel_l1": float(diff.sum() / ref.double().abs().sum().clamp(min=1e-30)),
    }


def record(system: str, shape: Shape, ep: int, floors: dict | None, **fields) -> dict:
    """One result row: the shape, timings, TFLOP/s and ratio to the compute floor."""
    fwd_flops, bwd_flops = flops(shape)
    sizes = {("shape" if k == "name" else k): v for k, v in asdict(shape).items()}
    row = {"system": system, **sizes, "ep": ep, "rows_per_expert": shape.rows_per_expert}
    row.update(flops_fwd=fwd_flops, flops_bwd=bwd_flops)
    rate = (floors or {}).get("gemm_bf16_tflops")
    for phase, count in (("fwd", fwd_flops), ("bwd", bwd_flops)):
        timing = fields.pop(phase, None)
        row[phase] = asdict(timing) if timing is not None else None
        ms = timing.median_ms if timing is not None else None
        row[f"tflops_{phase}"] = count / (ms * 1e-3) / 1e12 if ms else None
        row[f"x_floor_{phase}"] = ms / (count / (rate * 1e12) * 1e3) if ms and rate else None
    row.update(fields)
    return row


def _first_line(*command: str) -> str | None:
    """First output line of a command; None where it is missing or fails (no git, no driver)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0] if done.returncode == 0 and lines else None


def environment(d: Dist) -> dict:
    """What the numbers were measured on and with."""
    import mok
    from mok.backends.cuda import mxfp8
    from mok.backends.cuda.extension import module_for_device

    kernels = bool(d.cuda and mxfp8.available(d.device))
    build = module_for_device(d.device).build_info() if kernels else {}
    return {
        "time_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        # The device machine's copy of the tree has no .git: the caller passes the commit.
        "git_commit": os.environ.get("MOK_GIT_COMMIT")
        or _first_line("git", "-C", str(SOURCE_ROOT), "rev-parse", "HEAD"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "backend": dist.get_backend(d.group),
        "world_size": d.world,
        "mok_version": mok.__version__,
        "mok_path": str(Path(mok.__file__).parent),
        "mok_backend_env": os.environ.get("MOK_BACKEND", "auto"),
        "mok_cuda_extension": kernels,
        "mok_build_commit": build.get("git_commit"),  # MOK_GIT_COMMIT when the wheel was built
        "gpu": torch.cuda.get_device_name(d.device) if d.cuda else None,
        "gpu_count": torch.cuda.device_count() if d.cuda else 0,
        "driver": _first_line("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
        if d.cuda
        else None,
    }
