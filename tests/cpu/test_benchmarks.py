"""The benchmark suite end to end on CPU: `mok.bench.run --smoke` through torchrun on 1 and 2 gloo
ranks (the path the device runbook takes, with tiny shapes and the reference backend), the
rows it appends (mok/bench/results.py's schema), the baseline's correctness against a float64
dense MoE (so the baseline the numbers are compared with is a correct MoE, not a strawman), and
the chart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_modules import BENCHMARKS
from bench_modules import load as _load

import mok

EP_SIZES = (1, 2)
SYSTEMS = ("nccl_torch", "mok_bf16", "mok_bf16_fg", "mok_mxfp8")
SMOKE_SHAPES = ("tiny", "tiny-noshared")
CHECKED = ("out", "d_x", "d_rw", "d_gate", "d_up", "d_down")
# Σ|diff| / Σ|ref| bounds against float64 (the original's tolerances): BF16 0.01, MXFP8 0.1.
BOUND = {"nccl_torch": 0.01, "mok_bf16": 0.01, "mok_bf16_fg": 0.01, "mok_mxfp8": 0.1}


def _child_env() -> dict[str, str]:
    # The ranks import the same mok as this process (the wheel under tools/test_wheel.sh, the
    # source tree otherwise) and the same third-party packages (Bazel runfiles included).
    paths = [str(Path(mok.__file__).resolve().parent.parent), *sys.path]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    env.pop("MOK_BACKEND", None)
    return env


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    """The rows of smoke runs at EP 1 and EP 2 appended to one table, plus their stdout."""
    out = tmp_path_factory.mktemp("bench")
    table = out / "results.jsonl"
    stdout = {}
    for ep in EP_SIZES:  # one after the other: both append to one table
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += [f"--nproc-per-node={ep}", "-m", "mok.bench.run", "--smoke"]
        done = subprocess.run(
            [*command, "--out", str(table)],
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"EP {ep} smoke run failed:\n{done.stdout}\n{done.stderr}"
        stdout[ep] = done.stdout
    return {"dir": out, "table": table, "rows": _load("results").load(table), "stdout": stdout}


def _rows(smoke: dict, ep: int, system: str | None = None) -> list[dict]:
    return [r for r in smoke["rows"] if r["ep"] == ep and (system is None or r["system"] == system)]


def test_rows_carry_the_run_environment_and_floors(smoke):
    import torch

    results = _load("results")
    assert {r["ep"] for r in smoke["rows"]} == set(EP_SIZES)
    for ep in EP_SIZES:
        rows = _rows(smoke, ep)
        assert len({r["date"] for r in rows}) == 1  # one run per EP
        for r in rows:
            assert set(results.REQUIRED) <= set(r) <= set(results.REQUIRED + results.OPTIONAL)
            assert (r["gpu"], r["driver"], r["mok_kernels"]) == (None, None, False)
            assert r["torch"] == torch.__version__ and r["commit"]
            assert r["floor_tflops"] > 0 and r["floor_copy_GBps"] > 0
            assert r["floor_nvlink_GBps"] is None  # no GPUs here


@pytest.mark.parametrize("ep", EP_SIZES, ids=lambda ep: f"ep{ep}")
def test_every_system_shape_and_pass_measured(smoke, ep):
    steps = [r for r in _rows(smoke, ep) if ":" not in r["system"]]
    assert sorted((r["system"], r["shape"], r["pass"]) for r in steps) == sorted(
        (system, shape, phase)
        for system in SYSTEMS
        for shape in SMOKE_SHAPES
        for phase in ("fwd", "bwd")
    )
    for r in steps:
        assert r["note"] is None, r
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["iters"] >= 1 and r["warmup_iters"] >= 1
        assert r["sm_mhz"] is None and r["power_w"] is None  # no GPU to sample here
        assert r["tflops"] > 0 and r["x_floor"] > 0
        assert r["precision"] == ("mxfp8" if r["system"] == "mok_mxfp8" else "bf16")
        baseline = r["system"] == "nccl_torch"
        assert (r["vs_baseline"] is None) if baseline else r["vs_baseline"] > 0
        if r["system"].startswith("mok_"):  # busy time needs the GPU's kernel records
            assert r["gpu_busy_ms"] is None


@pytest.mark.parametrize("ep", EP_SIZES, ids=lambda ep: f"ep{ep}")
def test_the_baseline_brings_its_gemms_alone(smoke, ep):
    """The yardstick of mok's expert GEMM kernels (`gemm:<problem>`: torch's rate; mok's kernels
    need a Hopper GPU) and each pass's GEMMs alone (`gemms:torch` only, for the same reason)."""
    rows = _rows(smoke, ep)
    for problem in ("gate_up", "down"):
        (fwd,) = [r for r in rows if r["system"] == f"gemm:{problem}" and r["shape"] == "tiny"]
        assert fwd["baseline_tflops"] > 0 and fwd["tflops"] is None and fwd["median_ms"] is None
    alone = [r for r in rows if r["system"].startswith("gemms:")]
    assert sorted((r["shape"], r["pass"]) for r in alone if r["system"] == "gemms:torch") == [
        (shape, phase) for shape in sorted(SMOKE_SHAPES) for phase in ("bwd", "fwd")
    ]
    assert {r["system"] for r in alone} == {"gemms:torch"}
    assert all(r["median_ms"] > 0 for r in alone)


