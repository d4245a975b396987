"""What to build: tools/build/extension.bzl (sources, archs, flags) and pyproject.toml (metadata).

extension.bzl is Starlark that Bazel loads; it is kept to plain literal assignments so that this
module can read it with `ast` and no Starlark interpreter.
"""

from __future__ import annotations

import ast
import os
import platform
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

EXTENSION_BZL = Path("tools/build/extension.bzl")

# Fields extension.bzl must define, with the Python type each literal must have.
_FIELDS: dict[str, type] = {
    "CUDA_VERSION": str,
    "ARCHS": list,
    "MODULE_NAMES": dict,
    "GENCODE": dict,
    "COMPUTE_CAPABILITY": dict,
    "EXTENSION_SOURCES": list,
    "EXTENSION_HEADERS": list,
    "INCLUDE_DIRS": list,
    "DEFINES": list,
    "NVCC_FLAGS": list,
    "HOST_FLAGS": list,
    "REPRODUCIBLE_FLAGS": list,
    "LINK_FLAGS": list,
    "LINK_LIBS": list,
    "HOST_CPUS": list,
    "HOST_COMPILER_VERSION": str,
    "HOST_COMPILERS": dict,
    "WHEEL_PLATFORMS": dict,
}


class SpecError(ValueError):
    """The build description or the project metadata is malformed."""


