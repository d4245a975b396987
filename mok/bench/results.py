"""The results table: `benchmarks/results.jsonl`, one JSON object a line, one row per measurement.

    python -m mok.bench.results [TABLE] # the standings: the newest run per GPU and EP

A row is one system on one shape at one EP, in one precision, for one pass (forward or
backward), from one run of `run.py` (its commit, GPU, driver and torch); a `mok tune` run has a
row per pass for each point of its sweep (`config`; `note` names the knob the point varied, since
the best config so far is timed again with each knob). `run.py` appends the
rows of each measurement as it finishes; a device run's rows come back in a file of their own
and are appended to the table (benchmarks/README.md, "How to run"). Rows are never edited: a
newer run adds newer rows.

Every row has the keys of REQUIRED (null where not measured); OPTIONAL keys appear where the
system measures them. `system` names what was timed:

| system                   | what                                      | vs_baseline        |
|--------------------------|-------------------------------------------|--------------------|
| nccl_torch               | the standard path (standard_path.py)   | null               |
| mok_bf16, mok_mxfp8, ... | a mok pass as `run.py --systems` names it | nccl_torch ms / ms |
| gemms:torch, gemms:mok   | one pass's GEMMs alone, back to back      | gemms:torch / ms   |
| gemm:<problem>           | one expert GEMM, mok's kernel (rate only) | mok / _grouped_mm  |
| mok_bf16_tune, ...       | one point of a `mok tune` sweep (config)  | null               |

`vs_baseline` > 1 means faster than the baseline of the same run on the same shape and pass.
`x_floor` is the time over the compute floor: the counted FLOPs at the bf16 GEMM rate measured
in the same run (`floor_tflops`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

TABLE = Path("benchmarks") / "results.jsonl"  # the committed table, from the repository root
BASELINE = "nccl_torch"
# mok's systems that run with the run's knobs alone (MoKConfig's defaults, or mok bench --config).
TUNABLE = ("mok_bf16", "mok_mxfp8", "mok_bf16_cg", "mok_mxfp8_cg")
PASSES = ("fwd", "bwd")
# The outputs each pass produces, as run.py's checks name them.
CHECKED = {"fwd": ("out",), "bwd": ("d_x", "d_rw", "d_gate", "d_up", "d_down")}
REQUIRED = (
    "date",  # UTC start of the run (ISO 8601)
    "commit",  # the tree the harness ran from (MOK_GIT_COMMIT on the device machine)
    "build_commit",  # the commit the loaded kernels were built from (build_info), or null
    "gpu",  # the card's name; null on CPU (smoke runs, never in the committed table)
    "driver",
    "torch",
    "ep",
    "system",
    "precision",  # bf16 or mxfp8
    "pass",  # fwd or bwd
    "shape",
    "hidden",
    "inter",
    "topk",
    "experts",
    "tokens",
    "shared",
    "median_ms",  # the median over iterations of the slowest rank's time
    "tflops",  # counted FLOPs / median_ms (gemm:<problem>: mok's kernel's rate)
    "x_floor",  # median_ms / (FLOPs at floor_tflops)
    "vs_baseline",
    "floor_tflops",  # bf16 dense GEMM rate measured in the same run
)
OPTIONAL = (
    "gpu_count",
    "cuda",
    "mok_kernels",  # whether the wheel's kernels served the device (else the reference ran)
    "mok_path",
    "floor_copy_GBps",
    "floor_nvlink_GBps",  # one way, GPU0 to GPU1; null with one GPU
    "min_ms",
    "max_ms",
    "iters",
    "warmup_iters",
    "gpu_busy_ms",  # GPU time with a kernel of the pass running, calls back to back
    "sm_mhz",  # the slowest GPU's mean SM clock over the timed iterations
    "power_w",  # the highest mean board power among the GPUs
    "power_capped",  # the largest share of samples with the software power cap active
    "joules_per_iter",  # NVML energy per iteration, summed over the GPUs
    "baseline_tflops",  # gemm:<problem>: torch._grouped_mm's rate on the same problem
    "check",  # {"vs_baseline" | "vs_dense": {tensor: {"max_abs", "rel_l1"}}}
    "note",  # why a measurement has no numbers (error, skipped), or what it was (mok tune's point)
    "config",  # the MoKConfig fields a mok system ran with: mok tune's point, or the knobs of
    # mok bench --config (absent: the defaults)
)


def _short(commit: str | None) -> str | None:
    """A hex commit id cut to 7 characters; other values ("unknown", null) as they are."""
    if commit and re.fullmatch(r"[0-9a-f]{7,40}", commit):
        return commit[:7]
    return commit


def _rounded(value):
    """Floats to 6 significant digits (far below any run-to-run spread), recursively."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def precision_of(system: str) -> str:
    return "mxfp8" if "mxfp8" in system or "_mx" in system else "bf16"


