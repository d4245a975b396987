"""When, after a pass starts on an idle GPU, the host reaches each of its kernel launches.

    torchrun --standalone --nproc-per-node=1 benchmarks/host_stamps.py --out DIR
        [--shapes NAME ...] [--mxfp8] [--calls 30]

Wraps mok's one kernel-launch function (`mok.backends.cuda.extension.launch`) and the stages of the
functional API (`build_schedule`, `validate_inputs`, `passes.forward` / `backward`, the engine's
making, its sources, the routed GEMM engine, the dispatch pull, the shared expert, whose cuBLAS
GEMMs are no launch of mok's), times each with `perf_counter` from the pass's start (after a
synchronize), and prints, per pass, the median time of every stamp over `--calls` calls: the host's
path to the first GEMM is what an eager pass on an idle GPU waits for. A wrapper costs well under a
microsecond, unlike torch.profiler's or cProfile's hooks. Writes DIR/stamps-<mode>.json.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from mok import backends, functional, passes
from mok.backends.cuda import comm, extension
from mok.backends.cuda.engine import CudaEngine
from mok.bench import harness, mok_step

_STAMPS: list[tuple[str, float]] = []


def _stamped(label, fn, *, kernel: bool = False):
    """fn, appending (label, time) on entry, and (label + ' done') on return for a stage."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        name = f"launch {args[1]}" if kernel else label
        _STAMPS.append((name, time.perf_counter()))
        result = fn(*args, **kwargs)
        if not kernel:
            _STAMPS.append((f"{label} done", time.perf_counter()))
        return result

    return wrapper


def install() -> None:
    extension.launch = _stamped("launch", extension.launch, kernel=True)
    stages = ((functional, "build_schedule"), (functional, "validate_inputs"),
              (functional, "forward"), (passes, "forward"), (passes, "backward"),
              (backends, "engine"), (backends, "routed_gemms"), (CudaEngine, "use_sources"),
              (CudaEngine, "pull_beside"), (comm, "pull_rows"), (passes, "_shared_forward"),
              (passes, "_shared_backward"))  # fmt: skip
    for module, name in stages:
        setattr(module, name, _stamped(f"{module.__name__}.{name}", getattr(module, name)))


def stamps_of(fn, calls: int) -> list[tuple[str, float]]:
    """Per stamp (in call order): its label and median µs from fn's start over `calls` calls."""
    runs = []
    for _ in range(calls):
        torch.cuda.synchronize()
        _STAMPS.clear()
        begin = time.perf_counter()
        fn()
        end = time.perf_counter()
        runs.append(
            [(name, (t - begin) * 1e6) for name, t in _STAMPS] + [("return", (end - begin) * 1e6)]
        )
    torch.cuda.synchronize()
    labels = [name for name, _ in runs[0]]
    if any([name for name, _ in run] != labels for run in runs):
        raise RuntimeError("the stamps differ from call to call")
    return [(name, statistics.median(run[i][1] for run in runs)) for i, name in enumerate(labels)]


def print_stamps(title: str, stamps: list[tuple[str, float]]) -> None:
    print(f"\n{title}: µs from the start (+ since the stamp before)")
    last = 0.0
    for label, us in stamps:
        print(f"  {us:8.1f}  (+{us - last:6.1f})  {label}")
        last = us


def main() -> int:
    p = mok_step.profiler_parser(__doc__, top=None)
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args()
    d = harness.setup_distributed(cpu=False, timeout_s=120.0)
    mode = "mxfp8" if args.mxfp8 else "bf16"
    install()
    report = {}
    for name in args.shapes:
        step = mok_step.warm_step(d, harness.SHAPES[name], args.mxfp8, steps=3)
        state = step.forward()
        passes_of = {"fwd": step.forward, "bwd": functools.partial(step.backward, state)}
        entry = {p: stamps_of(fn, args.calls) for p, fn in passes_of.items()}
        report[f"{name} {mode} EP {d.world}"] = entry
        for pass_name, stamps in entry.items():
            if d.rank == 0:
                print_stamps(f"{name} {mode} EP {d.world} {pass_name}", stamps)
    if d.rank == 0:
        mok_step.write_report(args.out / f"stamps-{mode}.json", report)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
