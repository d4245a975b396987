"""One expert GEMM launch taken apart: mok's against `torch._grouped_mm`'s, in one process.

    python3 benchmarks/probe_launch.py --shape qwen3.5 --gemm down [--system bf16_nt]

The problem is probe_gemm.py's (the shape's experts, `rows_per_expert` rows each, the same
weight values for both systems). Each system in turn, TIMINGS times: LAUNCHES back-to-back
launches timed by CUDA events as the host enqueues them (`events_ms`: the host's way to the first
launch included, as the GEMMs-alone rows were timed before 1b51f98) and with the host ahead
(`ahead_ms`: harness.local_ms's host_ahead, the GPU's time). Then, per launch, each kernel's GPU
time from torch.profiler (mok: the table fill, the zeroing of rows no tile computes and the GEMM;
torch: its table kernel and the GEMM) and the host's microseconds per launch while a sleep kernel
holds the GPU (`host_us`). Prints one JSON object; mok ÷ torch ratios are time over time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from probe_gemm import GEMMS, SYSTEMS, problem
from profile_step import kernels, short_name
from torch.profiler import ProfilerActivity, profile

from mok.bench import harness, shapes

LAUNCHES, TIMINGS = 5, 15


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(shapes.SHAPES), required=True)
    p.add_argument("--gemm", choices=GEMMS, required=True)
    p.add_argument("--system", choices=[s for s in SYSTEMS if s != "torch"], default="bf16_nt",
                   help="mok's kernel to take apart beside torch's (default bf16_nt)")  # fmt: skip
    return p.parse_args(argv)


def launches(launch):
    return lambda: [launch() for _ in range(LAUNCHES)]


def kernel_us(launch) -> dict[str, float]:
    """GPU µs per launch of each kernel the launch enqueues."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        launches(launch)()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in kernels(prof):
        name = short_name(event.name, 60)
        totals[name] = totals.get(name, 0.0) + event.device_time / LAUNCHES
    return totals


def host_us(launch, calls: int = 50) -> float:
    """The host's µs per launch, the GPU held by a sleep kernel meanwhile."""
    torch.cuda.synchronize()
    torch.cuda._sleep(200 * harness.HOST_AHEAD_CYCLES)
    start = time.perf_counter()
    for _ in range(calls):
        launch()
    spent = time.perf_counter() - start
    torch.cuda.synchronize()
    return spent / calls * 1e6


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_launch: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    shape = shapes.SHAPES[args.shape]
    flop, mok = problem(shape, args.gemm, args.system)
    torch_launch = problem(shape, args.gemm, "torch")[1]
    systems = {"torch": torch_launch, args.system: mok}
    record = {"shape": args.shape, "gemm": args.gemm, "flop": flop,
              "gpu": torch.cuda.get_device_name()}  # fmt: skip
    with torch.no_grad():
        for _ in range(10):
            for launch in systems.values():
                launch()
        for label, ahead in (("events_ms", False), ("ahead_ms", True)):
            times: dict[str, list[float]] = {name: [] for name in systems}
            for _ in range(TIMINGS):
                for name, launch in systems.items():
                    ms = harness.local_ms(launches(launch), host_ahead=ahead) / LAUNCHES
                    times[name].append(ms)
            record[label] = {name: statistics.median(t) for name, t in times.items()}
        record["kernel_us"] = {name: kernel_us(launch) for name, launch in systems.items()}
        record["host_us"] = {name: host_us(launch) for name, launch in systems.items()}
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
