"""Run the `mok` command as a user does: `python -m mok.cli` in a process of its own (or under
torchrun), importing the same mok as the tests (the wheel, or the source tree) and started
outside the tests' own torchrun group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mok

_GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "MOK_BACKEND")  # fmt: skip


def run_mok(*argv: str, cwd: Path, nproc: int | None = None,
            timeout_s: float = 300) -> subprocess.CompletedProcess:  # fmt: skip
    """`mok ARGV...` (with `nproc`: `torchrun --nproc-per-node=nproc -m mok.cli ARGV...`)."""
    root = str(Path(mok.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *sys.path]))
    for name in _GROUP_VARIABLES:
        env.pop(name, None)
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone",
                                         f"--nproc-per-node={nproc}"]  # fmt: skip
    command = [sys.executable, *launcher, "-m", "mok.cli", *argv]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
