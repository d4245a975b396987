"""`mok tune` and `mok bench` on the GPU, each in a process of its own (issue 46, item 4): a tune
sweep of a one-GPU EP group of 2 ranks keeps the same bits at every point and writes a config
that MoKConfig loads; `mok bench` on one tiny shape writes rows measured by mok's CUDA kernels."""

from __future__ import annotations

import json
import os

import pytest
from cli_helpers import run_mok
from gpu_helpers import requires_gpu_module

from mok.config import MoKConfig

pytestmark = [
    pytest.mark.gpu,
    requires_gpu_module(),
    pytest.mark.skipif(int(os.environ.get("WORLD_SIZE", "1")) > 1, reason="one process, one GPU"),
]

SIZES = ["--hidden", "1024", "--inter", "1536", "--topk", "4", "--experts", "2", "--tokens", "256"]


def test_tune_on_one_gpu_keeps_the_bits_and_writes_a_config(tmp_path):
    knobs = ["--knobs", "overlap_ctas", "minibatch_size"]
    done = run_mok("tune", *SIZES, "--shared", "--ep", "2", *knobs, "--budget-s", "0.05",
                   "--out", "out", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "same bits at every point" in done.stdout
    config = MoKConfig.from_json(tmp_path / "out" / "config.json")
    points = [json.loads(line) for line in (tmp_path / "out" / "sweep.jsonl").open()]
    assert {p["gpu"] for p in points} != {"CPU"}
    assert all(p["same_bits"] and p["total_ms"] > 0 for p in points)
    kept = [p["value"] for p in points if p["knob"] == "overlap_ctas" and p["chosen"]]
    assert kept == [config.overlap_ctas]


def test_bench_on_one_gpu_times_mok_kernels(tmp_path):
    done = run_mok("bench", "--shapes", "qwen3-235b", "--systems", "nccl_torch", "mok_bf16",
                   "--budget-s", "0.2", "--out", "rows.jsonl", "--chart", "chart.png",
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").open()]
    mok_rows = [r for r in rows if r["system"] == "mok_bf16"]
    assert mok_rows and all(r["mok_kernels"] and r["median_ms"] for r in mok_rows)
