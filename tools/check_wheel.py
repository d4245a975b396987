#!/usr/bin/env python3
"""The manylinux check of built wheels, by auditwheel (the tool that defines the policies).

    python tools/check_wheel.py WHEEL [WHEEL...]

For each wheel, `auditwheel show --json` must find no external library the wheel would need to
vendor, and the platform tag in the wheel's file name must be one its contents allow: the same
architecture, and a glibc baseline no older than the one auditwheel computes from the symbol
versions the modules reference (a tag promising an older system than the binaries need is a lie).
Prints auditwheel's verdict per wheel; exits 1 on any problem.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)")


def audit(wheel: Path) -> dict:
    """auditwheel's JSON report (auditwheel runs from this interpreter's environment)."""
    argv = [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"auditwheel show {wheel.name} failed:\n{result.stderr}")
    return json.loads(result.stdout)


def claimed_tag(wheel: Path) -> str:
    """The platform tag of a wheel file name (PEP 427: the last of its dash-separated fields)."""
    return wheel.name.removesuffix(".whl").rsplit("-", 1)[1]


def problems(wheel: Path, report: dict) -> list[str]:
    found = []
    if report.get("external_libs"):
        found.append(f"{wheel.name}: needs libraries outside the policy: {report['external_libs']}")
    claimed, allowed = (
        _MANYLINUX.fullmatch(claimed_tag(wheel)),
        _MANYLINUX.fullmatch(report.get("overall_tag", "")),
    )
    if claimed is None or allowed is None:
        return [*found, f"{wheel.name}: tag {claimed_tag(wheel)}, auditwheel {report}"]
    if claimed[3] != allowed[3]:
        found.append(f"{wheel.name}: tagged {claimed[3]}, its binaries are {allowed[3]}")
    if (int(claimed[1]), int(claimed[2])) < (int(allowed[1]), int(allowed[2])):
        found.append(
            f"{wheel.name}: tagged {claimed[0]}, but its modules need {allowed[0]} "
            "(build on an older base system, or raise WHEEL_PLATFORMS in tools/build/extension.bzl)"
        )
    return found


def main(argv: list[str]) -> int:
    if not argv:
        sys.exit(__doc__)
    failed = []
    for name in argv:
        wheel = Path(name)
        report = audit(wheel)
        print(f"auditwheel: {wheel.name} is consistent with {report['overall_tag']}")
        failed += problems(wheel, report)
    for problem in failed:
        print(problem, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
