"""Interleaved A/B of mok builds: mok.bench.run's measurements for each arm in turn, round by round.

    python3 benchmarks/ab.py --out DIR --arm old=dist/old/mok-*.whl --arm new=dist/new/mok-*.whl \
        [--rounds 2] [--nproc 1] [-- mok.bench.run options, e.g. --systems mok_mxfp8 --budget-s 1.0]

An arm is NAME=PATH: a wheel, installed with pip into DIR/site-NAME (no dependencies, no index:
the device machine has no network; a wheel older than the harness's move into the package gets
this tree's mok/bench), or a directory that holds the `mok` package, used as it is.
The arms run one after the other within each round, so every arm meets the GPU in the same
states (clocks and temperature drift over minutes; README.md, "Method"), and the spread between
rounds shows how much a difference between arms means. Each measurement is mok.bench.run's,
through torchrun, into DIR/NAME-ROUND/results.jsonl; the table gives per system, shape and EP
every arm's forward and backward medians round by round (the passes' GEMMs alone, its `gemms:`
lines, included; mok's eager passes also with their GPU busy ms, the steady measure of a build's GPU
work where the host sets the timed ms), and DIR/ab.json holds them with the `mok` each arm
imported (its path and build commit, from mok.bench.run's rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mok.bench import results

# The harness of this tree: it measures an arm whose wheel predates mok.bench.
BENCH = Path(__file__).resolve().parent.parent / "mok" / "bench"
ROWS = "results.jsonl"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for the runs and ab.json")
    p.add_argument("--arm", action="append", required=True, help="NAME=PATH (wheel or directory)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every arm (default 2)")
    p.add_argument("--nproc", type=int, default=1, help="ranks, i.e. EP (default 1)")
    p.add_argument(
        "--timeout-s", type=float, help="limit for one mok.bench.run call (default none)"
    )
    ours, theirs = _split(argv)
    args = p.parse_args(ours)
    if args.rounds < 1 or args.nproc < 1:
        p.error(f"--rounds and --nproc must be >= 1, got {args.rounds} and {args.nproc}")
    if "--out" in theirs:
        p.error("mok.bench.run's --out is set by ab.py (DIR/NAME-ROUND); leave it out after --")
    args.arms = [_arm(p, text) for text in args.arm]
    names = [name for name, _ in args.arms]
    if len(set(names)) != len(names):
        p.error(f"arm names must differ, got {names}")
    return args, theirs


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """ab.py's own arguments, and mok.bench.run's (after `--`)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def _arm(parser: argparse.ArgumentParser, text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        parser.error(f"--arm must be NAME=PATH, got {text!r}")
    if not name.replace("_", "").replace("-", "").isalnum():
        parser.error(f"--arm names are letters, digits, - and _, got {name!r}")
    location = Path(path)
    wheel = location.is_file() and location.suffix == ".whl"
    if not wheel and not (location / "mok" / "__init__.py").is_file():
        parser.error(f"--arm {name}: {path} is neither a .whl file nor a directory holding mok/")
    if not wheel and not (location / "mok" / "bench").is_dir():
        parser.error(f"--arm {name}: {path}/mok has no bench/ (the harness); pass a wheel instead")
    return name, location.resolve()


def site_of(name: str, location: Path, out: Path) -> Path:
    """The directory to put on PYTHONPATH for an arm: a wheel is installed there first."""
    if location.is_dir():
        return location
    site = out / f"site-{name}"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    command += ["--no-deps", "--no-index", "--upgrade", "--target", str(site), str(location)]
    subprocess.run(command, check=True)
    if not (site / "mok" / "bench").is_dir():
        shutil.copytree(BENCH, site / "mok" / "bench")
    return site


def run_arm(site: Path, out: Path, nproc: int, options: list[str], timeout_s) -> None:
    """One mok.bench.run call with this arm's mok first on the path (the ranks run from `out`,
    so the repository's own mok/ is not on their path unless an arm puts it there)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [
        f"--nproc-per-node={nproc}",
        "-m",
        "mok.bench.run",
        "--out",
        str(out / ROWS),
        *options,
    ]
    subprocess.run(command, env=env, check=True, timeout=timeout_s, cwd=out)


def collect(out: Path, names: list[str], rounds: int) -> list[dict]:
    """Per (system, shape, EP): every arm's fwd / bwd medians by round and the mok it ran."""
    rows: dict[tuple, dict] = {}
    for name in names:
        for r in range(1, rounds + 1):
            _add_run(rows, name, results.load(out / f"{name}-{r}" / ROWS))
    return list(rows.values())


def _add_run(rows: dict[tuple, dict], name: str, measured: list[dict]) -> None:
    """One mok.bench.run run's table rows into `rows`, as arm `name`'s next round: the whole passes
    and the passes' GEMMs alone (`gemms:<kernels>`); single GEMMs have rates, not times."""
    for one in measured:
        if one["system"].startswith("gemm:"):
            continue
        key = (one["system"], one["shape"], one["ep"])
        row = rows.setdefault(key, {"system": key[0], "shape": key[1], "ep": key[2]})
        lists = ("fwd_ms", "bwd_ms", "fwd_busy_ms", "bwd_busy_ms")
        arm = row.setdefault(name, {k: [] for k in lists})
        arm[f"{one['pass']}_ms"].append(one["median_ms"])
        arm[f"{one['pass']}_busy_ms"].append(one.get("gpu_busy_ms"))
        arm["mok_path"] = one.get("mok_path")
        arm["mok_build_commit"] = one.get("build_commit")


def table(rows: list[dict], names: list[str]) -> str:
    def times(values) -> str:
        return ", ".join("-" if v is None else f"{v:.3f}" for v in values)

    def cell(arm: dict) -> str:
        text = f"{times(arm['fwd_ms'])} / {times(arm['bwd_ms'])}"
        if any(v is not None for v in arm["fwd_busy_ms"] + arm["bwd_busy_ms"]):
            text += f" (GPU busy {times(arm['fwd_busy_ms'])} / {times(arm['bwd_busy_ms'])})"
        return text

    lines = [f"{'system':11} {'shape':14} EP  " + "   ".join(f"{n}: fwd / bwd ms" for n in names)]
    for row in rows:
        cells = [cell(row[n]) for n in names if n in row]
        lines.append(f"{row['system']:11} {row['shape']:14} {row['ep']:<3} " + "   ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args, options = parse(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    sites = {name: site_of(name, location, out) for name, location in args.arms}
    names = list(sites)
    start = time.monotonic()
    for r in range(1, args.rounds + 1):
        for name in names:
            print(
                f"[ab {time.monotonic() - start:7.1f} s] round {r}/{args.rounds}: {name}",
                flush=True,
            )
            run_arm(sites[name], out / f"{name}-{r}", args.nproc, options, args.timeout_s)
    rows = collect(out, names, args.rounds)
    arms = {name: str(location) for name, location in args.arms}
    (out / "ab.json").write_text(
        json.dumps({"arms": arms, "rounds": args.rounds, "rows": rows}, indent=2)
    )
    print(table(rows, names))
    for name in names:
        mine = next((row[name] for row in rows if name in row), {})
        print(f"{name}: mok from {mine.get('mok_path')}, built at {mine.get('mok_build_commit')}")


if __name__ == "__main__":
    main()