def context(env: dict, floors: dict | None, ep: int) -> dict:
    """The keys every row of one run shares: where and with what it was measured."""
    floors = floors or {}
    nvlink = floors.get("nvlink") or {}
    return {
        "date": env.get("time_utc"),
        "commit": _short(env.get("git_commit")),
        "build_commit": _short(env.get("mok_build_commit")),
        "gpu": env.get("gpu"),
        "gpu_count": env.get("gpu_count"),
        "driver": env.get("driver"),
        "torch": env.get("torch"),
        "cuda": env.get("cuda"),
        "ep": ep,
        "mok_kernels": env.get("mok_cuda_extension"),
        "mok_path": env.get("mok_path"),
        "floor_tflops": floors.get("gemm_bf16_tflops"),
        "floor_copy_GBps": floors.get("d2d_copy_GBps"),
        "floor_nvlink_GBps": nvlink.get("unidir_GBps"),
    }


def _power(timing: dict) -> dict:
    """The run's power keys from each GPU's record; a measurement shorter than one sample
    interval has the energy counter's reading only."""
    gpus = [g for g in timing.get("power") or [] if g]

    def each(key: str) -> list[float]:
        return [g[key] for g in gpus if g.get(key) is not None]

    keys = ("sm_mhz_mean", "power_w_mean", "power_capped_share", "joules_per_iter")
    mhz, watts, capped, joules = (each(key) for key in keys)
    return {
        "sm_mhz": min(mhz) if mhz else None,
        "power_w": max(watts) if watts else None,
        "power_capped": max(capped) if capped else None,
        "joules_per_iter": sum(joules) if joules else None,
    }


def timed(base: dict, timing: dict | None, flops: int, floor: float | None, ref_ms) -> dict:
    """The timing keys of one row: median (and spread), rate, ratio to the floor and to the
    baseline's median `ref_ms`."""
    timing = timing or {}
    ms = timing.get("median_ms")
    row = {
        **base,
        "median_ms": ms,
        "tflops": flops / (ms * 1e-3) / 1e12 if ms else None,
        "x_floor": ms / (flops / (floor * 1e12) * 1e3) if ms and floor else None,
        "vs_baseline": ref_ms / ms if ms and ref_ms else None,
        "min_ms": timing.get("min_ms"),
        "max_ms": timing.get("max_ms"),
        "iters": timing.get("iters"),
        "warmup_iters": timing.get("warmup_iters"),
    }
    row.update(_power(timing))
    return row


def _shape(record: dict) -> dict:
    keys = ("shape", "hidden", "inter", "topk", "experts", "tokens", "shared")
    return {key: record[key] for key in keys}


def _check(record: dict, phase: str) -> dict | None:
    checks = {
        kind: {name: values[name] for name in CHECKED[phase] if name in values}
        for kind, values in (record.get("check") or {}).items()
    }
    return {kind: values for kind, values in checks.items() if values} or None


