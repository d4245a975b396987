"""Entry point of every Bazel py_test: run pytest on one test file.

    pytest_main.py [--wheel=PATH] TEST_FILE [PYTEST_ARGS...]

With --wheel the built wheel is unpacked into the test's private temporary directory and put first
on the import path (for this process and any worker processes it starts), and the run stops unless
`mok` then resolves inside it: the GPU tier tests the artifact that ships, never the source tree.
The wheel's SHA-256 is printed so a log names the exact bytes tested.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import zipfile
from pathlib import Path

import pytest


def _runfiles_root() -> Path:
    # Bazel runs tests with TEST_SRCDIR/TEST_WORKSPACE set; outside Bazel use the repository root.
    srcdir, workspace = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    if srcdir and workspace:
        return Path(srcdir) / workspace
    return Path(__file__).resolve().parents[2]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _install_wheel(wheel: Path) -> Path:
    """Unpack the wheel (PEP 427: its root is a site-packages root) and import from it first."""
    target = Path(os.environ.get("TEST_TMPDIR", "/tmp")) / "wheel-site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    sys.path.insert(0, str(target))
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), inherited]))
    spec = importlib.util.find_spec("mok")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or target.resolve() not in origin.parents:
        sys.exit(f"mok resolves to {origin}, not to the wheel unpacked at {target}")
    return target


def main(argv: list[str]) -> int:
    wheel = None
    if argv and argv[0].startswith("--wheel="):
        wheel = Path(argv.pop(0).split("=", 1)[1]).resolve()
    if not argv:
        sys.exit(__doc__)
    root = _runfiles_root()
    os.chdir(root)
    if wheel is not None:
        print(f"testing wheel {wheel.name} sha256={_sha256(wheel)}", flush=True)
        print(f"mok unpacked at {_install_wheel(wheel)}", flush=True)
    else:
        # The source tier imports mok from the tree (Bazel already puts the root on sys.path;
        # this makes a run outside Bazel behave the same).
        sys.path.insert(0, str(root))
    config = ["-c", str(root / "pyproject.toml"), "--rootdir", str(root), "-p", "no:cacheprovider"]
    return int(pytest.main(config + argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
