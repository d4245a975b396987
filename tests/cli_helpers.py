"""Run the `mok` command as a user does: `python -m mok.cli` in a process of its own, importing
the same mok as the tests (the wheel, or the source tree) and started outside any torchrun group
(so `mok bench` and `mok tune` are a group of one process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mok

_GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "MOK_BACKEND")  # fmt: skip


def run_mok(*argv: str, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    root = str(Path(mok.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *sys.path]))
    for name in _GROUP_VARIABLES:
        env.pop(name, None)
    command = [sys.executable, "-m", "mok.cli", *argv]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