def _step_rows(record: dict, ctx: dict, baseline: dict | None) -> list[dict]:
    system, floor = record["system"], ctx["floor_tflops"]
    note = record.get("error") or record.get("skipped")
    rows = []
    for phase in PASSES:
        ref = (baseline or {}).get(phase) if system != BASELINE else None
        base = {**ctx, "system": system, "precision": precision_of(system), "pass": phase}
        base |= _shape(record)
        row = timed(base, record.get(phase), record[f"flops_{phase}"], floor,
                     (ref or {}).get("median_ms"))  # fmt: skip
        row["gpu_busy_ms"] = (record.get("gpu_busy_ms") or {}).get(phase)
        row["check"] = _check(record, phase)
        row["note"] = note
        if record.get("knobs") is not None:
            row["config"] = record["knobs"]
        rows.append(row)
    return rows


def _pass_gemm_rows(record: dict, ctx: dict) -> list[dict]:
    """The passes' GEMMs alone (`gemm_pass`, on the baseline's records)."""
    gemm_pass = record.get("gemm_pass") or {}
    rows = []
    for kernels, timings in gemm_pass.items():
        for phase in PASSES:
            ref = gemm_pass.get("torch", {}).get(phase) if kernels != "torch" else None
            base = {**ctx, "system": f"gemms:{kernels}", "precision": "bf16", "pass": phase}
            base |= _shape(record)
            row = timed(base, timings.get(phase), record[f"flops_{phase}"], ctx["floor_tflops"],
                         (ref or {}).get("median_ms"))  # fmt: skip
            rows.append(row)
    return rows


def _problem_rows(record: dict, ctx: dict) -> list[dict]:
    """Each expert GEMM problem's rates (`grouped_mm_<p>_tflops`, `mok_gemm_<p>_*`)."""
    rows = []
    for key in record:
        match = re.fullmatch(r"grouped_mm_(\w+)_tflops", key)
        if not match:
            continue
        problem = match.group(1)
        mine = record.get(f"mok_gemm_{problem}_tflops")
        floor = ctx["floor_tflops"]
        phase = "bwd" if problem.startswith(("dgrad_", "wgrad_")) else "fwd"
        row = {**ctx, "system": f"gemm:{problem}", "precision": precision_of(problem)}
        row |= {"pass": phase, **_shape(record), "median_ms": None, "tflops": mine}
        row["x_floor"] = floor / mine if mine and floor else None
        row["vs_baseline"] = record.get(f"mok_gemm_{problem}_vs_grouped_mm")
        row["baseline_tflops"] = record[key]
        rows.append(row)
    return rows


def rows_of(record: dict, env: dict, floors: dict | None, ep: int, baseline=None) -> list[dict]:
    """The table rows of one run.py record (harness.record): its passes, then, on the
    baseline's record, the passes' GEMMs alone and each expert GEMM problem. `baseline` is the
    same run's nccl_torch record of the same shape, if measured."""
    ctx = context(env, floors, ep)
    rows = _step_rows(record, ctx, baseline)
    rows += _pass_gemm_rows(record, ctx) + _problem_rows(record, ctx)
    return [_rounded(row) for row in rows]


