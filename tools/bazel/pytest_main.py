"""Entry point of every Bazel py_test: run pytest on one test file.

    pytest_main.py [--require-wheel] [--launch=one|host|rack] [--wheel=PATH] TEST_FILE [ARGS...]

The wheel under test is $MOK_WHEEL when set (an absolute path: the release artifact, with
--config=release_wheel), else --wheel (//:mok_wheel). It is unpacked into the test's private
temporary directory and put first on the import path (for this process and every process it
starts), and the run stops unless `mok` then resolves inside it: the GPU tier tests the artifact
that ships, never the source tree. The wheel's SHA-256 is printed, and must equal
$MOK_WHEEL_SHA256 when that is set, so a log names (and a job proves) the exact bytes tested.

--launch: `one` runs pytest here; `host` runs it under torchrun with one rank per visible GPU;
`rack` runs it under torchrun across the trays of an NVL72 rack ($MOK_NNODES trays meeting at
$MOK_RDZV_ENDPOINT with id $MOK_RDZV_ID; every tray runs the same test).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

_OPTIONS = ("--require-wheel", "--launch", "--wheel", "--wheel-site")
_RACK_ENV = ("MOK_NNODES", "MOK_RDZV_ENDPOINT", "MOK_RDZV_ID")


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
    _use_site(target)
    return target


def _use_site(target: Path) -> None:
    sys.path.insert(0, str(target))
    inherited = os.environ.get("PYTHONPATH", "")
    if str(target) not in inherited.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), inherited]))
    spec = importlib.util.find_spec("mok")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or target.resolve() not in origin.parents:
        sys.exit(f"mok resolves to {origin}, not to the wheel unpacked at {target}")


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    options = {}
    while argv and argv[0].partition("=")[0] in _OPTIONS:
        key, _, value = argv.pop(0).partition("=")
        options[key] = value
    return options, argv


def _wheel(options: dict[str, str]) -> Path | None:
    named = os.environ.get("MOK_WHEEL") or options.get("--wheel")
    if not named:
        if "--require-wheel" in options:
            sys.exit("no wheel to test: build //:mok_wheel, or set MOK_WHEEL with release_wheel")
        return None
    wheel = Path(named).resolve()
    if not wheel.is_file():
        sys.exit(f"no such wheel: {wheel}")
    digest, expected = _sha256(wheel), os.environ.get("MOK_WHEEL_SHA256", "").strip()
    print(f"testing wheel {wheel.name} sha256={digest}", flush=True)
    if expected and expected != digest:
        sys.exit(f"{wheel.name} has sha256 {digest}, MOK_WHEEL_SHA256 says {expected}")
    return wheel


def torchrun_argv(launch: str, environ: dict[str, str]) -> list[str]:
    """The torchrun command line (without the script) for a launch mode other than `one`."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=gpu"]
    if launch == "host":
        return [*argv, "--standalone"]
    missing = [name for name in _RACK_ENV if not environ.get(name)]
    if launch != "rack" or missing:
        sys.exit(f"--launch={launch}: unknown mode, or {', '.join(missing)} unset (.bazelrc nvl72)")
    return [
        *argv,
        f"--nnodes={environ['MOK_NNODES']}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={environ['MOK_RDZV_ENDPOINT']}",
        f"--rdzv-id={environ['MOK_RDZV_ID']}",
    ]


def main(argv: list[str]) -> int:
    options, argv = _options(argv)
    if not argv:
        sys.exit(__doc__)
    root = _runfiles_root()
    os.chdir(root)
    if "--wheel-site" in options:  # a torchrun rank: the launcher unpacked the wheel
        _use_site(Path(options["--wheel-site"]))
    elif (wheel := _wheel(options)) is not None:
        site = _install_wheel(wheel)
        print(f"mok unpacked at {site}", flush=True)
        launch = options.get("--launch", "one")
        if launch != "one":
            rank_argv = [__file__, f"--wheel-site={site}", *argv]
            return subprocess.run([*torchrun_argv(launch, dict(os.environ)), *rank_argv]).returncode
    else:
        # The source tier imports mok from the tree (Bazel already puts the root on sys.path;
        # this makes a run outside Bazel behave the same).
        sys.path.insert(0, str(root))
    config = ["-c", str(root / "pyproject.toml"), "--rootdir", str(root), "-p", "no:cacheprovider"]
    return int(pytest.main(config + argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
