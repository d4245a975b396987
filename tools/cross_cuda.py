#!/usr/bin/env python3
"""The target CPU's CUDA runtime for a cross build, from the one lock, checked by hash.

    python tools/cross_cuda.py aarch64 DIR

Downloads the wheels of CROSS_PACKAGES for manylinux aarch64 at the versions and hashes
requirements.lock pins (pip --require-hashes), and unpacks them into DIR, so that
DIR/nvidia/cu13/lib/libcudart_static.a is the aarch64 runtime. Then build with
MOK_TARGET_CPU=aarch64 MOK_CUDA_TARGET_ROOT=DIR (tools/build/mok_build/toolchain.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the link step takes from the target's CUDA: libcudart_static.a (nvcc, its headers and the
# CUTLASS headers are the build machine's, and the same files for either CPU).
CROSS_PACKAGES = ("nvidia-cuda-runtime",)
# pip's --platform matches exactly (no older manylinux levels implied): name each level the
# CUDA wheels use, none newer than the glibc the wheels' tag promises (extension.bzl).
MANYLINUX_LEVELS = ("manylinux_2_34", "manylinux_2_28", "manylinux_2_17", "manylinux2014")
CPUS = ("aarch64", "x86_64")


def lock_entries(lock_text: str, names: tuple[str, ...]) -> str:
    """The lock's entries (pin line, hash lines) for `names`, as a requirements file."""
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock_text)
    wanted = [e for e in entries if re.match(rf"({'|'.join(map(re.escape, names))})==", e)]
    if len(wanted) != len(names):
        raise SystemExit(f"requirements.lock does not pin all of {', '.join(names)}")
    return "\n".join(wanted) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in CPUS:
        sys.exit(__doc__)
    cpu, target = argv[0], Path(argv[1]).resolve()
    with tempfile.TemporaryDirectory(prefix="mok-cross-") as scratch:
        requirements = Path(scratch) / "cross.txt"
        lock = (REPO / "requirements.lock").read_text()
        requirements.write_text(lock_entries(lock, CROSS_PACKAGES))
        wheels = Path(scratch) / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--require-hashes", "--only-binary=:all:",
             *[f"--platform={level}_{cpu}" for level in MANYLINUX_LEVELS],
             "--python-version=3.12", "--implementation=cp", "--dest", str(wheels),
             "-r", str(requirements)],
            check=True,
        )  # fmt: skip
        for wheel in sorted(wheels.glob("*.whl")):
            if not wheel.name.endswith(f"{cpu}.whl"):
                raise SystemExit(f"{wheel.name} is not a {cpu} wheel")
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
            print(f"cross_cuda: unpacked {wheel.name} into {target}")
    if not (target / "nvidia/cu13/lib/libcudart_static.a").is_file():
        raise SystemExit(f"no nvidia/cu13/lib/libcudart_static.a under {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
