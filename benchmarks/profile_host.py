"""Where one mok step's host time goes, and how long the GPU waits for it.

    torchrun --standalone --nproc-per-node=N benchmarks/profile_host.py --out DIR
        [--shapes NAME ...] [--mxfp8] [--calls 20] [--top 30] [--api]

Sets up mok_step's step outside the measurements and warms it up. Then, per pass (schedule +
forward, backward), on an idle GPU as the harness times it: the host time of the call
(`perf_counter`, no sync inside), the GPU time between events recorded before and after the
call, the time to the pass's first kernel and the GPU's idle time between its kernels, both spent
waiting for the host, and its busy time (`torch.profiler`); medians over the calls, on every
rank. Finally cProfile over `--calls` steps prints rank 0's functions with the most host time.
`--api` adds, per pass, the host time below Python: each CUDA runtime or driver call's and each
torch op's own (self) time per call of the pass, from torch.profiler's CPU events. Writes
DIR/host-<mode>.json on rank 0.
"""

from __future__ import annotations

import cProfile
import functools
import io
import json
import pstats
import statistics
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from mok.bench import harness, mok_step


def timed_call(fn) -> tuple[object, float, float]:
    """(result, host ms, GPU-event ms) of fn started on an idle GPU."""
    torch.cuda.synchronize()
    called = {}

    def call() -> None:
        begin = time.perf_counter()
        called["result"] = fn()
        called["host_ms"] = (time.perf_counter() - begin) * 1e3

    gpu_ms = harness.local_ms(call)
    return called["result"], called["host_ms"], gpu_ms


def measure(step, calls: int) -> dict:
    """Per pass: medians over `calls` calls of host ms, GPU ms, first-kernel delay, GPU idle and
    busy ms."""
    fields: dict[str, list[float]] = {}
    for _ in range(calls):
        state, host, gpu = timed_call(step.forward)
        backward = functools.partial(step.backward, state)
        _, b_host, b_gpu = timed_call(backward)
        fwd_timeline = harness.gpu_timeline_ms(step.forward)
        bwd_timeline = harness.gpu_timeline_ms(backward)
        values = (host, gpu, *fwd_timeline, b_host, b_gpu, *bwd_timeline)
        names = ("fwd_host", "fwd_gpu", "fwd_first_kernel", "fwd_idle", "fwd_busy",
                 "bwd_host", "bwd_gpu", "bwd_first_kernel", "bwd_idle", "bwd_busy")  # fmt: skip
        for name, value in zip(names, values, strict=True):
            fields.setdefault(name, []).append(value)
    return {name: round(statistics.median(v), 3) for name, v in fields.items()}


def host_profile(step, calls: int, top: int) -> str:
    """cProfile of `calls` steps, each pass synchronised like the harness's timed calls."""
    profiler = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        profiler.enable()
        state = step.forward()
        profiler.disable()
        torch.cuda.synchronize()
        profiler.enable()
        step.backward(state)
        profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return text.getvalue()


def _is_cuda_api(name: str) -> bool:
    """cudaLaunchKernelExC, cuTensorMapEncodeTiled, ...: the runtime's and the driver's calls."""
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


def api_profile(fn, calls: int, top: int) -> dict:
    """Per call of fn: host µs and count of each CUDA API call and each torch op's self time."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue
        if _is_cuda_api(event.key) and event.key != "cudaDeviceSynchronize":
            totals[event.key] = [event.count / calls, event.cpu_time_total / calls]
        elif event.key.startswith("aten::"):
            totals[event.key] = [event.count / calls, event.self_cpu_time_total / calls]
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    return {name: {"calls": round(c, 1), "us": round(us, 1)} for name, (c, us) in ranked}


def main() -> int:
    p = mok_step.profiler_parser(__doc__, top=30)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--api", action="store_true", help="CUDA API calls' and torch ops' host time")
    args = p.parse_args()
    d = harness.setup_distributed(cpu=False, timeout_s=120.0)
    mode = "mxfp8" if args.mxfp8 else "bf16"
    report = {}
    for name in args.shapes:
        step = mok_step.warm_step(d, harness.SHAPES[name], args.mxfp8, steps=3)
        times = [None] * d.world  # every rank's: the slowest rank sets the step's time
        dist.all_gather_object(times, measure(step, args.calls), group=d.group)
        stats = host_profile(step, args.calls, args.top)
        entry = {"ms_per_rank": times, "cprofile_rank0": stats}
        if args.api:
            state = step.forward()
            entry["api_us_per_call"] = {
                "fwd": api_profile(step.forward, args.calls, args.top),
                "bwd": api_profile(functools.partial(step.backward, state), args.calls, args.top),
            }
        report[f"{name} {mode} EP {d.world}"] = entry
        if d.rank == 0:
            for rank, ms in enumerate(times):
                print(f"\n{name} {mode} EP {d.world} rank {rank}: {json.dumps(ms)}")
            print(stats)
            print(json.dumps(entry.get("api_us_per_call", {}), indent=1))
    if d.rank == 0:
        mok_step.write_report(args.out / f"host-{mode}.json", report)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
