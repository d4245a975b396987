"""Where one mok step's GPU time goes: per-kernel totals from torch.profiler.

    torchrun --standalone --nproc-per-node=N benchmarks/profile_step.py --out DIR
        [--shapes NAME ...] [--mxfp8] [--top 25]

Sets up bench_mok's step (workspace, weights, inputs) outside the profiler, runs it twice to warm
up, then STEPS times under the profiler (schedule + forward, then backward); prints, per shape,
the kernels by GPU time per step (rank 0) and writes DIR/profile-<mode>.json. Long kernel names
are cut at their template arguments.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

import bench_mok
import harness
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

STEPS = 3


def short_name(name: str, width: int = 90) -> str:
    name = re.sub(r"<.*", "<...>", name) if len(name) > width else name
    return name[:width]


def kernel_totals(prof) -> dict[str, float]:
    """Microseconds of GPU time per (shortened) kernel name, per step."""
    totals: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[short_name(event.name)] += event.device_time / STEPS
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", nargs="+", default=list(harness.SHAPES))
    p.add_argument("--mxfp8", action="store_true")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    d = harness.setup_distributed(cpu=False, timeout_s=120.0)
    mode = "mxfp8" if args.mxfp8 else "bf16"
    report = {}
    for name in args.shapes:
        shape = harness.SHAPES[name]
        step = bench_mok.Step(d, shape, [harness.make_inputs(shape, d, 0)], mxfp8=args.mxfp8)
        for _ in range(2):  # warm-up: allocator, cuBLAS heuristics
            step.backward(step.forward())
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step.backward(step.forward())
            torch.cuda.synchronize()
        totals = kernel_totals(prof)
        report[name] = totals
        if d.rank == 0:
            step_ms = sum(totals.values()) / 1e3
            print(f"\n{name} {mode} EP {d.world}: GPU time per step {step_ms:.2f} ms")
            for kernel, us in list(totals.items())[: args.top]:
                print(f"{us / 1e3:9.3f} ms  {kernel}")
    if d.rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"profile-{mode}.json").write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
