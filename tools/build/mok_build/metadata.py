"""Core metadata (METADATA / PKG-INFO) and the WHEEL file, from pyproject.toml [project]."""

from __future__ import annotations

from pathlib import Path

from mok_build.spec import ProjectMetadata

GENERATOR = "mok_build"


def core_metadata(project: ProjectMetadata, root: Path) -> str:
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project.name}",
        f"Version: {project.version}",
    ]
    if project.summary:
        lines.append(f"Summary: {project.summary}")
    if project.license:
        lines.append(f"License-Expression: {project.license}")
    lines += [f"License-File: {path}" for path in project.license_files]
    if project.requires_python:
        lines.append(f"Requires-Python: {project.requires_python}")
    lines += [f"Requires-Dist: {requirement}" for requirement in project.dependencies]
    for extra, requirements in project.extras:
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {req}; extra == '{extra}'" for req in requirements]
    readme = root / project.readme if project.readme else None
    if readme is not None and readme.is_file():
        kind = "text/markdown" if readme.suffix.lower() == ".md" else "text/plain"
        lines.append(f"Description-Content-Type: {kind}")
        return "\n".join(lines) + "\n\n" + readme.read_text(encoding="utf-8")
    return "\n".join(lines) + "\n"


def wheel_file(tag: str, version: str) -> str:
    return (
        "Wheel-Version: 1.0\n"
        f"Generator: {GENERATOR} {version}\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    )


def entry_points(project: ProjectMetadata) -> str:
    """dist-info/entry_points.txt: the console scripts of [project.scripts]."""
    lines = ["[console_scripts]", *(f"{name} = {target}" for name, target in project.scripts)]
    return "\n".join(lines) + "\n"
