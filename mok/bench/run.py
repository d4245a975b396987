"""Run the floors and every system on every shape in one process group; append the rows.

    torchrun --standalone --nproc-per-node=N -m mok.bench.run --out FILE.jsonl [--smoke]
        [--shapes NAME ...] [--systems NAME ...]

EP is the number of ranks. Rank 0 appends each measurement's rows to FILE.jsonl (results.py's
schema; created if missing) as soon as it is taken, so a run cut short keeps what it measured,
and runs at several EPs go to one file. `benchmarks/results.jsonl` is the committed table; a
device run writes a file of its own, appended to the table afterwards (README.md). `--smoke`
runs on CPU (gloo, the reference backend) with tiny shapes and a few iterations, and also
checks every system against a float64 dense formulation. Shapes run in the order given, each
with every system back to back (in the order given, the baseline first by default), so the
systems compared on a shape meet the GPU in the same state (clocks and temperature drift over a
run of minutes), and a run that hits --deadline-s loses the last shapes first (recorded as
skipped).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mok.bench import harness, mok_step, results, standard_path
from mok.bench.floors import measure_floors
from mok.bench.progress import Progress
from mok.config import MoKConfig

# mok's systems take the run's --config knobs (None: MoKConfig's defaults).
MOK_SYSTEMS = {
    "mok_bf16": mok_step.run_bf16,
    "mok_bf16_fg": mok_step.run_bf16_foreground,
    "mok_mxfp8": mok_step.run_mxfp8,
    "mok_bf16_cg": mok_step.run_bf16_graph,
    "mok_mxfp8_cg": mok_step.run_mxfp8_graph,
}
SYSTEMS = {standard_path.NAME: standard_path.run, **MOK_SYSTEMS}
# Systems that need a GPU: left out of --smoke's default systems.
GPU_ONLY = ("mok_bf16_cg", "mok_mxfp8_cg")
CHECKED = ("out", "d_x", "d_rw", "d_gate", "d_up", "d_down")


def add_arguments(p: argparse.ArgumentParser, *, out_required: bool = True) -> None:
    """The run's options (this module's and `mok bench`'s)."""
    p.add_argument("--out", type=Path, required=out_required, help="JSON-lines file the rows go to")
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny shapes, few iterations")
    p.add_argument("--shapes", nargs="+", help="shape names (default: all of the mode)")
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS),
                   help="default: all (with --smoke, all that run on CPU)")  # fmt: skip
    p.add_argument("--budget-s", type=float, help="timed seconds per measurement (default 2)")
    p.add_argument("--warmup-s", type=float, default=0.5, help="warm-up seconds (at least 1 iter)")
    p.add_argument("--max-iters", type=int, help="iterations per measurement (default 50)")
    p.add_argument("--sets", type=int, default=2, help="rotating input sets (default 2)")
    p.add_argument("--deadline-s", type=float, default=150.0, help="skip what starts later")
    p.add_argument("--timeout-s", type=float, default=120.0, help="collective timeout")
    p.add_argument("--chart", type=Path, help="also draw the run's chart into this PNG")
    p.add_argument("--config", type=Path,
                   help="a MoKConfig JSON (mok tune's config.json): the mok systems run with its "
                        "knobs; its schedule_capacity_multiplier is the run's own")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return resolve(p, p.parse_args(argv))


