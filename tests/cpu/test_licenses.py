"""The licences: mok's Apache-2.0 LICENSE, the third-party licences under third_party/ (byte for
byte the locked packages' own), and how the PEP 517 backend ships them in the wheel's
dist-info/licenses/ and the sdist (PEP 639), checked without compiling anything (the built
wheel's copy: tests/cpu/test_build.py)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if not (REPO / "third_party").is_dir():  # Bazel's sandbox holds the tests, not the tree
    pytest.skip(f"the licence files are not next to the tests ({REPO})", allow_module_level=True)
sys.path.insert(0, str(REPO / "tools" / "build"))
import mok_build  # noqa: E402
from mok_build import metadata, spec  # noqa: E402

# apache.org's https://www.apache.org/licenses/LICENSE-2.0.txt
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
# third_party/<file>: (the package that ships it, the file's path in its dist-info)
THIRD_PARTY = {
    "third_party/cutlass/LICENSE.txt": ("nvidia-cutlass", "licenses/LICENSE.txt"),
    "third_party/pybind11/LICENSE": ("pybind11", "licenses/LICENSE"),
    "third_party/cuda_runtime/LICENSE.txt": ("nvidia-cuda-runtime", "licenses/License.txt"),
}
EXPECTED = ("LICENSE", *sorted(THIRD_PARTY))


def test_license_is_the_official_apache_2_0_text():
    assert hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256


@pytest.mark.parametrize("path", sorted(THIRD_PARTY))
def test_third_party_licence_is_the_locked_packages_own(path):
    name, inside = THIRD_PARTY[path]
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    lock = (REPO / "requirements.lock").read_text()
    assert f"\n{name}=={dist.version} " in lock, f"{name} {dist.version} is not the locked one"
    (shipped,) = [f for f in dist.files if f.as_posix().endswith(f".dist-info/{inside}")]
    assert (REPO / path).read_bytes() == shipped.read_binary()


def test_pyproject_lists_every_licence_and_metadata_names_them():
    project = spec.load_project(REPO)
    assert project.license_files == tuple(sorted(EXPECTED))
    headers = metadata.core_metadata(project, REPO).split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert [h for h in headers if h.startswith("License-File: ")] == [
        f"License-File: {path}" for path in project.license_files
    ]


@pytest.mark.parametrize(
    "pattern, message",
    [("NOTICE", "matches no file"), ("../LICENSE", "must stay"), ("/etc/passwd", "must stay")],
)
def test_a_bad_license_files_pattern_is_refused(tmp_path, pattern, message):
    (tmp_path / "LICENSE").write_text("x")
    with pytest.raises(spec.SpecError, match=message):
        spec.license_files(tmp_path, ["LICENSE", pattern])


def test_license_files_patterns_are_globs(tmp_path):
    for path in ("LICENSE", "third_party/a/LICENSE", "third_party/b/COPYING"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(path)
    found = spec.license_files(tmp_path, ["third_party/*/LICENSE", "LICENSE", "LICEN*"])
    assert found == ("LICENSE", "third_party/a/LICENSE")


class _Toolchain:
    python_tag = "cp312"
    target_cpu = "x86_64"  # the wheel's platform tag is chosen by it


class _Progress:
    def log(self, message: str) -> None:
        pass


def _build_without_compiling(monkeypatch, tmp_path: Path, out: str) -> bytes:
    """mok_build.build_wheel with a stand-in for the compile step (one fake module), so that
    the archive's licence files and bytes are checked in a second instead of minutes."""
    module = tmp_path / "_C_sm90a.so"
    module.write_bytes(b"\x7fELF fake")
    fake = lambda *args: (_Toolchain(), {"sm_90a": module}, _Progress())  # noqa: E731
    monkeypatch.setattr(mok_build, "_compile", fake)
    monkeypatch.chdir(REPO)
    (tmp_path / out).mkdir()
    name = mok_build.build_wheel(str(tmp_path / out))
    return (tmp_path / out / name).read_bytes()


def test_wheel_carries_the_licences_and_stays_reproducible(monkeypatch, tmp_path):
    first = _build_without_compiling(monkeypatch, tmp_path, "one")
    assert _build_without_compiling(monkeypatch, tmp_path, "two") == first
    with zipfile.ZipFile(io.BytesIO(first)) as wheel:
        names = wheel.namelist()
        dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        for path in EXPECTED:
            member = f"{dist_info}/licenses/{path}"
            assert wheel.read(member) == (REPO / path).read_bytes(), member
        record = wheel.read(f"{dist_info}/RECORD").decode()
    assert f"{dist_info}/licenses/third_party/cutlass/LICENSE.txt,sha256=" in record
    assert names[-1] == f"{dist_info}/RECORD"


def test_sdist_carries_the_licences(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    name = mok_build.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as sdist:
        base = name.removesuffix(".tar.gz")
        for path in EXPECTED:
            member = sdist.extractfile(f"{base}/{path}")
            assert member.read() == (REPO / path).read_bytes(), path
