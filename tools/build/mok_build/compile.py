"""Compile one extension module per architecture with the pinned nvcc, archs in parallel.

Every command runs in the source root with relative source paths, and every absolute directory
that could leak into a binary (source root, build root, toolchain include dirs) is mapped to a
fixed name, so two checkouts at different paths produce identical bytes. One path cannot be
mapped: nvcc names internal-linkage device entities (libcu++'s, which CUTLASS pulls in) after a
hash of the source file's real absolute path. So the sources are compiled from a copy at one
fixed path (STAGE_ROOT), under a lock that serializes concurrent builds on a machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mok_build.spec import ExtensionSpec
from mok_build.toolchain import Toolchain


class CompileError(RuntimeError):
    """A compiler command failed; the message carries the command and its output."""


# ptxas diagnostics that fail the build although ptxas succeeded: each makes a kernel far slower
# with nothing else to show for it.
FATAL_DIAGNOSTICS = {
    "C7512": "ptxas serialized a kernel's wgmma instructions (too few registers for the "
    "accumulators in flight): its tensor cores would wait on every instruction",
}


def check_diagnostics(label: str, text: str) -> None:
    """Raises CompileError when a compiler's output holds one of FATAL_DIAGNOSTICS."""
    for code, meaning in FATAL_DIAGNOSTICS.items():
        if f"({code})" in text:
            raise CompileError(f"{label}: {code}: {meaning}\n{text}")


# The fixed real path the sources are compiled from (see the module docstring).
STAGE_ROOT = Path("/tmp/mok-build-sources")