def resolve(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The parsed options with the mode's defaults filled in (shapes as Shape objects)."""
    table = harness.SMOKE_SHAPES if args.smoke else harness.SHAPES
    args.shapes = args.shapes or list(table)
    unknown = [name for name in args.shapes if name not in table]
    if unknown:
        p.error(f"unknown shapes {unknown}; this mode has {list(table)}")
    args.shapes = [table[name] for name in args.shapes]
    if args.systems is None:
        args.systems = [s for s in SYSTEMS if not (args.smoke and s in GPU_ONLY)]
    elif args.smoke and set(args.systems) & set(GPU_ONLY):
        p.error(f"--smoke runs on CPU; {sorted(set(args.systems) & set(GPU_ONLY))} need a GPU")
    # Smoke: one timed iteration after one warm-up is enough to exercise every code path.
    args.budget_s = args.budget_s if args.budget_s is not None else (0.0 if args.smoke else 2.0)
    args.max_iters = args.max_iters or (1 if args.smoke else 50)
    args.warmup_s = 0.0 if args.smoke else args.warmup_s
    args.knobs = config_knobs(p, args.config)
    return args


def config_knobs(p: argparse.ArgumentParser, path: Path | None) -> dict | None:
    """The knobs of the MoKConfig JSON at `path` that the mok systems take (every field but the
    schedule capacity, which the run sets for its EP), or None without one."""
    if path is None:
        return None
    try:
        config = MoKConfig.from_json(path)
    except (OSError, ValueError, TypeError) as error:
        p.error(f"--config {path}: {error}")
    knobs = dataclasses.asdict(config)
    del knobs["schedule_capacity_multiplier"]
    return knobs


def dense_reference(d: harness.Dist, shape: harness.Shape, inputs: harness.Inputs) -> dict:
    """float64 out[t] = shared(x_t) + sum_k rw[t,k] expert_{top[t,k]}(x_t) over ALL experts, and
    its gradients by autograd; routed weight gradients summed over ranks, then this rank's."""
    owners = [harness.make_weights(shape, r, d.device) for r in range(d.world)]
    gate, up, down = (
        torch.cat([getattr(o, name) for o in owners]).double().requires_grad_()
        for name in ("gate", "up", "down")
    )
    x = inputs.x.double().requires_grad_()
    rw = inputs.rw.double().requires_grad_()
    out = torch.zeros_like(x)
    for e in range(gate.shape[0]):
        tok, slot = torch.nonzero(inputs.top == e, as_tuple=True)
        hidden = F.silu(x[tok] @ gate[e].T) * (x[tok] @ up[e].T)
        out = out.index_add(0, tok, rw[tok, slot, None] * (hidden @ down[e].T))
    if shape.shared:
        s_gate, s_up, s_down = (t.double() for t in owners[0].shared)
        out = out + (F.silu(x @ s_gate.T) * (x @ s_up.T)) @ s_down.T
    out.backward(inputs.grad.double())
    mine = slice(d.rank * shape.experts, (d.rank + 1) * shape.experts)
    for weight in (gate, up, down):
        dist.all_reduce(weight.grad, group=d.group)
    return {
        "out": out.detach(),
        "d_x": x.grad,
        "d_rw": rw.grad,
        "d_gate": gate.grad[mine],
        "d_up": up.grad[mine],
        "d_down": down.grad[mine],
    }


def _compare_all(outputs: dict, reference: dict) -> dict:
    return {key: harness.compare(outputs[key], reference[key]) for key in CHECKED}


class Session:
    """One run: the timer, the deadline, the floors, the baseline per shape, the records."""

    def __init__(self, args: argparse.Namespace, d: harness.Dist) -> None:
        self.args, self.d = args, d
        self.timer = harness.Timer(
            d, warmup_s=args.warmup_s, budget_s=args.budget_s, max_iters=args.max_iters
        )
        self.deadline = harness.Deadline(self.timer, args.deadline_s)
        self.baseline: dict[str, dict] = {}  # the baseline's outputs per shape
        self.baseline_records: dict[str, dict] = {}
        settings = {k: getattr(args, k) for k in ("budget_s", "warmup_s", "max_iters", "sets")}
        self.run = {
            "ep": d.world,
            "smoke": args.smoke,
            "settings": {**settings, "deadline_s": args.deadline_s, "argv": sys.argv[1:]},
            "env": harness.environment(d),
            "floors": None,
            "records": [],
        }

    def floors(self) -> None:
        smoke = self.args.smoke
        self.run["floors"] = measure_floors(
            self.d,
            self.timer,
            gemm_n=256 if smoke else 8192,
            copy_bytes=(4 if smoke else 1024) << 20,
        )

    def measure(self, system: str, shape: harness.Shape) -> dict:
        d = self.d
        sets = [harness.make_inputs(shape, d, i) for i in range(self.args.sets)]
        if system in MOK_SYSTEMS:
            result = MOK_SYSTEMS[system](d, self.timer, shape, sets, knobs=self.args.knobs)
        else:
            result = SYSTEMS[system](d, self.timer, shape, sets)
        outputs, check = result["outputs"], {}
        if system == standard_path.NAME:
            self.baseline[shape.name] = outputs
        elif shape.name in self.baseline:
            check["vs_baseline"] = _compare_all(outputs, self.baseline[shape.name])
        if self.args.smoke:
            check["vs_dense"] = _compare_all(outputs, dense_reference(d, shape, sets[0]))
        floors = self.run["floors"]
        return harness.record(
            system,
            shape,
            d.world,
            floors,
            fwd=result["fwd"],
            bwd=result["bwd"],
            check=check,
            **result.get("extra", {}),
        )

    def rows(self, record: dict) -> list[dict]:
        """The table rows of a record (results.py), the baseline's of its shape beside it."""
        if record["system"] == standard_path.NAME:
            self.baseline_records[record["shape"]] = record
        baseline = self.baseline_records.get(record["shape"])
        return results.rows_of(record, self.run["env"], self.run["floors"], self.d.world, baseline)

    def one(self, system: str, shape: harness.Shape) -> dict:
        floors = self.run["floors"]
        if self.deadline.expired():
            return harness.record(system, shape, self.d.world, floors, skipped="deadline")
        try:
            return self.measure(system, shape)
        except Exception as error:  # recorded, so one failing system still leaves the others
            traceback.print_exc()
            message = f"{type(error).__name__}: {error}"
            return harness.record(system, shape, self.d.world, floors, error=message)
        finally:
            if self.d.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()


def _fmt(value: float | None, spec: str) -> str:
    """format(value, spec), or a dash as wide as the spec's width for a missing value."""
    width = spec.split(".")[0]
    return format("-", f">{width}") if value is None else format(value, spec)


def _worst_check(check: dict | None) -> float | None:
    values = [m["rel_l1"] for group in (check or {}).values() for m in group.values()]
    return max(values) if values else None


def _clock(timing: dict) -> float | None:
    """The slowest GPU's mean SM clock (MHz) over the timed iterations, where it was sampled."""
    clocks = [g["sm_mhz_mean"] for g in timing.get("power") or [] if g]
    return min(clocks) if clocks else None


def _rate(row: dict, phase: str, timing: dict, rate: float | None) -> tuple:
    """(TFLOP/s, x floor) of `timing` for the row's FLOPs of `phase`."""
    ms, count = timing.get("median_ms"), row[f"flops_{phase}"]
    if not ms:
        return None, None
    return count / (ms * 1e-3) / 1e12, (ms / (count / (rate * 1e12) * 1e3) if rate else None)


def _line(system: str, row: dict, fwd: dict, bwd: dict, rate: float | None, note: str) -> str:
    (tf_f, x_f), (tf_b, x_b) = _rate(row, "fwd", fwd, rate), _rate(row, "bwd", bwd, rate)
    busy = row.get("gpu_busy_ms") or {}
    return (
        f"{system:<11} {row['shape']:<13} {row['ep']:>2} "
        f"{_fmt(fwd.get('median_ms'), '8.2f')} {_fmt(bwd.get('median_ms'), '8.2f')} "
        f"{_fmt(busy.get('fwd'), '8.2f')} {_fmt(busy.get('bwd'), '8.2f')} "
        f"{_fmt(tf_f, '8.1f')} {_fmt(tf_b, '8.1f')} {_fmt(x_f, '7.2f')} {_fmt(x_b, '7.2f')} "
        f"{_fmt(_clock(fwd), '7.0f')} {_fmt(_clock(bwd), '7.0f')} "
        f"{_fmt(_worst_check(row.get('check')), '8.1e')}  {note[:60]}"
    )


def table(run: dict) -> str:
    """The compact summary: floors line, then one line per (system, shape); after the
    baseline's, its `gemm_pass` lines (each pass's GEMMs alone, `gemms:<kernels>`). `fwd busy`
    and `bwd busy`: mok's eager passes' GPU busy ms (mok_step), the steady measure where the
    host sets the timed ms."""
    f = run["floors"] or {}
    nv = f.get("nvlink") or {}
    rate = f.get("gemm_bf16_tflops")
    lines = [
        f"EP {run['ep']} on {run['env']['gpu'] or 'CPU'}: bf16 GEMM "
        f"{_fmt(rate, '.1f')} TFLOP/s | D2D copy "
        f"{_fmt(f.get('d2d_copy_GBps'), '.0f')} GB/s | NVLink {_fmt(nv.get('unidir_GBps'), '.0f')}"
        f" GB/s one way, {_fmt(nv.get('bidir_GBps'), '.0f')} GB/s both",
        f"{'system':<11} {'shape':<13} {'EP':>2} {'fwd ms':>8} {'bwd ms':>8} {'fwd busy':>8} "
        f"{'bwd busy':>8} {'fwd TF/s':>8} "
        f"{'bwd TF/s':>8} {'fwd xfl':>7} {'bwd xfl':>7} {'fwd MHz':>7} {'bwd MHz':>7} "
        f"{'check':>8}  note",
    ]
    for r in run["records"]:
        note = r.get("error") or r.get("skipped") or ""
        lines.append(_line(r["system"], r, r["fwd"] or {}, r["bwd"] or {}, rate, note))
        for kernels, timings in (r.get("gemm_pass") or {}).items():
            gemms = {**r, "check": None, "gpu_busy_ms": None}
            lines.append(_line(f"gemms:{kernels}", gemms, timings["fwd"], timings["bwd"], rate, ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return measure_all(parse_args(argv))


def measure_all(args: argparse.Namespace) -> int:
    """The floors, then every system on every shape; rank 0 appends the rows to args.out,
    prints the table and draws args.chart. 1 if a system failed."""
    d = harness.setup_distributed(cpu=args.smoke, timeout_s=args.timeout_s)
    try:
        session = Session(args, d)
        pairs = [(shape, system) for shape in args.shapes for system in args.systems]
        with Progress(1 + len(pairs), "bench", enabled=d.rank == 0) as progress:
            session.floors()
            progress.step("floors")
            for shape, system in pairs:
                row = session.one(system, shape)
                session.run["records"].append(row)
                if d.rank == 0:
                    results.append(args.out, session.rows(row))
                note = row.get("error") or row.get("skipped") or "ok"
                progress.step(f"{system} {shape.name}: {note}")
        if d.rank == 0:
            print(table(session.run), flush=True)
            if args.chart:
                print(draw_chart(args.out, args.chart), flush=True)
        failed = any(r.get("error") for r in session.run["records"])
    finally:
        dist.destroy_process_group()
    return 1 if failed else 0


def draw_chart(rows: Path, png: Path) -> str:
    """The chart of the newest run in `rows`, or why there is none (matplotlib is optional; the
    chart compares with the baseline)."""
    try:
        from mok.bench import chart
    except ImportError as error:
        return f"no chart: {error} (pip install 'mok[cli]' or matplotlib)"
    try:
        return f"chart: {chart.plot(rows, png)}"
    except ValueError as error:
        return f"no chart: {error} (the chart needs the nccl_torch system's rows)"


if __name__ == "__main__":
    raise SystemExit(main())