def read_bzl(path: Path) -> dict[str, object]:
    """Every top-level `NAME = <literal>` of a Starlark file, evaluated with ast.literal_eval."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the module docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            raise SpecError(f"{path}:{node.lineno}: only `NAME = <literal>` statements are allowed")
        target = node.targets[0]
        if not isinstance(target, ast.Name):
            raise SpecError(f"{path}:{node.lineno}: assignment target must be a plain name")
        try:
            values[target.id] = ast.literal_eval(node.value)
        except ValueError as error:
            raise SpecError(f"{path}:{node.lineno}: {target.id} is not a literal") from error
    return values


@dataclass(frozen=True, slots=True)
class ExtensionSpec:
    """The parsed extension.bzl (field names as there, lower-cased)."""

    cuda_version: str
    archs: tuple[str, ...]
    module_names: dict[str, str]
    gencode: dict[str, str]
    compute_capability: dict[str, str]
    extension_sources: tuple[str, ...]
    extension_headers: tuple[str, ...]
    include_dirs: tuple[str, ...]
    defines: tuple[str, ...]
    nvcc_flags: tuple[str, ...]
    host_flags: tuple[str, ...]
    reproducible_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    link_libs: tuple[str, ...]
    host_cpus: tuple[str, ...]
    host_compiler_version: str
    host_compilers: dict[str, str]
    wheel_platforms: dict[str, str]

    def module_name(self, arch: str) -> str:
        return self.module_names[arch]


def load_extension_spec(root: Path) -> ExtensionSpec:
    values = read_bzl(root / EXTENSION_BZL)
    fields = {}
    for name, kind in _FIELDS.items():
        if not isinstance(values.get(name), kind):
            raise SpecError(f"{EXTENSION_BZL}: {name} must be a {kind.__name__} literal")
        value = values[name]
        fields[name.lower()] = tuple(value) if kind is list else value
    spec = ExtensionSpec(**fields)
    for arch in spec.archs:
        tables = (spec.module_names, spec.gencode, spec.compute_capability)
        if any(arch not in table for table in tables):
            raise SpecError(
                f"{EXTENSION_BZL}: {arch} needs entries in MODULE_NAMES, GENCODE and "
                "COMPUTE_CAPABILITY"
            )
    return spec


def target_cpu(spec: ExtensionSpec, environ: dict[str, str] | None = None) -> str:
    """MOK_TARGET_CPU (x86_64 or aarch64: the wheel's host CPU), by default this machine's."""
    environ = os.environ if environ is None else environ
    cpu = environ.get("MOK_TARGET_CPU", "").strip() or platform.machine()
    if cpu not in spec.host_cpus:
        raise SpecError(f"MOK_TARGET_CPU={cpu!r}: choose from {', '.join(spec.host_cpus)}")
    return cpu


def selected_archs(spec: ExtensionSpec, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """MOK_ARCHS (comma-separated, for quick dev builds) or, by default, every arch."""
    environ = os.environ if environ is None else environ
    requested = environ.get("MOK_ARCHS", "").replace(" ", "")
    if not requested:
        return spec.archs
    archs = tuple(dict.fromkeys(requested.split(",")))
    unknown = [arch for arch in archs if arch not in spec.archs]
    if unknown or "" in archs:
        raise SpecError(
            f"MOK_ARCHS={requested!r} names unknown architectures {unknown}; "
            f"choose from {', '.join(spec.archs)}"
        )
    return archs


@dataclass(frozen=True, slots=True)
class ProjectMetadata:
    name: str
    version: str
    summary: str
    requires_python: str
    dependencies: tuple[str, ...]
    license: str
    readme: str
    build_requires: tuple[str, ...]
    # Licence files (paths from the project root, PEP 639 `license-files`), shipped in the
    # wheel's dist-info/licenses/ and named by License-File lines.
    license_files: tuple[str, ...] = ()
    # [project.scripts]: (command, "module:function"), written to dist-info/entry_points.txt.
    scripts: tuple[tuple[str, str], ...] = ()
    # [project.optional-dependencies]: (extra, its requirements), as Provides-Extra and
    # Requires-Dist lines with an `extra ==` marker.
    extras: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def dist_name(self) -> str:
        """The distribution name as wheel and sdist file names spell it (PEP 427/625)."""
        return re.sub(r"[-_.]+", "_", self.name).lower()


def load_project(root: Path) -> ProjectMetadata:
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    project = data.get("project", {})
    missing = [key for key in ("name", "version") if key not in project]
    if missing:
        raise SpecError(
            f"pyproject.toml [project] lacks {missing} (dynamic metadata is unsupported)"
        )
    license_value = project.get("license", "")
    return ProjectMetadata(
        name=project["name"],
        version=project["version"],
        summary=project.get("description", ""),
        requires_python=project.get("requires-python", ""),
        dependencies=tuple(project.get("dependencies", ())),
        license=license_value if isinstance(license_value, str) else "",
        readme=project.get("readme", "") if isinstance(project.get("readme"), str) else "",
        build_requires=tuple(data.get("build-system", {}).get("requires", ())),
        license_files=license_files(root, project.get("license-files", [])),
        scripts=tuple(sorted(project.get("scripts", {}).items())),
        extras=tuple(
            (extra, tuple(requirements))
            for extra, requirements in sorted(project.get("optional-dependencies", {}).items())
        ),
    )


def license_files(root: Path, patterns: list[str]) -> tuple[str, ...]:
    """The files `license-files` names (glob patterns from the project root, PEP 639), sorted;
    a pattern that leaves the tree or matches no file is an error."""
    found: set[str] = set()
    for pattern in patterns:
        if pattern.startswith("/") or ".." in pattern.split("/") or "\\" in pattern:
            raise SpecError(f"pyproject.toml license-files: {pattern!r} must stay in the project")
        matches = [p for p in root.glob(pattern) if p.is_file()]
        if not matches:
            raise SpecError(f"pyproject.toml license-files: {pattern!r} matches no file")
        found |= {p.relative_to(root).as_posix() for p in matches}
    return tuple(sorted(found))


def pinned_requirements(requirements: tuple[str, ...]) -> dict[str, str]:
    """{normalized name: version} of the `name==version` entries (others are ignored)."""
    pins = {}
    for requirement in requirements:
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;,]+)\s*", requirement)
        if match:
            pins[normalize(match.group(1))] = match.group(2)
    return pins


def normalize(name: str) -> str:
    """PEP 503 name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()
