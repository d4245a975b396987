#!/usr/bin/env python3
"""Reproducibility check: build the sdist and wheel twice, from clean copies at two different
paths, and require identical bytes.

    .venv/bin/python tools/repro_check.py [--out dist] [--keep] [--python .venv/bin/python]

Each copy holds the files git would commit (tracked plus untracked-but-not-ignored), so build
outputs and virtual environments in the checkout cannot leak in. Both builds run
`python -m build --sdist --wheel --no-isolation` with the same SOURCE_DATE_EPOCH. On a match
every wheel must pass auditwheel (tools/check_wheel.py), then the artifacts of the first build and a
SHA256SUMS file go to --out; on a mismatch diffoscope explains each differing artifact (down to the
archive member, ELF section and disassembly; its HTML report is written next to --out) and the
exit status is 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools" / "build"))

from mok_build import archive  # noqa: E402  (the backend lives in tools/build)

# Lines of diffoscope's text report printed per differing artifact (the HTML report has it all).
REPORT_LINES = 200


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


def explain(first: Path, second: Path, html: Path | None = None) -> list[str]:
    """diffoscope's account of how two artifacts of the same name differ (text, shortened)."""
    # diffoscope has no `python -m` entry: call its main from the same interpreter.
    entry = "import sys; from diffoscope.main import main; sys.argv[0] = 'diffoscope'; main()"
    argv = [sys.executable, "-c", entry, "--text", "-", "--no-progress"]
    argv += [f"--html={html}"] if html else []
    try:
        result = subprocess.run(
            [*argv, str(first), str(second)], capture_output=True, text=True, check=False
        )
    except OSError as error:
        return [f"  diffoscope could not run: {error}"]
    if result.returncode not in (0, 1) or not result.stdout and result.returncode:  # 1: differ
        return [f"  diffoscope failed (exit {result.returncode}): {result.stderr.strip()}"]
    lines = result.stdout.splitlines()
    shown = ["  " + line for line in lines[:REPORT_LINES]]
    if len(lines) > REPORT_LINES:
        shown.append(
            f"  ... {len(lines) - REPORT_LINES} more lines" + (f" in {html}" if html else "")
        )
    return shown or ["  diffoscope found no difference in content (archive metadata only?)"]


def compare(out1: Path, out2: Path, reports: Path | None = None) -> tuple[bool, list[str]]:
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
            html = reports / f"{name}.diffoscope.html" if reports else None
            report += explain(out1 / name, out2 / name, html)
    return ok, report


def write_sums(out: Path, artifacts: list[Path]) -> None:
    """Copy the artifacts to `out` and record them in out/SHA256SUMS, keeping the entries of
    other artifacts already there (an x86_64 and an aarch64 run share one file)."""
    sums_path = out / "SHA256SUMS"
    sums = {}
    if sums_path.is_file():
        for line in sums_path.read_text().splitlines():
            digest, _, name = line.partition("  ")
            if (out / name).is_file():
                sums[name] = digest
    for artifact in artifacts:
        shutil.copy2(artifact, out / artifact.name)
        sums[artifact.name] = sha256(artifact)
    sums_path.write_text("".join(f"{sums[name]}  {name}\n" for name in sorted(sums)))


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
        for tree in trees:  # both copies first: edits made during the builds reach neither
            copy_tree(REPO, files, tree)
        for tree, out in zip(trees, outs, strict=True):
            build(tree, out, args.python, epoch)
        args.out.mkdir(parents=True, exist_ok=True)
        ok, report = compare(*outs, reports=args.out)
        print("\n".join(report))
        if not ok:
            print("[repro] FAIL: the two builds differ", file=sys.stderr)
            return 1
        wheels = [str(p) for p in sorted(outs[0].glob("*.whl"))]
        if subprocess.run([args.python, str(REPO / "tools/check_wheel.py"), *wheels]).returncode:
            print("[repro] FAIL: auditwheel rejects the wheel's platform tag", file=sys.stderr)
            return 1
        write_sums(args.out, sorted(outs[0].iterdir()))
        print(f"[repro] OK: identical builds; artifacts and SHA256SUMS in {args.out}")
        return 0
    finally:
        if args.keep:
            print(f"[repro] build trees kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
