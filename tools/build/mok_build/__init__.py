"""mok's in-tree PEP 517 build backend (pyproject.toml: backend-path = ["tools/build"]).

`pip install .`, `pip wheel .` and `python -m build` call the hooks below. They compile one
CUDA extension module per architecture with the pinned nvcc (see toolchain.py) and write a
byte-reproducible wheel (see archive.py). Environment knobs:

  MOK_ARCHS=sm_90a[,...]  build only these archs (quick dev builds; default: all of ARCHS)
  MOK_TARGET_CPU=aarch64  the wheel's host CPU (default: this machine's); a cross build also
                          needs MOK_CUDA_TARGET_ROOT (see toolchain.py)
  MOK_BUILD_JOBS=N        parallel compiler processes (default: the usable CPUs)
  MOK_GIT_COMMIT=<sha>    commit stamped into build_info() (default: "unknown")
  SOURCE_DATE_EPOCH=<s>   archive timestamps (default: archive.DEFAULT_EPOCH)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mok_build import archive, metadata
from mok_build.compile import BuildConfig, Progress, build_modules, default_jobs, staged_sources
from mok_build.spec import (
    ExtensionSpec,
    ProjectMetadata,
    load_extension_spec,
    load_project,
    pinned_requirements,
    selected_archs,
    target_cpu,
)
from mok_build.toolchain import clean_environment, resolve

__all__ = [
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
]

PACKAGE = "mok"
# What an sdist carries besides the package: enough to run this backend again.
SDIST_TREES = ("csrc", "tools/build")
SDIST_FILES = ("pyproject.toml", "README.md", "LICENSE", "requirements.in", "requirements.lock")


def _root() -> Path:
    # Front ends run hooks with the source tree as the working directory (PEP 517).
    return Path.cwd().resolve()


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return []  # [build-system] requires already lists the pinned toolchain


def get_requires_for_build_sdist(config_settings=None) -> list[str]:
    return []


def _package_files(root: Path) -> dict[str, bytes]:
    """The pure-Python part of the package: mok/**/*.py (and py.typed), never built artifacts."""
    files = {}
    for path in sorted((root / PACKAGE).rglob("*")):
        relative = path.relative_to(root).as_posix()
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix == ".py" or path.name == "py.typed":
            files[relative] = path.read_bytes()
    return files


def _compile(root: Path, project: ProjectMetadata, spec: ExtensionSpec, scratch: Path):
    epoch = archive.source_date_epoch()
    archs = selected_archs(spec)
    cpu = target_cpu(spec)
    compiler = (spec.host_compilers[cpu], spec.host_compiler_version)
    pins = pinned_requirements(project.build_requires)
    toolchain = resolve(spec.cuda_version, pins, compiler, cpu, os.environ)
    progress = Progress(len(archs) * (len(spec.extension_sources) + 1))
    if archs != spec.archs:
        progress.log(f"MOK_ARCHS: partial build ({', '.join(archs)}), not a release wheel")
    files = [*spec.extension_sources, *spec.extension_headers]
    with staged_sources(root, files) as stage:
        config = BuildConfig(
            root=stage,
            build_dir=scratch,
            version=project.version,
            git_commit=os.environ.get("MOK_GIT_COMMIT", "").strip() or "unknown",
            jobs=default_jobs(os.environ),
            env=clean_environment(os.environ, epoch),
        )
        modules = build_modules(spec, toolchain, config, archs, progress)
    # Whether the wheel's manylinux tag is honest is auditwheel's call (tools/check_wheel.py).
    return toolchain, modules, progress


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    root = _root()
    project = load_project(root)
    spec = load_extension_spec(root)
    with tempfile.TemporaryDirectory(prefix="mok-build-") as scratch:
        toolchain, modules, progress = _compile(root, project, spec, Path(scratch))
        files = _package_files(root)
        for path in modules.values():
            files[f"{PACKAGE}/{path.name}"] = path.read_bytes()
        platform = spec.wheel_platforms[toolchain.target_cpu]
        tag = f"{toolchain.python_tag}-{toolchain.python_tag}-{platform}"
        dist_info = f"{project.dist_name}-{project.version}.dist-info"
        files[f"{dist_info}/METADATA"] = metadata.core_metadata(project, root).encode()
        files[f"{dist_info}/WHEEL"] = metadata.wheel_file(tag, project.version).encode()
        if project.scripts:
            files[f"{dist_info}/entry_points.txt"] = metadata.entry_points(project).encode()
        for path in project.license_files:  # PEP 639: at their paths under licenses/
            files[f"{dist_info}/licenses/{path}"] = (root / path).read_bytes()
        name = f"{project.dist_name}-{project.version}-{tag}.whl"
        epoch = archive.source_date_epoch()
        archive.write_wheel(Path(wheel_directory) / name, files, dist_info, epoch)
        progress.log(f"wrote {name} ({len(files) + 1} files)")
    return name


def build_sdist(sdist_directory, config_settings=None) -> str:
    root = _root()
    project = load_project(root)
    base = f"{project.dist_name}-{project.version}"
    files: dict[str, bytes] = {}
    for relative in (*SDIST_FILES, *project.license_files):
        if (root / relative).is_file():
            files[f"{base}/{relative}"] = (root / relative).read_bytes()
    for tree in (PACKAGE, *SDIST_TREES):
        for path in sorted((root / tree).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so":
                files[f"{base}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    files[f"{base}/PKG-INFO"] = metadata.core_metadata(project, root).encode()
    name = f"{base}.tar.gz"
    archive.write_sdist(Path(sdist_directory) / name, files, archive.source_date_epoch())
    return name