def append(path: Path, rows: Iterable[dict]) -> None:
    """Append rows to a JSON-lines file (created with its directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as table:
        for row in rows:
            table.write(json.dumps(row, separators=(",", ":")) + "\n")


def load(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as table:
        return [json.loads(line) for line in table if line.strip()]


def is_step(row: dict) -> bool:
    """A whole pass (the baseline's or a mok system's), not GEMMs alone."""
    return ":" not in row["system"]


def card(row: dict) -> str:
    """The GPU's name, or CPU for a smoke run's rows."""
    return row["gpu"] or "CPU"


def tuned_runs(rows: list[dict]) -> set[str]:
    """The dates of the runs whose mok systems ran with `mok bench --config` knobs (mok_bf16_fg
    always sets its one knob, so its rows do not count)."""
    return {r["date"] for r in rows if r.get("config") and r["system"] in TUNABLE}


def latest_runs(rows: list[dict], gpu: str | None = None) -> dict[tuple, list[dict]]:
    """{(gpu, ep): the rows of the newest run that measured the baseline on that GPU and EP
    with mok's default knobs}: the standings are the defaults'; a --config run is an
    experiment beside them."""
    newest: dict[tuple, str] = {}
    tuned = tuned_runs(rows)
    for row in rows:
        if row["date"] in tuned:
            continue
        if row["system"] == BASELINE and (gpu is None or card(row) == gpu):
            key = (card(row), row["ep"])
            newest[key] = max(newest.get(key, ""), row["date"])
    return {
        key: [r for r in rows if (card(r), r["ep"]) == key and r["date"] == date]
        for key, date in sorted(newest.items())
    }


def _cell(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _kind(system: str) -> int:
    """Order of the standings: whole passes, then the passes' GEMMs, then single GEMMs."""
    return 2 if system.startswith("gemm:") else 1 if system.startswith("gemms:") else 0


def _standing(row: dict | None) -> str:
    if row is None:
        return ""
    if row["median_ms"] is None:  # a single GEMM: mok's rate over _grouped_mm's
        return _cell(row["vs_baseline"], ".3f")
    if row["vs_baseline"] is None:
        return f"{row['median_ms']:.2f} ms"
    return f"{row['median_ms']:.2f} ms ({row['vs_baseline']:.2f}×)"


def standings(run: list[dict]) -> str:
    """One run's numbers as markdown: every system's median and its ratio to the baseline."""
    first = run[0]
    shapes = list(dict.fromkeys(r["shape"] for r in run))
    by_key = {(r["system"], r["shape"], r["pass"]): r for r in run}
    lines = [
        f"EP {first['ep']} on {card(first)}: commit {first['commit']} (kernels built at "
        f"{first['build_commit']}), driver {first['driver']}, torch {first['torch']}, "
        f"{first['date']}; bf16 GEMM floor {_cell(first['floor_tflops'], '.0f')} TFLOP/s",
        "",
        "| system | pass | " + " | ".join(shapes) + " |",
        "|---" * (len(shapes) + 2) + "|",
    ]
    systems = sorted(dict.fromkeys(r["system"] for r in run), key=_kind)
    for system in systems:
        for phase in PASSES:
            cells = [_standing(by_key.get((system, shape, phase))) for shape in shapes]
            if any(cells):
                lines.append(f"| {system} | {phase} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def one_gpu_standings(rows: list[dict]) -> str:
    """The newest one-GPU group run per GPU (one_gpu.py): each pass's median per group size
    and its ratio to that many 1-rank steps back to back. Not EP speed: HBM stands in for NVLink."""
    newest: dict[str, str] = {}
    grouped = [r for r in rows if r["system"].endswith("_1gpu_cg")]
    for row in grouped:
        newest[card(row)] = max(newest.get(card(row), ""), row["date"])
    blocks = []
    for gpu, date in sorted(newest.items()):
        run = [r for r in grouped if card(r) == gpu and r["date"] == date]
        sizes = sorted({r["ep"] for r in run})
        by_key = {(r["system"], r["shape"], r["pass"], r["ep"]): r for r in run}
        lines = [
            f"N ranks on one {gpu} (commit {run[0]['commit']}, {date}): the machinery, "
            "not EP speed",
            "",
            "| system | shape | pass | " + " | ".join(f"{n} ranks" for n in sizes) + " |",
            "|---" * (len(sizes) + 3) + "|",
        ]
        for system, shape, phase in dict.fromkeys(
            (r["system"], r["shape"], r["pass"]) for r in run
        ):
            cells = [_standing(by_key.get((system, shape, phase, n))) for n in sizes]
            lines.append(f"| {system} | {shape} | {phase} | " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", nargs="?", type=Path, default=TABLE, help="a results.jsonl")
    parser.add_argument("--gpu", help="only this GPU (as the rows name it)")
    args = parser.parse_args(argv)
    rows = load(args.table)
    for run in latest_runs(rows, args.gpu).values():
        print(standings(run), end="\n\n")
    one_gpu = [r for r in rows if args.gpu is None or card(r) == args.gpu]
    if any(r["system"].endswith("_1gpu_cg") for r in one_gpu):
        print(one_gpu_standings(one_gpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