@pytest.mark.parametrize("ep", EP_SIZES, ids=lambda ep: f"ep{ep}")
@pytest.mark.parametrize("system", SYSTEMS)
def test_outputs_and_gradients_match_dense_float64(smoke, system, ep):
    for shape in SMOKE_SHAPES:
        rows = [r for r in _rows(smoke, ep, system) if r["shape"] == shape]
        errors = {k: v for r in rows for k, v in r["check"]["vs_dense"].items()}
        assert set(errors) == set(CHECKED)
        for name, error in errors.items():
            assert error["rel_l1"] <= BOUND[system], (shape, name, error)


@pytest.mark.parametrize("ep", EP_SIZES, ids=lambda ep: f"ep{ep}")
def test_mok_compared_with_the_baseline_in_the_same_run(smoke, ep):
    for r in _rows(smoke, ep, "mok_bf16"):
        for name, error in r["check"]["vs_baseline"].items():
            assert error["rel_l1"] <= 2 * BOUND["mok_bf16"], (r["shape"], name, error)


def test_table_printed_by_rank_zero(smoke):
    for ep, text in smoke["stdout"].items():
        assert f"EP {ep} on CPU: bf16 GEMM" in text
        assert sum(line.startswith(SYSTEMS) for line in text.splitlines()) == 2 * len(SYSTEMS)


def test_flop_count_is_the_originals():
    harness = _load("harness")
    with_shared = harness.SHAPES["dsv4-pro"]
    t, k, h, i = with_shared.tokens, with_shared.topk, with_shared.hidden, with_shared.inter
    assert harness.flops(with_shared) == (6 * (t + t * k) * h * i, 12 * (t + t * k) * h * i)
    routed_only = harness.SHAPES["qwen3-235b"]
    t, k, h, i = routed_only.tokens, routed_only.topk, routed_only.hidden, routed_only.inter
    assert harness.flops(routed_only) == (6 * t * k * h * i, 12 * t * k * h * i)


def test_power_summary_of_nvidia_smi_samples():
    """Clock (MHz), board power (W) and the power-cap reason per sample; a line cut off when the
    sampler stopped is left out, and no samples give None."""
    power = _load("power")
    lines = ["1980, 120.5, Not Active", "1470, 699.5, Active", "1500, 700.0, Active", "1500, 70"]
    summary = power.summarize(lines)
    assert summary == {
        "power_w_mean": pytest.approx((120.5 + 699.5 + 700.0) / 3),
        "power_w_max": 700.0,
        "sm_mhz_mean": pytest.approx((1980 + 1470 + 1500) / 3),
        "sm_mhz_min": 1470.0,
        "power_capped_share": pytest.approx(2 / 3),
        "samples": 3,
    }
    assert power.summarize(["", "[N/A], [N/A], Active"]) is None


def test_table_clock_is_the_slowest_sampled_gpu():
    """The table's MHz column: the lowest mean SM clock among the GPUs that were sampled."""
    clock = _load("run")._clock
    assert clock({"power": [{"sm_mhz_mean": 1600.0}, None, {"sm_mhz_mean": 1500.0}]}) == 1500.0
    assert clock({"power": [None, None]}) is None
    assert clock({"power": None}) is None and clock({}) is None


FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "$1" = "--help-query-gpu" ]; then
  echo '"power.draw"'; echo '"power.draw.instant"'; echo '"clocks_event_reasons.sw_power_cap"'
  exit 0
