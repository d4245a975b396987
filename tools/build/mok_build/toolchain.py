"""The pinned compiler: find the nvcc of the Python environment and refuse any other.

The build never looks at PATH, CUDA_HOME or /usr/local/cuda for nvcc: the only compiler it uses
is the one the hash-locked `nvidia-cuda-nvcc` wheel installed next to the running interpreter
(site-packages/nvidia/cu13/bin/nvcc), and `nvcc --version` must report the version in
extension.bzl. The other build requirements pinned in pyproject.toml must be installed at exactly
those versions (a stray newer nvidia-nvvm or nvidia-cuda-crt breaks ptxas). The host C++ compiler
is the one extension.bzl names for the target CPU, at its pinned version.

Cross-building (MOK_TARGET_CPU=aarch64 on an x86_64 machine): nvcc runs here and drives the cross
g++; the CUDA runtime linked in is the target's, from the locked aarch64 nvidia-cuda-runtime wheel
unpacked under $MOK_CUDA_TARGET_ROOT (tools/cross_cuda.py puts it there).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Where the CUDA 13 PyPI wheels put their files, relative to a site-packages directory.
NVCC_RELATIVE = Path("nvidia/cu13/bin/nvcc")

# Variables that would change what nvcc or gcc compile without appearing on the command line.
_HIDDEN_INPUTS = (
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "DEPENDENCIES_OUTPUT",
    "SUNPRO_DEPENDENCIES",
)


class ToolchainError(RuntimeError):
    """The environment does not hold the pinned toolchain."""


@dataclass(frozen=True, slots=True)
class Toolchain:
    nvcc: Path
    nvcc_version: str
    cuda_root: Path  # .../nvidia/cu13: include/, lib/, nvvm/
    cuda_lib: Path  # the target CPU's libcudart_static.a lives here
    host_compiler: Path
    host_compiler_pinned: bool  # False: MOK_HOST_CXX chose it (a contributor's build, e.g. Nix)
    python_include: Path
    pybind11_include: Path
    cutlass_include: Path  # CUTLASS/CuTe headers of the pinned nvidia-cutlass wheel
    python_tag: str  # cp312
    extension_suffix: str  # .cpython-312-x86_64-linux-gnu.so
    target_cpu: str  # x86_64 or aarch64

    @property
    def external_include_maps(self) -> dict[Path, str]:
        """Directories outside the source tree and the fixed names they get in __FILE__."""
        return {
            self.cuda_root: "/cuda",
            self.pybind11_include: "/pybind11",
            self.cutlass_include: "/cutlass",
            self.python_include: "/python",
        }


def find_nvcc(search_paths: Iterable[str] | None = None) -> Path:
    """The first site-packages/nvidia/cu13/bin/nvcc on sys.path (the environment's own nvcc)."""
    paths = sys.path if search_paths is None else search_paths
    for entry in paths:
        candidate = Path(entry or ".") / NVCC_RELATIVE
        if candidate.is_file():
            return candidate.resolve()
    raise ToolchainError(
        "no nvcc in this Python environment (looked for "
        f"<site-packages>/{NVCC_RELATIVE} on sys.path). Install the pinned compiler with "
        "`pip install --require-hashes -r requirements.lock`, or let `pip install .` build "
        "in isolation; the system nvcc is deliberately never used."
    )


def nvcc_version(nvcc: Path) -> str:
    """The full version nvcc reports, e.g. 13.0.88 from 'Cuda compilation tools, ..., V13.0.88'."""
    try:
        result = subprocess.run(
            [str(nvcc), "--version"], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise ToolchainError(f"cannot run `{nvcc} --version`: {error}") from error
    match = re.search(r"\bV(\d+\.\d+\.\d+)\b", result.stdout)
    if match is None:
        raise ToolchainError(f"`{nvcc} --version` printed no version:\n{result.stdout}")
    return match.group(1)


def check_nvcc(nvcc: Path, expected: str) -> str:
    """nvcc's version, or ToolchainError when it is not `expected` (CUDA_VERSION)."""
    found = nvcc_version(nvcc)
    if found != expected:
        raise ToolchainError(
            f"{nvcc} is nvcc {found}, but this project is built only with nvcc {expected} "
            "(tools/build/extension.bzl CUDA_VERSION). Install the locked compiler wheels: "
            "`pip install --require-hashes -r requirements.lock`."
        )
    return found


def check_pins(pins: Mapping[str, str]) -> None:
    """Every pinned build requirement is installed at its pinned version."""
    problems = []
    for name, wanted in sorted(pins.items()):
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found = "not installed"
        if found != wanted:
            problems.append(f"{name}=={wanted} (found {found})")
    if problems:
        raise ToolchainError(
            "the build environment does not match pyproject.toml [build-system] requires: "
            + "; ".join(problems)
            + ". Use the locked environment: `pip install --require-hashes -r requirements.lock`."
        )


def find_host_compiler(name: str, version: str) -> Path:
    """The pinned host compiler `name` (extension.bzl HOST_COMPILERS) at exactly `version`."""
    found = shutil.which(name)
    if found is None:
        raise ToolchainError(
            f"nvcc needs the host compiler {name} (GCC {version}): on Debian 12 install g++-12, "
            "or g++-12-aarch64-linux-gnu to cross-build for aarch64"
        )
    try:
        result = subprocess.run(
            [found, "-dumpfullversion"], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise ToolchainError(f"cannot run `{found} -dumpfullversion`: {error}") from error
    if result.stdout.strip() != version:
        raise ToolchainError(
            f"{found} is GCC {result.stdout.strip()}, but this project is built only with GCC "
            f"{version} (tools/build/extension.bzl HOST_COMPILER_VERSION)"
        )
    return Path(found)


def target_cuda_lib(cuda_root: Path, target_cpu: str, environ: Mapping[str, str]) -> Path:
    """Where the target CPU's libcudart_static.a is: the environment's own, or for a cross build
    $MOK_CUDA_TARGET_ROOT/nvidia/cu13/lib (the locked wheel of the target CPU, unpacked)."""
    if target_cpu == platform.machine():
        return cuda_root / "lib"
    root = environ.get("MOK_CUDA_TARGET_ROOT", "").strip()
    lib = Path(root) / "nvidia" / "cu13" / "lib"
    if not root or not (lib / "libcudart_static.a").is_file():
        raise ToolchainError(
            f"cross-building for {target_cpu} needs its CUDA runtime: run "
            f"`python tools/cross_cuda.py {target_cpu} DIR` and set MOK_CUDA_TARGET_ROOT=DIR"
        )
    return lib.resolve()


def python_include() -> Path:
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise ToolchainError(f"no Python.h in {include}: install the Python development headers")
    return include


def pybind11_include() -> Path:
    try:
        import pybind11
    except ImportError as error:
        raise ToolchainError("pybind11 is not installed in the build environment") from error
    return Path(pybind11.get_include())


def cutlass_include() -> Path:
    """include/ of the CUTLASS sources that the nvidia-cutlass wheel ships in cutlass_library.

    Found without importing the package (its __init__ pulls in the Python generator's deps).
    """
    spec = importlib.util.find_spec("cutlass_library")
    locations = [] if spec is None else list(spec.submodule_search_locations or [])
    for location in locations:
        include = Path(location) / "source" / "include"
        if (include / "cutlass" / "cutlass.h").is_file():
            return include
    raise ToolchainError(
        "the CUTLASS headers are missing: install the pinned nvidia-cutlass wheel "
        "(`pip install --require-hashes -r requirements.lock`)"
    )


def python_tag() -> str:
    if sys.implementation.name != "cpython":
        raise ToolchainError("the extension is a CPython module; build it with CPython")
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def resolve(
    expected_nvcc: str,
    pins: Mapping[str, str],
    host_compiler: tuple[str, str],
    target_cpu: str,
    environ: Mapping[str, str],
) -> Toolchain:
    """Find and verify every tool and header directory the build needs.

    host_compiler: (name, version) from extension.bzl for `target_cpu`. $MOK_HOST_CXX replaces it
    with another compiler (the Nix flake's, which nixpkgs pairs with CUDA): the build then says
    it is not a release build, since its bytes cannot match the release wheel's. The Python
    headers are this interpreter's: CPython's API and ABI are the same on both 64-bit Linux CPUs
    (only pyconfig.h's x87 lines differ, which no extension reads).
    """
    check_pins(pins)
    nvcc = find_nvcc()
    version = check_nvcc(nvcc, expected_nvcc)
    cuda_root = nvcc.parent.parent
    tag = python_tag()
    override = environ.get("MOK_HOST_CXX", "").strip()
    return Toolchain(
        nvcc=nvcc,
        nvcc_version=version,
        cuda_root=cuda_root,
        cuda_lib=target_cuda_lib(cuda_root, target_cpu, environ),
        host_compiler=Path(override) if override else find_host_compiler(*host_compiler),
        host_compiler_pinned=not override,
        python_include=python_include(),
        pybind11_include=pybind11_include(),
        cutlass_include=cutlass_include(),
        python_tag=tag,
        extension_suffix=f".cpython-{tag[2:]}-{target_cpu}-linux-gnu.so",
        target_cpu=target_cpu,
    )


def clean_environment(environ: Mapping[str, str], source_date_epoch: int) -> dict[str, str]:
    """The environment compiler processes get: the caller's, minus hidden compiler inputs."""
    env = {key: value for key, value in environ.items() if key not in _HIDDEN_INPUTS}
    env.update(LC_ALL="C", TZ="UTC", SOURCE_DATE_EPOCH=str(source_date_epoch))
    return env
