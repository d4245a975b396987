"""tools/demo.py refuses an EP size it cannot run: with 0 ranks it once printed PASS having
checked nothing."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

DEMO = pathlib.Path(__file__).resolve().parents[2] / "tools" / "demo.py"


@pytest.mark.parametrize("ep", ["0", "-1", "73"])
def test_ep_outside_the_supported_range_is_an_error(ep):
    run = subprocess.run([sys.executable, str(DEMO), "--ep", ep], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert run.returncode == 2
    assert f"--ep must be in [1, 72], got {ep}" in run.stderr
    assert "PASS" not in run.stdout
