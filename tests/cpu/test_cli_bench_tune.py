"""`mok bench` and `mok tune` on CPU (gloo, the reference backend, tiny sizes), each in a process of
its own as a user runs it: the rows, the table, the config and the charts they write; and the
sweep's rules (a knob moves only for a real gain; a point whose bits differ fails the run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_mok

from mok.bench import harness, tune
from mok.bench.progress import Progress
from mok.config import MoKConfig

TINY = ["--hidden", "128", "--inter", "128", "--topk", "2", "--experts", "2", "--tokens", "64"]


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_writes_the_fastest_config_and_every_point(tmp_path):
    knobs = ["overlap_ctas", "minibatch_size"]
    done = run_mok("tune", "--cpu", *TINY, "--ep", "2", "--shared", "--knobs", *knobs,
                "--budget-s", "0", "--max-iters", "1", "--out", "out", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "same bits at every point" in done.stdout
    config = MoKConfig.from_json(tmp_path / "out" / "config.json")
    lines = (tmp_path / "out" / "sweep.jsonl").read_text().splitlines()
    points = [json.loads(line) for line in lines]
    expected = [knob for knob in knobs for _ in tune.CANDIDATES[knob]]
    assert [p["knob"] for p in points] == expected
    assert all(p["same_bits"] and p["ep"] == 2 and p["gpu"] == "CPU" for p in points)
    assert all(p["config"]["overlap_dispatch"] for p in points), "the sweep starts overlapped"
    for knob in knobs:  # one value kept per knob: the config's
        kept = [p["value"] for p in points if p["knob"] == knob and p["chosen"]]
        assert kept == [getattr(config, knob)]
    from mok.bench import results

    rows = results.load(tmp_path / "out" / "rows.jsonl")  # the results table's schema
    assert len(rows) == 2 * len(points)
    assert all(set(results.REQUIRED) <= set(r) <= {*results.REQUIRED, *results.OPTIONAL}
               for r in rows)  # fmt: skip
    assert {(r["system"], r["ep"], r["pass"]) for r in rows} == {
        ("mok_bf16_tune", 2, "fwd"), ("mok_bf16_tune", 2, "bwd")}  # fmt: skip
    assert [r["config"] for r in rows[::2]] == [p["config"] for p in points]
    if (tmp_path / "out" / "sweep.png").exists() or "no chart" not in done.stdout:
        assert _png(tmp_path / "out" / "sweep.png")


def test_bench_runs_alone_and_writes_rows_table_and_chart(tmp_path):
    """Without torchrun `mok bench` is a group of one (EP 1); its defaults put the rows and the
    chart in ./mok-bench/."""
    done = run_mok("bench", "--smoke", "--shapes", "tiny", "--systems", "nccl_torch", "mok_bf16",
                cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (tmp_path / "mok-bench" / "results.jsonl").open()]
    assert {r["system"] for r in rows} >= {"nccl_torch", "mok_bf16"}
    assert {r["ep"] for r in rows} == {1}
    assert "mok_bf16    tiny" in done.stdout  # the table
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib")
    assert _png(tmp_path / "mok-bench" / "chart.png")


def test_bench_runs_mok_with_the_knobs_of_a_config(tmp_path):
    """`mok bench --config` (mok tune's config.json): the mok systems run with its knobs and
    their rows carry them; the baseline's rows do not; the run sets the schedule capacity."""
    tuned = MoKConfig(overlap_ctas=0, minibatch_size=512, schedule_capacity_multiplier=3.0)
    (tmp_path / "config.json").write_text(tuned.to_json())
    done = run_mok("bench", "--smoke", "--shapes", "tiny", "--systems", "nccl_torch", "mok_bf16",
                   "--config", "config.json", "--no-chart", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (tmp_path / "mok-bench" / "results.jsonl").open()]
    configs = {r["system"]: r.get("config") for r in rows if r["pass"] == "fwd"}
    assert configs["nccl_torch"] is None
    assert configs["mok_bf16"]["overlap_ctas"] == 0 and configs["mok_bf16"]["minibatch_size"] == 512
    assert "schedule_capacity_multiplier" not in configs["mok_bf16"]


def test_bench_names_a_config_it_cannot_read(tmp_path):
    (tmp_path / "bad.json").write_text('{"minibatch_size": 100}')
    for path, message in (("missing.json", "No such file"), ("bad.json", "`minibatch_size`")):
        done = run_mok("bench", "--smoke", "--config", path, cwd=tmp_path)
        assert done.returncode == 2
        assert f"mok bench: error: --config {path}: " in done.stderr and message in done.stderr


@pytest.mark.parametrize("system", ["mok_bf16", "mok_bf16_fg", "mok_mxfp8", "mok_bf16_cg",
                                    "mok_mxfp8_cg"])  # fmt: skip
def test_every_mok_system_hands_its_knobs_to_the_step(monkeypatch, system):
    from mok.bench import mok_step, run

    class Built(Exception):
        pass

    def step(*args, knobs=None, **options):
        raise Built(knobs)

    monkeypatch.setattr(mok_step, "Step", step)
    monkeypatch.setattr(mok_step, "GraphStep", step)
    gpu = type("Dist", (), {"cuda": True})()
    with pytest.raises(Built) as built:
        run.MOK_SYSTEMS[system](gpu, None, None, [], knobs={"minibatch_size": 512})
    assert built.value.args[0]["minibatch_size"] == 512


class _Runner:
    """A stand-in for a group: the time and the output bits of each config are given."""

    def __init__(self, ms: dict, bits: dict | None = None):
        self.ms, self.bits, self.config = ms, bits or {}, None

    def use(self, config):
        self.config = config

    def outputs(self):
        import torch

        return [torch.tensor([self.bits.get(self.config.overlap_ctas, 0)])]

    def passes(self):
        ms = self.ms[self.config.overlap_ctas]
        return (lambda: ms), (lambda: 0.0)


class _Timer:
    def agree_max(self, value):
        return value

    def measure(self, fn):
        return harness.Timing(fn(), 0.0, 0.0, 1, 1)


def _sweep(ms: dict, bits: dict | None = None) -> tune.Sweep:
    base = MoKConfig(overlap_ctas=64)
    sweep = tune.Sweep(_Runner(ms, bits), _Timer(), base, min_gain=0.02)
    with Progress(len(ms), "test", enabled=False) as progress:
        sweep.knob("overlap_ctas", None, progress)
    return sweep


def test_a_knob_moves_only_for_more_than_the_minimum_gain():
    ms = {0: 9.9, 16: 10.0, 32: 10.0, 64: 10.0, 96: 10.0, 128: 10.0}
    assert _sweep(ms).best.overlap_ctas == 64  # 1% faster: noise
    ms[0] = 9.0
    assert _sweep(ms).best.overlap_ctas == 0


def test_a_point_with_other_bits_is_flagged():
    ms = dict.fromkeys(tune.CANDIDATES["overlap_ctas"], 1.0)
    sweep = _sweep(ms, bits={32: 1})
    assert [p["value"] for p in sweep.points if not p["same_bits"]] == [32]


def test_candidates_respect_the_device_and_the_minibatch():
    base = MoKConfig(minibatch_size=8192, macrobatch_size=131072)
    assert max(c.fwd_num_comm_sms for c in tune.candidates("fwd_num_comm_sms", base, 32)) == 32
    macros = [c.macrobatch_size for c in tune.candidates("macrobatch_size", base, None)]
    assert macros == [16384, 32768, 65536, 131072]
    base = MoKConfig(minibatch_size=1024, macrobatch_size=16384)
    minis = [c.minibatch_size for c in tune.candidates("minibatch_size", base, None)]
    assert minis == [256, 512, 1024, 2048, 4096, 8192]


def test_bench_without_the_baseline_says_why_there_is_no_chart(tmp_path):
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib")
    done = run_mok("bench", "--smoke", "--shapes", "tiny", "--systems", "mok_bf16", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no chart: no run with the baseline" in done.stdout
    assert (tmp_path / "mok-bench" / "results.jsonl").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--hidden", "0"], "argument --hidden: must be a positive integer, got '0'"),
        (["--hidden", "100"], "`hidden_size` must be a multiple of 128 and >= 1, got 100"),
        (["--topk", "9", "--ep", "2"], "--topk 9 picks more experts than the group holds "
                                       "(--experts x EP = 4)"),
    ],
    ids=["hidden-zero", "hidden-not-128", "topk-above-experts"],
)  # fmt: skip
def test_tune_names_what_is_wrong_with_its_sizes(tmp_path, change, message):
    argv = [*TINY]
    for flag, value in zip(change[::2], change[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    done = run_mok("tune", "--cpu", *argv, cwd=tmp_path)
    assert done.returncode == 2
    assert f"mok tune: error: {message}" in done.stderr


def test_tune_under_torchrun_is_one_rank_per_process(tmp_path):
    """`torchrun -m mok.cli tune`: each process is a rank (mok_step.Step), EP = the ranks."""
    done = run_mok("tune", "--cpu", *TINY, "--knobs", "overlap_ctas", "--budget-s", "0",
                   "--max-iters", "1", "--out", "out", cwd=tmp_path, nproc=2)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    points = [json.loads(line) for line in (tmp_path / "out" / "sweep.jsonl").open()]
    assert len(points) == len(tune.CANDIDATES["overlap_ctas"])
    assert all(p["ep"] == 2 and p["processes"] == 2 and p["same_bits"] for p in points)
