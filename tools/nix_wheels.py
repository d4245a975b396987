#!/usr/bin/env python3
"""Generate nix/wheels.nix from requirements.lock: the wheels Nix fetches, by the lock's hashes.

    python tools/nix_wheels.py          # rewrite nix/wheels.nix
    python tools/nix_wheels.py --check  # exit 1 when nix/wheels.nix is not what the lock gives

For each Nix system (x86_64-linux, aarch64-linux), pip resolves the lock for CPython 3.12 on that
CPU (--dry-run --report: metadata only, nothing large is downloaded) with --require-hashes, and
the file it picks is recorded with its URL and SHA-256, which is one of the lock's own hashes
(tests/cpu/test_nix_flake.py checks that offline). Left out: packages whose markers exclude Linux,
and NIXPKGS packages, which the flake takes from nixpkgs (diffoscope is published as an sdist
only, and nixpkgs carries it with the tools it calls).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "nix" / "wheels.nix"
NIXPKGS = ("diffoscope",)
# pip's --platform matches exactly: every manylinux level a locked wheel may carry.
_LEVELS = tuple(f"2_{minor}" for minor in range(17, 35))
SYSTEMS = {
    "x86_64-linux": "x86_64",
    "aarch64-linux": "aarch64",
}


def lock_entries(text: str) -> dict[str, tuple[str, str, str]]:
    """name -> (version, marker, the entry's text) for every entry of the lock."""
    entries = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)(?: ; ([^\\\n]+))?", block)
        if match:
            name = re.sub(r"[-_.]+", "-", match[1]).lower()
            entries[name] = (match[2], (match[3] or "").strip(), block)
    return entries


def for_linux(marker: str) -> bool:
    return not marker or "sys_platform == 'linux'" in marker


def nix_set(entries: dict) -> dict[str, str]:
    """The lock entries Nix fetches: name -> version."""
    return {
        name: version
        for name, (version, marker, _) in entries.items()
        if for_linux(marker) and name not in NIXPKGS
    }


def resolve(cpu: str, requirements: str) -> dict[str, dict[str, str]]:
    """name -> {version, url, sha256} of the files pip picks for CPython 3.12 on `cpu`."""
    with tempfile.TemporaryDirectory(prefix="mok-nix-") as scratch:
        lock = Path(scratch) / "lock.txt"
        lock.write_text(requirements)
        report = Path(scratch) / "report.json"
        platforms = [f"--platform=manylinux_{level}_{cpu}" for level in _LEVELS]
        platforms.append(f"--platform=manylinux2014_{cpu}")
        argv = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
            "--no-deps", "--require-hashes", "--only-binary=:all:", *platforms,
            "--python-version=3.12", "--implementation=cp", "--abi=cp312", "--abi=abi3",
            "--abi=none", "--target", str(Path(scratch) / "target"), "--report", str(report),
            "-r", str(lock),
        ]  # fmt: skip
        # PyPI only: no machine-local index, link directory or constraint file.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        subprocess.run(argv, check=True, env=env)
        items = json.loads(report.read_text())["install"]
    found = {}
    for item in items:
        info = item["download_info"]
        name = re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower()
        found[name] = {
            "version": item["metadata"]["version"],
            "url": info["url"],
            "sha256": info["archive_info"]["hashes"]["sha256"],
        }
    return found


def render(systems: dict[str, dict[str, dict[str, str]]]) -> str:
    lines = [
        "# Generated from requirements.lock by tools/nix_wheels.py: do not edit by hand.",
        "# system -> PyPI name -> the wheel pip picks there for CPython 3.12, by the lock's hash.",
        "{",
    ]
    for system, wheels in systems.items():
        lines.append(f'  "{system}" = {{')
        for name in sorted(wheels):
            wheel = wheels[name]
            lines.append(
                f'    "{name}" = {{ version = "{wheel["version"]}"; '
                f'url = "{wheel["url"]}"; sha256 = "{wheel["sha256"]}"; }};'
            )
        lines.append("  };")
    lines.append("}")
    return "\n".join(lines) + "\n"


def generate() -> str:
    entries = lock_entries((REPO / "requirements.lock").read_text())
    wanted = nix_set(entries)
    requirements = "\n".join(entries[name][2] for name in sorted(wanted)) + "\n"
    systems = {system: resolve(cpu, requirements) for system, cpu in SYSTEMS.items()}
    for system, wheels in systems.items():
        missing = sorted(set(wanted) - set(wheels))
        if missing:
            raise SystemExit(f"{system}: pip picked no wheel for {', '.join(missing)}")
    return render(systems)


def main(argv: list[str]) -> int:
    text = generate()
    if argv == ["--check"]:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(REPO)} is stale: run python tools/nix_wheels.py")
            return 1
        return 0
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
