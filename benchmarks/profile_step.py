"""Where one mok step's GPU time goes: per-kernel totals from torch.profiler.

    torchrun --standalone --nproc-per-node=N benchmarks/profile_step.py --out DIR
        [--shapes NAME ...] [--mxfp8] [--top 25] [--overlap-ctas N ...]

Sets up mok_step's step (workspace, weights, inputs) outside the profiler, runs it twice to warm
up, then STEPS times under the profiler (schedule + forward, then backward); prints, per shape,
the kernels by GPU time per step and the span from the first kernel's start to the last one's
end (rank 0), then profiles one more step for its timeline (start, duration and stream of every
kernel), and writes DIR/profile-<mode>-rank<r>.json on every rank. Long kernel names are cut at
their template arguments. `--overlap-ctas` repeats everything for each MOK_OVERLAP_CTAS value.
"""

from __future__ import annotations

import collections
import os
import re

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from mok.bench import harness, mok_step

STEPS = 3


def short_name(name: str, width: int = 90) -> str:
    name = re.sub(r"<.*", "<...>", name) if len(name) > width else name
    return name[:width]


def kernels(prof) -> list:
    """The profile's GPU kernel events, by start time."""
    events = (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return sorted(events, key=lambda e: e.time_range.start)


def kernel_totals(prof) -> dict[str, float]:
    """Microseconds of GPU time per (shortened) kernel name, per step."""
    totals: dict[str, float] = collections.defaultdict(float)
    for event in kernels(prof):
        totals[short_name(event.name)] += event.device_time / STEPS
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def span_ms(prof) -> float:
    """Milliseconds from the first kernel's start to the last kernel's end."""
    ranges = [e.time_range for e in kernels(prof)]
    return (max(r.end for r in ranges) - min(r.start for r in ranges)) / 1e3 if ranges else 0.0


def timeline(prof) -> list[tuple[float, float, int, str]]:
    """(start ms from the first kernel, duration ms, stream, name) of every kernel, in order."""
    events = kernels(prof)
    if not events:
        return []
    origin = events[0].time_range.start
    return [
        (round((e.time_range.start - origin) / 1e3, 4), round(e.device_time / 1e3, 4),
         getattr(e, "device_resource_id", -1), short_name(e.name, 60))
        for e in events
    ]  # fmt: skip


def profile_shape(d, shape, mxfp8: bool, top: int, label: str) -> dict:
    step = mok_step.warm_step(d, shape, mxfp8, steps=2)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step.backward(step.forward())
        torch.cuda.synchronize()
    totals = kernel_totals(prof)
    with profile(activities=[ProfilerActivity.CUDA]) as one:
        step.backward(step.forward())
        torch.cuda.synchronize()
    result = {"kernels": totals, "span_ms": span_ms(one), "timeline": timeline(one)}
    if d.rank == 0:
        busy_ms = sum(totals.values()) / 1e3
        print(f"\n{label}: kernel time per step {busy_ms:.2f} ms, span {result['span_ms']:.2f} ms")
        for kernel, us in list(totals.items())[:top]:
            print(f"{us / 1e3:9.3f} ms  {kernel}")
    return result


def main() -> int:
    p = mok_step.profiler_parser(__doc__, top=25)
    p.add_argument("--overlap-ctas", nargs="+", help="MOK_OVERLAP_CTAS values to compare")
    args = p.parse_args()
    d = harness.setup_distributed(cpu=False, timeout_s=120.0)
    mode = "mxfp8" if args.mxfp8 else "bf16"
    report = {}
    for ctas in args.overlap_ctas or [os.environ.get("MOK_OVERLAP_CTAS", "")]:
        os.environ["MOK_OVERLAP_CTAS"] = ctas
        for name in args.shapes:
            label = f"{name} {mode} EP {d.world} MOK_OVERLAP_CTAS={ctas or 'default'}"
            report[label] = profile_shape(d, harness.SHAPES[name], args.mxfp8, args.top, label)
    # Every rank's file: a barrier's wait on one rank is the other ranks' lateness.
    mok_step.write_report(args.out / f"profile-{mode}-rank{d.rank}.json", report)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
