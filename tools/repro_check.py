#!/usr/bin/env python3
"""Reproducibility check: build the sdist and wheel twice, from clean copies at two different
paths, and require identical bytes.

    .venv/bin/python tools/repro_check.py [--out dist] [--keep] [--python .venv/bin/python]

Each copy holds the files git would commit (tracked plus untracked-but-not-ignored), so build
outputs and virtual environments in the checkout cannot leak in. Both builds run
`python -m build --sdist --wheel --no-isolation` with the same SOURCE_DATE_EPOCH. On a match the
artifacts of the first build and a SHA256SUMS file go to --out; on a mismatch the differing
archive members are named (and, for a shared object, its differing ELF sections) and the exit
status is 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools" / "build"))

from mok_build import archive, elf  # noqa: E402  (the backend lives in tools/build)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_files(repo: Path) -> list[str]:
    """Paths git would commit: tracked or untracked-but-not-ignored, that exist on disk."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({name for name in listing.split("\0") if name and (repo / name).is_file()})


def copy_tree(repo: Path, files: list[str], destination: Path) -> None:
    for name in files:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)


def build(source: Path, out: Path, python: str, epoch: int) -> float:
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    env.pop("PYTHONPATH", None)
    argv = [python, "-m", "build", "--sdist", "--wheel", "--no-isolation", "--outdir", str(out)]
    print(f"[repro] building in {source}", flush=True)
    begin = time.monotonic()
    subprocess.run(argv, cwd=source, env=env, check=True)
    seconds = time.monotonic() - begin
    print(f"[repro] build in {source} took {seconds:.1f}s", flush=True)
    return seconds


def _members(path: Path) -> dict[str, bytes]:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as archive_file:
            return {info.filename: archive_file.read(info) for info in archive_file.infolist()}
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _zip_headers(path: Path) -> dict[str, tuple]:
    if path.suffix != ".whl":
        return {}
    with zipfile.ZipFile(path) as archive_file:
        return {
            i.filename: (i.date_time, i.external_attr, i.compress_type, i.extra)
            for i in archive_file.infolist()
        }


def explain(first: Path, second: Path) -> list[str]:
    """Human-readable differences between two archives of the same name."""
    a, b = _members(first), _members(second)
    lines = [f"  only in build 1: {name}" for name in sorted(a.keys() - b.keys())]
    lines += [f"  only in build 2: {name}" for name in sorted(b.keys() - a.keys())]
    for name in sorted(a.keys() & b.keys()):
        if a[name] == b[name]:
            continue
        lines.append(f"  differs: {name} ({len(a[name])} vs {len(b[name])} bytes)")
        if a[name][:4] == b"\x7fELF" and b[name][:4] == b"\x7fELF":
            sa, sb = elf.sections(a[name]), elf.sections(b[name])
            changed = sorted(s for s in sa.keys() | sb.keys() if sa.get(s) != sb.get(s))
            lines.append(f"    ELF sections that differ: {', '.join(changed) or '(headers only)'}")
    ha, hb = _zip_headers(first), _zip_headers(second)
    lines += [
        f"  zip header differs: {name} {ha[name]} vs {hb[name]}"
        for name in sorted(ha.keys() & hb.keys())
        if ha[name] != hb[name]
    ]
    return lines or ["  archives differ outside their members (order or archive metadata)"]


def compare(out1: Path, out2: Path) -> tuple[bool, list[str]]:
    names1 = sorted(p.name for p in out1.iterdir())
    names2 = sorted(p.name for p in out2.iterdir())
    if names1 != names2:
        return False, [f"different artifact names: {names1} vs {names2}"]
    ok, report = True, []
    for name in names1:
        h1, h2 = sha256(out1 / name), sha256(out2 / name)
        report.append(f"{name}\n  build 1: {h1}\n  build 2: {h2}")
        if h1 != h2:
            ok = False
            report += explain(out1 / name, out2 / name)
    return ok, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="artifacts + SHA256SUMS")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the locked env")
    parser.add_argument("--keep", action="store_true", help="keep the two build trees")
    args = parser.parse_args()
    epoch = archive.source_date_epoch()
    work = Path(tempfile.mkdtemp(prefix="mok-repro-"))
    # Different depths and names, so any absolute path that leaks into an artifact shows up.
    trees = [work / "a" / "mok", work / "b" / "deeper" / "checkout-2"]
    outs = [work / "out1", work / "out2"]
    files = source_files(REPO)
    try:
        for tree, out in zip(trees, outs, strict=True):
            copy_tree(REPO, files, tree)
            build(tree, out, args.python, epoch)
        ok, report = compare(*outs)
        print("\n".join(report))
        if not ok:
            print("[repro] FAIL: the two builds differ", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        sums = []
        for artifact in sorted(outs[0].iterdir()):
            shutil.copy2(artifact, args.out / artifact.name)
            sums.append(f"{sha256(artifact)}  {artifact.name}\n")
        (args.out / "SHA256SUMS").write_text("".join(sums))
        print(f"[repro] OK: identical builds; artifacts and SHA256SUMS in {args.out}")
        return 0
    finally:
        if args.keep:
            print(f"[repro] build trees kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
