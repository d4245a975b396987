"""The results table (benchmarks/results.jsonl, mok.bench.results) and its chart (mok.bench.chart):
the committed rows parse and carry every required key, a record becomes rows as documented, the
standings pick the newest run, and the chart of the committed table reads at a glance."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest
from bench_modules import BENCHMARKS, load

TABLE = BENCHMARKS / "results.jsonl"
if not TABLE.exists():
    pytest.skip(f"the results table is not next to the tests ({TABLE})", allow_module_level=True)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return load("results").load(TABLE)


def test_the_committed_table_parses_and_every_row_has_the_required_keys(rows):
    results = load("results")
    assert rows
    for row in rows:
        missing = set(results.REQUIRED) - set(row)
        assert not missing, (missing, row)
        assert set(row) <= set(results.REQUIRED + results.OPTIONAL), row
        assert row["pass"] in ("fwd", "bwd") and row["precision"] in ("bf16", "mxfp8")
        assert row["gpu"] and row["driver"] and row["torch"]  # measured runs, no smoke rows
        assert re.fullmatch(r"[0-9a-f]{7}", row["commit"]), row["commit"]
        assert datetime.fromisoformat(row["date"]).tzinfo is not None


def test_one_row_per_system_shape_ep_precision_pass_and_run(rows):
    """... and point, for a mok tune sweep (one run, one system, a row per pass and point: its
    config, and in `note` the knob it swept, as a config is timed again for each knob)."""
    keys = [(r["date"], r["gpu"], r["ep"], r["system"], r["shape"], r["pass"],
             json.dumps(r.get("config"), sort_keys=True), r.get("note")) for r in rows]  # fmt: skip
    assert len(keys) == len(set(keys))


def test_step_rows_hold_their_ratios(rows):
    """x_floor and vs_baseline agree with the medians they come from (rounding aside)."""
    by_run = {}
    for r in rows:
        by_run[(r["date"], r["ep"], r["system"], r["shape"], r["pass"])] = r
    for (date, ep, system, shape, phase), r in by_run.items():
        one_gpu = system.endswith("_1gpu_cg")  # against the 1-rank group: next test
        if system.startswith("mok_") and not one_gpu and r["median_ms"] and r["vs_baseline"]:
            baseline = by_run[(date, ep, "nccl_torch", shape, phase)]
            assert r["vs_baseline"] == pytest.approx(baseline["median_ms"] / r["median_ms"], 1e-4)


def test_one_gpu_group_rows_compare_with_that_many_single_rank_steps():
    """one_gpu.py's rows: ep = N, every rank's FLOPs, vs_baseline = N x the 1-rank
    group's time / the N-rank group's, labelled as one GPU; the standings list them apart."""
    bench, results, harness = load("one_gpu"), load("results"), load("harness")
    shape = load("shapes").SHAPES["qwen3-235b"]
    one = {p: harness.Timing(ms, ms, ms, 10, 1) for p, ms in (("fwd", 2.0), ("bwd", 4.0))}
    four = {p: harness.Timing(ms, ms, ms, 10, 1) for p, ms in (("fwd", 10.0), ("bwd", 16.0))}
    env = {**ENV, "gpu": "NVIDIA H100 80GB HBM3"}
    single = bench.rows(env, shape, 1, "bf16", one, one)
    fwd, bwd = bench.rows(env, shape, 4, "bf16", four, one)
    assert (fwd["ep"], fwd["gpu_count"], fwd["system"]) == (4, 1, "mok_bf16_1gpu_cg")
    assert fwd["vs_baseline"] == pytest.approx(0.8) and bwd["vs_baseline"] == pytest.approx(1.0)
    fwd_flops = load("shapes").flops(shape)[0]
    assert fwd["tflops"] == pytest.approx(4 * fwd_flops / 10e-3 / 1e12)
    assert "4 ranks on one GPU" in fwd["note"]
    for row in (*single, fwd, bwd):
        assert set(results.REQUIRED) <= set(row) <= set(results.REQUIRED + results.OPTIONAL)
    text = results.one_gpu_standings([*single, fwd, bwd])
    assert "| mok_bf16_1gpu_cg | qwen3-235b | fwd | 2.00 ms (1.00×) | 10.00 ms (0.80×) |" in text


def test_a_failed_one_gpu_group_size_leaves_rows_with_its_error(monkeypatch):
    bench = load("one_gpu")
    shape = load("shapes").SHAPES["dsv4-pro"]

    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(bench, "measure", out_of_memory)
    monkeypatch.setattr(bench.torch.cuda, "empty_cache", lambda: None)
    env = {**ENV, "gpu": "NVIDIA H100 80GB HBM3"}
    measured = bench._measured_rows(None, None, env, shape, 8, "mxfp8", None)
    assert measured.single is None and measured.summary.startswith("failed: RuntimeError")
    for row in measured.rows:
        assert row["median_ms"] is None and row["vs_baseline"] is None
        assert "8 ranks on one GPU" in row["note"] and "out of memory" in row["note"]


RECORD = {
    "system": "mok_mxfp8",
    "shape": "tiny",
    "hidden": 128,
    "inter": 128,
    "topk": 2,
    "experts": 2,
    "tokens": 64,
    "shared": True,
    "flops_fwd": 6e12,
    "flops_bwd": 12e12,
    "fwd": {"median_ms": 10.0, "min_ms": 9.0, "max_ms": 11.0, "iters": 5, "warmup_iters": 1,
            "power": [{"sm_mhz_mean": 1500.0, "power_w_mean": 700.0, "power_capped_share": 1.0,
                       "joules_per_iter": 7.0}]},
    "bwd": {"median_ms": 30.0, "min_ms": 29.0, "max_ms": 31.0, "iters": 5, "warmup_iters": 1,
            "power": [None]},
    "check": {"vs_baseline": {"out": {"max_abs": 0.1, "rel_l1": 0.03},
                              "d_x": {"max_abs": 0.2, "rel_l1": 0.04}}},
    "gpu_busy_ms": {"fwd": 9.5, "bwd": None},
}  # fmt: skip
ENV = {
    "time_utc": "2026-12-05T01:45:26+00:00",
    "git_commit": "9cff2b3b97b0cd32078de93ef4cc14fbe1fa70b2",
    "mok_build_commit": None,
    "gpu": "NVIDIA H200",
    "driver": "580.159.04",
    "torch": "2.11.0+cu130",
}


def test_a_record_becomes_one_row_per_pass():
    results = load("results")
    baseline = {"fwd": {"median_ms": 15.0}, "bwd": {"median_ms": 45.0}}
    fwd, bwd = results.rows_of(RECORD, ENV, {"gemm_bf16_tflops": 1200.0}, 1, baseline)
    assert (fwd["pass"], bwd["pass"], fwd["precision"]) == ("fwd", "bwd", "mxfp8")
    assert fwd["commit"] == "9cff2b3" and fwd["build_commit"] is None
    assert fwd["tflops"] == pytest.approx(600.0) and fwd["x_floor"] == pytest.approx(2.0)
    assert fwd["vs_baseline"] == pytest.approx(1.5) and bwd["vs_baseline"] == pytest.approx(1.5)
    assert (fwd["sm_mhz"], fwd["joules_per_iter"], bwd["sm_mhz"]) == (1500.0, 7.0, None)
    assert (fwd["gpu_busy_ms"], bwd["gpu_busy_ms"]) == (9.5, None)
    assert list(fwd["check"]["vs_baseline"]) == ["out"]
    assert list(bwd["check"]["vs_baseline"]) == ["d_x"]


def test_the_baseline_record_adds_its_gemm_rows():
    results = load("results")
    record = {**RECORD, "system": "nccl_torch", "check": {}, "gpu_busy_ms": None}
    record |= {
        "grouped_mm_dgrad_down_mx_tflops": 600.0,
        "mok_gemm_dgrad_down_mx_tflops": 570.0,
        "mok_gemm_dgrad_down_mx_vs_grouped_mm": 0.95,
        "gemm_pass": {
            "torch": {"fwd": {"median_ms": 8.0}, "bwd": {"median_ms": 20.0}},
            "mok": {"fwd": {"median_ms": 10.0}, "bwd": {"median_ms": 16.0}},
        },
    }
    rows = results.rows_of(record, ENV, None, 2)
    assert [(r["system"], r["pass"]) for r in rows] == [
        ("nccl_torch", "fwd"), ("nccl_torch", "bwd"), ("gemms:torch", "fwd"),
        ("gemms:torch", "bwd"), ("gemms:mok", "fwd"), ("gemms:mok", "bwd"),
        ("gemm:dgrad_down_mx", "bwd"),
    ]  # fmt: skip
    assert rows[0]["vs_baseline"] is None and rows[0]["x_floor"] is None  # no floor measured
    assert [r["vs_baseline"] for r in rows[4:6]] == [pytest.approx(0.8), pytest.approx(1.25)]
    problem = rows[-1]
    assert (problem["precision"], problem["tflops"]) == ("mxfp8", 570.0)
    assert problem["baseline_tflops"] == 600.0
    assert problem["vs_baseline"] == 0.95 and problem["median_ms"] is None


def test_standings_take_the_newest_run_with_the_baseline_per_gpu_and_ep(rows):
    """...with mok's default knobs: a `mok bench --config` run is left out."""
    results = load("results")
    runs = results.latest_runs(rows)
    tuned = results.tuned_runs(rows)
    assert tuned, "the committed table holds a --config run (H100, 2026-12-07)"
    for (gpu, ep), run in runs.items():
        assert not {r["date"] for r in run} & tuned
        baseline = [r for r in rows if (r["gpu"], r["ep"], r["system"]) == (gpu, ep, "nccl_torch")
                    and r["date"] not in tuned]  # fmt: skip
        newest = max(r["date"] for r in baseline)
        assert {r["date"] for r in run} == {newest}
        text = results.standings(run)
        assert text.startswith(f"EP {ep} on {gpu}: commit {run[0]['commit']}")
        assert "| mok_bf16 | fwd |" in text


def test_plot_draws_the_committed_table_with_a_title_that_fits(tmp_path, rows):
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib")
    plot = load("chart")
    fig = plot.figure(plot.select(rows))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    inside = fig.bbox
    title = fig._suptitle.get_window_extent(renderer)
    assert inside.x0 <= title.x0 and title.x1 <= inside.x1 and title.y1 <= inside.y1
    for ax in fig.axes:
        assert ax.get_yscale() == "linear"
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert labels and all(re.fullmatch(r"\d+(\.\d+)?", text) for text in labels), labels
    png = tmp_path / "chart.png"
    assert plot.main([str(TABLE), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_timing_with_the_energy_reading_only_makes_a_row():
    """A measurement shorter than one power sample has NVML's energy reading but no samples
    (mok tune's short points on the GPU): its row has the energy and no clock or power."""
    results = load("results")
    timing = {"median_ms": 2.0, "power": [{"joules_per_iter": 1.5}, None]}
    row = results.timed({}, timing, 10**12, None, None)
    assert (row["sm_mhz"], row["power_w"], row["power_capped"]) == (None, None, None)
    assert row["joules_per_iter"] == 1.5