fi
echo "$@" > "$(dirname "$0")/argv"
while true; do echo "1500, 699.00, Active"; sleep 0.01; done
"""


def test_power_sampler_runs_nvidia_smi_for_the_gpu_and_stops_it(tmp_path, monkeypatch):
    """The sampler asks the driver which fields it has, samples the GPU by UUID and stops its
    nvidia-smi when the measurement ends (a fake nvidia-smi on PATH stands in for the driver)."""
    import torch

    power = _load("power")
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    props = type("Props", (), {"uuid": "1234-abcd"})()
    monkeypatch.setattr(power.torch.cuda, "get_device_properties", lambda device: props)
    power._query_fields.cache_clear()
    try:
        with power.Sampler(torch.device("cuda", 0)) as sampler:
            deadline = time.monotonic() + 10
            while not (tmp_path / "argv").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.1)
    finally:
        power._query_fields.cache_clear()
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:2] == ["-i", "GPU-1234-abcd"]
    assert "--query-gpu=clocks.sm,power.draw.instant,clocks_event_reasons.sw_power_cap" in argv
    assert sampler._process.poll() is not None  # stopped, not left running
    summary = sampler.summary
    assert summary["samples"] >= 1 and summary["power_capped_share"] == 1.0
    assert summary["sm_mhz_mean"] == 1500.0 and summary["power_w_max"] == 699.0


class FakeNvml:
    """NVML's two calls the energy reader makes; the counter reads 5.000 J, then 47.500 J."""

    def __init__(self) -> None:
        self.uuids, self.millijoules = [], iter([5_000, 47_500])

    def nvmlDeviceGetHandleByUUID(self, uuid, handle) -> int:
        self.uuids.append(uuid)
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, millijoules) -> int:
        millijoules._obj.value = next(self.millijoules)
        return 0


def test_energy_from_nvml_per_timed_iteration(single_rank_group, monkeypatch):
    """The sampler reads the GPU's NVML energy counter (by UUID) before and after the block;
    per_rank turns the difference into joules per iteration; without NVML nothing is read."""
    import torch

    power = _load("power")
    nvml = FakeNvml()
    monkeypatch.setattr(power, "_nvml", lambda: nvml)
    monkeypatch.setattr(power, "_query_fields", lambda: None)  # no nvidia-smi samples
    props = type("Props", (), {"uuid": "1234-abcd"})()
    monkeypatch.setattr(power.torch.cuda, "get_device_properties", lambda device: props)
    with power.Sampler(torch.device("cuda", 0)) as sampler:
        pass
    assert nvml.uuids == [b"GPU-1234-abcd"]
    assert sampler.summary["energy_j"] == pytest.approx(42.5)
    assert 0 <= sampler.summary["energy_window_s"] < 5
    (summary,) = power.per_rank(sampler.summary, single_rank_group, 5)
    assert summary["joules_per_iter"] == pytest.approx(8.5) and "energy_j" not in summary
    monkeypatch.setattr(power, "_nvml", lambda: None)
    assert power.energy_reader("1234-abcd")() is None


@pytest.mark.parametrize("name", ["dsv4-pro", "qwen3-235b", "qwen3.5"])
def test_each_expert_sees_about_2048_rows(name):
    assert _load("harness").SHAPES[name].rows_per_expert == 2048