@contextlib.contextmanager
def staged_sources(root: Path, files: Sequence[str], stage: Path = STAGE_ROOT):
    """Copy `files` (paths relative to `root`) to `stage` and yield it, holding a lock."""
    lock_path = stage.with_name(stage.name + ".lock")
    try:
        lock = open(lock_path, "a+")  # noqa: SIM115 (held for the whole build)
    except OSError as error:
        raise CompileError(f"cannot open the build lock {lock_path}: {error}") from error
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            shutil.rmtree(stage, ignore_errors=True)
            for name in files:
                target = stage / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(root / name, target)
        except OSError as error:
            raise CompileError(
                f"cannot stage the sources in {stage} ({error}); remove it if another user owns it"
            ) from error
        try:
            yield stage
        finally:
            shutil.rmtree(stage, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class BuildConfig:
    root: Path  # source root (absolute)
    build_dir: Path  # scratch directory for objects (absolute)
    version: str  # the project version stamped into the module
    git_commit: str  # stamped if given (MOK_GIT_COMMIT), else "unknown"
    jobs: int
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Step:
    label: str
    argv: tuple[str, ...]
    output: Path


def _fill(templates: Sequence[str], values: Mapping[str, str]) -> list[str]:
    return [template.format(**values) for template in templates]


def _values(
    spec: ExtensionSpec, tc: Toolchain, cfg: BuildConfig, arch: str, source: str
) -> dict[str, str]:
    return {
        "arch": arch,
        "module": spec.module_name(arch),
        "version": cfg.version,
        "nvcc_version": tc.nvcc_version,
        "git_commit": cfg.git_commit,
        "source": source,
        "src_root": str(cfg.root),
        "build_root": str(cfg.build_dir),
    }


def compile_step(
    spec: ExtensionSpec, tc: Toolchain, cfg: BuildConfig, arch: str, source: str
) -> Step:
    """nvcc -c for one source of one arch's module."""
    values = _values(spec, tc, cfg, arch, source)
    output = cfg.build_dir / arch / (Path(source).name + ".o")
    host_flags = [f"-Xcompiler={flag}" for flag in spec.host_flags]
    prefix_maps = [
        f"-Xcompiler=-ffile-prefix-map={path}={name}"
        for path, name in tc.external_include_maps.items()
    ]
    argv = [
        str(tc.nvcc),
        f"-ccbin={tc.host_compiler}",
        "-c",
        source,
        "-o",
        str(output),
        f"-gencode={spec.gencode[arch]}",
        *spec.nvcc_flags,
        *host_flags,
        *_fill(spec.reproducible_flags, values),
        *prefix_maps,
        *[f"-I{directory}" for directory in spec.include_dirs],
        "-isystem",
        str(tc.pybind11_include),
        "-isystem",
        str(tc.cutlass_include),
        "-isystem",
        str(tc.python_include),
        *[f"-D{define}" for define in _fill(spec.defines, values)],
    ]
    return Step(f"{arch} nvcc {source}", tuple(argv), output)


def link_step(
    spec: ExtensionSpec, tc: Toolchain, cfg: BuildConfig, arch: str, objects: Sequence[Path]
) -> Step:
    output = cfg.build_dir / arch / (spec.module_name(arch) + tc.extension_suffix)
    argv = [
        str(tc.host_compiler),
        *spec.link_flags,
        "-o",
        str(output),
        *[str(obj) for obj in objects],
        f"-L{tc.cuda_lib}",
        *spec.link_libs,
    ]
    return Step(f"{arch} link {output.name}", tuple(argv), output)


class Progress:
    """Numbered progress lines on stderr: '[mok-build 3/9 12.4s] sm_90a nvcc csrc/bindings.cpp'."""

    def __init__(self, total: int, write: Callable[[str], None] | None = None) -> None:
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()  # steps finish on worker threads

    def log(self, message: str) -> None:
        with self._lock:
            self._write(f"[mok-build {time.monotonic() - self.start:6.1f}s] {message}")

    def finished(self, step: Step, seconds: float, diagnostics: str = "") -> None:
        with self._lock:
            self.done += 1
            done = self.done
        self.log(f"({done}/{self.total}) {step.label} done in {seconds:.1f}s")
        if diagnostics.strip():
            self.log(f"{step.label} printed:\n{diagnostics.rstrip()}")


def run_step(step: Step, cfg: BuildConfig, progress: Progress) -> Path:
    step.output.parent.mkdir(parents=True, exist_ok=True)
    begin = time.monotonic()
    result = subprocess.run(
        step.argv, cwd=cfg.root, env=dict(cfg.env), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise CompileError(
            f"{step.label} failed (exit {result.returncode})\n$ {' '.join(step.argv)}\n"
            f"{result.stdout}{result.stderr}"
        )
    check_diagnostics(step.label, result.stdout + result.stderr)
    progress.finished(step, time.monotonic() - begin, result.stdout + result.stderr)
    return step.output


def build_modules(
    spec: ExtensionSpec,
    tc: Toolchain,
    cfg: BuildConfig,
    archs: Sequence[str],
    progress: Progress | None = None,
) -> dict[str, Path]:
    """Compile and link every arch's module in parallel; {arch: path of the .so}."""
    sources = spec.extension_sources
    progress = progress or Progress(len(archs) * (len(sources) + 1))
    if not tc.host_compiler_pinned:
        progress.log(f"MOK_HOST_CXX={tc.host_compiler}: not the pinned compiler (no release build)")
    progress.log(
        f"nvcc {tc.nvcc_version} ({tc.nvcc}), host compiler {tc.host_compiler.name} for "
        f"{tc.target_cpu}, archs {', '.join(archs)}, {cfg.jobs} parallel jobs"
    )
    pool = ThreadPoolExecutor(max_workers=cfg.jobs)
    try:
        compiles: dict[str, list[Future[Path]]] = {
            arch: [
                pool.submit(run_step, compile_step(spec, tc, cfg, arch, source), cfg, progress)
                for source in sources
            ]
            for arch in archs
        }
        links = {
            arch: pool.submit(
                run_step,
                link_step(spec, tc, cfg, arch, [future.result() for future in futures]),
                cfg,
                progress,
            )
            for arch, futures in compiles.items()
        }
        return {arch: future.result() for arch, future in links.items()}
    finally:
        # On a failure, drop the queued steps instead of compiling the rest first.
        pool.shutdown(wait=True, cancel_futures=True)


def default_jobs(environ: Mapping[str, str]) -> int:
    """MOK_BUILD_JOBS, else the CPUs this process may use."""
    if environ.get("MOK_BUILD_JOBS"):
        return max(1, int(environ["MOK_BUILD_JOBS"]))
    return max(1, len(os.sched_getaffinity(0)))
