"""Chart one run of the results table: each system's time over the compute floor, by shape and EP.

    python -m mok.bench.chart [TABLE] --out chart.png [--gpu NAME] [--commit SHA]

By default the newest run that measured the baseline, on its GPU, at every EP measured from
that commit (the newest run of each). One panel per pass (forward, backward); a group of bars
per (shape, EP), one bar per system, labelled with its median ms. The dashed line at 1 is the
compute floor: the counted FLOPs at the bf16 GEMM rate measured in the same run; lower is
better. The GEMMs alone (`gemms:`, `gemm:` rows) are left out: mok/bench/results.py prints them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: the device machine and CI have no display
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from mok.bench import results  # noqa: E402

PHASES = (("fwd", "forward"), ("bwd", "backward"))
LABELS = {
    "nccl_torch": "NCCL all_to_all + torch._grouped_mm (baseline)",
    "mok_bf16": "mok BF16",
    "mok_bf16_fg": "mok BF16, every exchange in the foreground",
    "mok_mxfp8": "mok MXFP8",
    "mok_bf16_cg": "mok BF16 from a CUDA graph",
    "mok_mxfp8_cg": "mok MXFP8 from a CUDA graph",
}


def select(rows: list[dict], gpu: str | None = None, commit: str | None = None) -> list[dict]:
    """The whole-pass rows to draw: the newest run of each EP on `gpu` from `commit` (default:
    the GPU and commit of the newest run that measured the baseline)."""
    steps = [r for r in rows if results.is_step(r)]
    candidates = [
        r
        for r in steps
        if r["system"] == results.BASELINE
        and (gpu is None or results.card(r) == gpu)
        and (commit is None or r["commit"] == commit)
    ]
    if not candidates:
        raise ValueError(f"no run with the baseline for gpu={gpu!r}, commit={commit!r}")
    newest = max(candidates, key=lambda r: r["date"])
    mine = [r for r in steps if (r["gpu"], r["commit"]) == (newest["gpu"], newest["commit"])]
    last = {}
    for row in mine:
        last[row["ep"]] = max(last.get(row["ep"], ""), row["date"])
    return [r for r in mine if r["date"] == last[r["ep"]]]


def _title(chosen: list[dict]) -> str:
    first = chosen[0]
    eps = ", ".join(str(ep) for ep in sorted({r["ep"] for r in chosen}))
    return (
        f"mok against NCCL + torch._grouped_mm on {results.card(first)}, EP {eps}\n"
        f"commit {first['commit']}, torch {first['torch']}, driver {first['driver']}, "
        f"{first['date'][:10]}; bar labels: median ms; lower is better"
    )


def _draw(ax, phase: str, label: str, chosen: list[dict]) -> None:
    groups = sorted({(r["shape"], r["ep"]) for r in chosen}, key=lambda g: (g[1], g[0]))
    systems = list(dict.fromkeys(r["system"] for r in chosen))
    by_key = {(r["system"], r["shape"], r["ep"]): r for r in chosen if r["pass"] == phase}
    width = 0.8 / max(1, len(systems))
    for s, system in enumerate(systems):
        drawn = [
            (g, by_key[(system, *group)])
            for g, group in enumerate(groups)
            if by_key.get((system, *group), {}).get("x_floor")
        ]
        xs = [g + (s - (len(systems) - 1) / 2) * width for g, _ in drawn]
        bars = ax.bar(xs, [r["x_floor"] for _, r in drawn], width, label=LABELS.get(system, system))
        ax.bar_label(bars, [f"{r['median_ms']:.2f}" for _, r in drawn], fontsize=6, padding=2)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.annotate("compute floor", (1.0, 1.0), xycoords=("axes fraction", "data"), fontsize=7,
                xytext=(-2, 2), textcoords="offset points", ha="right")  # fmt: skip
    ax.set_xticks(range(len(groups)), [f"{shape}, EP {ep}" for shape, ep in groups])
    ax.set_ylabel(f"{label}: time / compute floor")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # room for the labels over the tallest bars


def figure(chosen: list[dict]):
    """The chart of `chosen` (select's rows): a panel per pass, the legend below both."""
    fig, axes = plt.subplots(len(PHASES), 1, figsize=(11, 8.5), layout="constrained")
    for ax, (phase, label) in zip(axes, PHASES, strict=True):
        _draw(ax, phase, label, chosen)
    fig.suptitle(_title(chosen), fontsize=11)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


def plot(table: Path, out: Path, gpu: str | None = None, commit: str | None = None) -> Path:
    fig = figure(select(results.load(table), gpu, commit))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_sweep(points: list[dict], title: str, out: Path) -> Path:
    """`mok tune`'s chart: a panel per knob, forward, backward and their sum (ms) over the
    knob's values (plain numbers, evenly spaced), the value kept marked."""
    knobs = list(dict.fromkeys(p["knob"] for p in points))
    fig, axes = plt.subplots(len(knobs), 1, figsize=(8, 2.2 * len(knobs) + 1), squeeze=False,
                             layout="constrained")  # fmt: skip
    for ax, knob in zip(axes[:, 0], knobs, strict=True):
        mine = [p for p in points if p["knob"] == knob]
        x = range(len(mine))
        for key, label in (("total_ms", "forward + backward"), ("fwd_ms", "forward"),
                           ("bwd_ms", "backward")):  # fmt: skip
            ax.plot(x, [p[key] for p in mine], marker="o", label=label)
        kept = [i for i, p in enumerate(mine) if p.get("chosen")]
        ax.plot(kept, [mine[i]["total_ms"] for i in kept], "k*", markersize=14, label="kept")
        ax.set_xticks(list(x), [str(p["value"]) for p in mine])
        ax.set_xlabel(knob)
        ax.set_ylabel("ms")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    axes[0, 0].legend(ncols=4, fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", nargs="?", type=Path, default=results.TABLE, help="rows (.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--gpu", help="the GPU as the rows name it, or CPU (default: the newest)")
    parser.add_argument("--commit", help="the commit as the rows name it (7 hex digits)")
    args = parser.parse_args(argv)
    try:
        print(plot(args.table, args.out, args.gpu, args.commit))
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
