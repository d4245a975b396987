"""Chart benchmark results: time over the compute floor per system, shape and EP (lower is better).

    python benchmarks/plot.py RESULTS.json [MORE.json ...] --out chart.png

One panel per pass (forward, backward); a group of bars per (shape, EP), one bar per system,
labelled with its median time in ms. The dashed line at 1 is the compute floor: the counted FLOPs
at the bf16 GEMM rate measured in the same run. Missing bars were skipped or failed (see JSON).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: the device machine and CI have no display
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

PHASES = (("fwd", "forward"), ("bwd", "backward"))


def load(paths: list[Path]) -> tuple[list[dict], list[dict]]:
    """(runs, records) of every file; each record gains its run's GPU name."""
    runs, records = [], []
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            runs.append(run)
            gpu = run["env"].get("gpu") or "CPU"
            records.extend({**r, "gpu": gpu} for r in run["records"])
    return runs, records


def _groups(records: list[dict]) -> tuple[list[tuple[str, int]], list[str]]:
    groups = sorted({(r["shape"], r["ep"]) for r in records}, key=lambda g: (g[1], g[0]))
    systems = list(dict.fromkeys(r["system"] for r in records))
    return groups, systems


def _title(runs: list[dict]) -> str:
    env = runs[0]["env"]
    gpus = sorted({run["env"].get("gpu") or "CPU" for run in runs})
    commit = (env.get("git_commit") or "unknown")[:10]
    return (
        f"mok vs NCCL + torch._grouped_mm on {', '.join(gpus)} (torch {env['torch']}, {commit});"
        " bar labels: median ms"
    )


def plot(paths: list[Path], out: Path) -> Path:
    runs, records = load(paths)
    groups, systems = _groups(records)
    by_key = {(r["system"], r["shape"], r["ep"]): r for r in records}
    fig, axes = plt.subplots(len(PHASES), 1, figsize=(max(8, 1.6 * len(groups) + 3), 8))
    width = 0.8 / max(1, len(systems))
    for ax, (phase, label) in zip(axes, PHASES, strict=True):
        for s, system in enumerate(systems):
            xs, heights, texts = [], [], []
            for g, (shape, ep) in enumerate(groups):
                row = by_key.get((system, shape, ep))
                ratio = row and row.get(f"x_floor_{phase}")
                if ratio:
                    xs.append(g + (s - (len(systems) - 1) / 2) * width)
                    heights.append(ratio)
                    texts.append(f"{row[phase]['median_ms']:.3g}")
            bars = ax.bar(xs, heights, width, label=system)
            ax.bar_label(bars, texts, fontsize=7, padding=2)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(groups)), [f"{shape}\nEP {ep}" for shape, ep in groups])
        ax.set_ylabel(f"{label}: time / compute floor")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    axes[0].set_title(_title(runs), fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="results.json file(s)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    print(plot(args.results, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