def test_plot_writes_a_png(smoke):
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib")
    png = smoke["dir"] / "chart.png"
    assert _load("chart").main([str(smoke["table"]), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profilers_share_options_warm_step_and_report(single_rank_group, tmp_path, monkeypatch):
    """What benchmarks/profile_{step,host}.py share (mok_step): their options, a warmed-up Step
    (here on CPU, one rank, the smoke shape) and the JSON report."""
    import torch

    from mok.bench import harness
    from mok.bench import mok_step as bench_mok

    args = bench_mok.profiler_parser("Title line.\nMore.", top=7).parse_args(["--out", "o"])
    assert (args.top, args.mxfp8, args.shapes) == (7, False, list(harness.SHAPES))
    shape = harness.SMOKE_SHAPES["tiny"]
    d = harness.Dist(0, 1, torch.device("cpu"), single_rank_group)
    _, _, out, _ = bench_mok.warm_step(d, shape, False, steps=1).forward(0)
    assert out.shape == (shape.tokens, shape.hidden)
    bench_mok.write_report(tmp_path / "new" / "r.json", {"a": [1]})
    assert json.loads((tmp_path / "new" / "r.json").read_text()) == {"a": [1]}


def test_ab_runs_every_arm_in_every_round(tmp_path):
    """benchmarks/ab.py end to end on CPU: two arms (both the mok under test, as directories),
    two rounds of run.py's smoke mode, every median in ab.json (the baseline's GEMMs-alone
    line too) and the table, and which mok each arm imported."""
    here = Path(mok.__file__).resolve().parent.parent
    command = [sys.executable, str(BENCHMARKS / "ab.py"), "--out", str(tmp_path), "--rounds", "2"]
    command += ["--arm", f"a={here}", "--arm", f"b={here}"]
    command += ["--", "--smoke", "--shapes", "tiny", "--systems", "nccl_torch", "mok_bf16"]
    done = subprocess.run(command, env=_child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ab.py failed:\n{done.stdout}\n{done.stderr}"
    data = json.loads((tmp_path / "ab.json").read_text())
    rows = data["rows"]
    # The baseline's record also carries its GEMMs alone: run.py's `gemms:torch` line.
    assert [row["system"] for row in rows] == ["nccl_torch", "gemms:torch", "mok_bf16"]
    for row in rows:
        assert (row["shape"], row["ep"]) == ("tiny", 1)
        for arm in ("a", "b"):
            assert len(row[arm]["fwd_ms"]) == len(row[arm]["bwd_ms"]) == 2
            assert all(ms > 0 for ms in row[arm]["fwd_ms"] + row[arm]["bwd_ms"])
            assert row[arm]["mok_path"] == str(here / "mok")
            # GPU busy ms by round: none measured on CPU, for any system.
            assert row[arm]["fwd_busy_ms"] == row[arm]["bwd_busy_ms"] == [None, None]
    assert "round 2/2: b" in done.stdout
    assert "a: fwd / bwd ms" in done.stdout and "b: fwd / bwd ms" in done.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arm", "a"], "NAME=PATH"),
        (["--arm", "a=.", "--arm", "a=."], "must differ"),
        (["--arm", "a=.", "--rounds", "0"], ">= 1"),
        (["--arm", "a=.", "--", "--out", "x"], "leave it out"),
        (["--arm", "a=/nonexistent"], "neither a .whl file nor a directory"),
    ],
)
def test_ab_rejects_bad_arguments(argv, message, tmp_path, capsys):
    here = str(Path(mok.__file__).resolve().parent.parent)
    argv = [a.replace("=.", f"={here}") for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        _load("ab").parse(["--out", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_probe_gemm_problems_arguments_and_gpu_requirement(capsys):
    probe = _load("probe_gemm")
    assert probe.dims(probe.shapes.SHAPES["qwen3.5"], "down") == (20, 2048, 1024, 4096)
    assert probe.dims(probe.shapes.SHAPES["dsv4-pro"], "gate") == (12, 2048, 7168, 3072)
    base = ["--shape", "qwen3.5", "--gemm", "down", "--system", "mxfp8_nt"]
    args = probe.parse_args(base)
    assert (args.launches, args.time) == (3, False)
    for bad, message in (([*base, "--launches", "0"], "--launches must be >= 1, got 0"),
                         ([*base[:3], "up", *base[4:]], "invalid choice: 'up'")):  # fmt: skip
        with pytest.raises(SystemExit):
            probe.parse_args(bad)
        assert message in capsys.readouterr().err
    _refused_without_gpu("probe_gemm", base)


def _refused_without_gpu(script: str, argv: list[str]) -> None:
    """The lab script, run with no GPU visible, exits 2 saying it needs one."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{script}.py"), *argv],
        env=_child_env() | {"CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"{script}: needs a CUDA GPU (none visible)"


def test_probe_launch_arguments_and_gpu_requirement(capsys):
    probe = _load("probe_launch")
    args = probe.parse_args(["--shape", "qwen3.5", "--gemm", "gate"])
    assert (args.shape, args.gemm, args.system) == ("qwen3.5", "gate", "bf16_nt")
    with pytest.raises(SystemExit):
        probe.parse_args(["--shape", "qwen3.5", "--gemm", "gate", "--system", "torch"])
    assert "invalid choice: 'torch'" in capsys.readouterr().err
    _refused_without_gpu("probe_launch", ["--shape", "qwen3.5", "--gemm", "down"])


def test_gpu_only_systems_stay_out_of_the_smoke_run(single_rank_group):
    """mok_bf16_cg and mok_mxfp8_cg replay CUDA graphs: --smoke (CPU) leaves them out of its
    default systems, refuses them by name, and each system itself says it needs a GPU."""
    import torch

    run = _load("run")
    assert set(run.GPU_ONLY) == {"mok_bf16_cg", "mok_mxfp8_cg"}
    smoke = run.parse_args(["--out", "o", "--smoke"]).systems
    assert smoke == [s for s in run.SYSTEMS if s not in run.GPU_ONLY] and "mok_bf16" in smoke
    with pytest.raises(SystemExit):
        run.parse_args(["--out", "o", "--smoke", "--systems", "mok_bf16", "mok_bf16_cg"])
    harness = _load("harness")
    d = harness.Dist(0, 1, torch.device("cpu"), single_rank_group)
    for name in run.GPU_ONLY:
        assert name in run.SYSTEMS and name in run.parse_args(["--out", "o"]).systems
        with pytest.raises(RuntimeError, match=f"{name} replays CUDA graphs: it needs a GPU"):
            run.SYSTEMS[name](d, None, harness.SMOKE_SHAPES["tiny"], [])
