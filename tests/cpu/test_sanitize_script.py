"""tools/sanitize.sh's plumbing on CPU: a stand-in `compute-sanitizer` on PATH writes the summary
line the real one writes and runs the demo (gloo, reference backend), so the report's lines, the
error count it reads and the exit status are checked without a GPU. The real tool's run is
tests/gpu/test_sanitizer.py."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

# Takes compute-sanitizer's options up to the command, writes FAKE_SUMMARY to --log-file, runs
# the command.
FAKE_SANITIZER = """#!/usr/bin/env bash
log=
while [[ $1 == --* ]]; do
    [[ $1 == --log-file ]] && log=$2
    shift 2
done
echo "$FAKE_SUMMARY" > "$log"
exec "$@"
"""


def _run(tmp_path, tool: str, summary: str) -> tuple[int, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    python_dir = pathlib.Path(sys.executable).parent  # `python3` there has torch and mok
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{python_dir}:{os.environ['PATH']}",
        "MOK_SANITIZE_TOOLS": tool,
        "FAKE_SUMMARY": summary,
    }
    report = tmp_path / "report.txt"
    run = subprocess.run(
        ["bash", str(REPO / "tools" / "sanitize.sh"), str(report)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return run.returncode, report.read_text()


def test_clean_runs_report_zero_errors_and_pass(tmp_path):
    status, report = _run(tmp_path, "memcheck", "========= ERROR SUMMARY: 0 errors")
    lines = report.splitlines()
    assert status == 0, report
    assert [line.split(" (rc")[0] for line in lines] == [
        "memcheck bf16: 0 errors, demo PASS",
        "memcheck mxfp8: 0 errors, demo PASS",
    ]


def test_errors_fail_the_run_and_bring_the_log(tmp_path):
    summary = "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)"
    status, report = _run(tmp_path, "racecheck", summary)
    assert status == 1
    assert report.startswith("racecheck bf16: 2 errors, demo PASS")
    assert "--- racecheck mxfp8\n" + summary in report
