"""The Bazel files, checked without Bazel: evaluated with stubbed rules
(tools/bazel/check_starlark.py: what Bazel would not catch, or only on a GPU runner; attributes and
labels are `bazel build --nobuild`'s job in ci.yml) and formatted/linted by the pinned
buildifier. A second group breaks a copy of the repository on purpose and shows each check
failing, so a green run means something.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "bazel"))

import check_starlark as cs  # noqa: E402
from starlark_eval import bazel_files, evaluate_repository  # noqa: E402

pytestmark = pytest.mark.skipif(
    "TEST_SRCDIR" in os.environ,
    reason="checks the repository's Bazel files; inside Bazel's sandbox they are not inputs "
    "(run through make test / tools/check_build_files.sh)",
)
BUILDIFIER = ROOT / "node_modules" / ".bin" / "buildifier"


def _copy_ignore(directory: str, names: list[str]) -> set[str]:
    # Generated and vendored trees: everywhere for caches, at the top for build outputs.
    skip = {
        n
        for n in names
        if n in {".git", "node_modules", "__pycache__"} or n.startswith((".venv", "bazel-"))
    }
    if Path(directory) == ROOT:
        skip |= {n for n in names if n in {"build", "dist", ".pytest_cache", ".ruff_cache"}}
    return skip


@pytest.fixture(scope="module")
def evaluated():
    return evaluate_repository(ROOT)


def test_every_bazel_file_evaluates(evaluated):
    assert evaluated.problems == []
    assert {"MODULE.bazel", "BUILD.bazel", "mok/BUILD.bazel"} <= {
        p.relative_to(ROOT).as_posix() for p in bazel_files(ROOT)
    }


def test_every_test_file_has_one_target(evaluated):
    assert cs.check_tests(ROOT, evaluated.calls) == []
    names = {c.attrs["name"] for c in evaluated.calls if c.key == cs.PY_TEST}
    assert {p.stem for p in ROOT.glob("tests/**/test_*.py")} <= names


@pytest.mark.parametrize("config", cs.TIERS)
def test_every_tier_selects_tests(evaluated, config):
    """The static proof that `bazel test --config=<tier> //tests/...` runs something: the
    .bazelrc tag filter applied to the evaluated BUILD files, as Bazel applies it."""
    targets = cs.tier_targets(ROOT, evaluated.calls, config)
    print(f"--config={config}: {len(targets)} targets, e.g. {targets[:3]}")
    assert targets
    gpu_tagged = [t for t in targets if t.startswith("//tests/gpu:")]
    assert (config == "cpu") == (not gpu_tagged)


def test_tiers_pick_the_launch_they_need(evaluated):
    multi = cs.tier_targets(ROOT, evaluated.calls, "multi_gpu")
    rack = cs.tier_targets(ROOT, evaluated.calls, "nvl72")
    one = cs.tier_targets(ROOT, evaluated.calls, "gpu")
    assert all(t.endswith("_multi_gpu") for t in multi)
    assert all(t.endswith("_nvl72") for t in rack)
    assert not any(t.endswith(("_multi_gpu", "_nvl72")) for t in one)
    args = {
        f"//{c.package}:{c.attrs['name']}": c.attrs["args"]
        for c in evaluated.calls
        if c.key == cs.PY_TEST
    }
    assert all("--launch=host" in args[t] for t in multi)
    assert all("--launch=rack" in args[t] for t in rack)
    assert all("--launch=one" in args[t] for t in one)


def test_gpu_tests_run_on_both_host_cpus():
    text = (ROOT / "tools/bazel/tests.bzl").read_text()
    assert '"@platforms//cpu:aarch64"' in text and '"@platforms//cpu:x86_64"' in text


def test_configs_the_workflows_name_are_defined():
    used = set()
    for workflow in (ROOT / ".github/workflows").glob("*.yml"):
        text = workflow.read_text()
        used |= set(re.findall(r"--config=([\w-]+)", text))
        used |= set(re.findall(r"^\s*config: ([\w-]+)\s*$", text, re.M))  # matrix values
    assert {"cpu", "gpu"} <= used
    for config in sorted(used):
        assert cs.config_options(ROOT, config) is not None


def test_buildifier_versions_agree():
    """The npm buildifier (tools/check_build_files.sh) and buildifier_prebuilt are one release."""
    npm = json.loads((ROOT / "package.json").read_text())["devDependencies"]["@bazel/buildifier"]
    module = (ROOT / "MODULE.bazel").read_text()
    prebuilt = re.search(r'"buildifier_prebuilt", version = "([\d.]+)"', module).group(1)
    assert prebuilt.split(".")[:3] == npm.split(".")


def test_gpu_tests_run_the_wheel_and_are_tagged(evaluated):
    for call in evaluated.calls:
        if call.key == cs.PY_TEST and call.package.startswith("tests/gpu"):
            assert "gpu" in call.attrs["tags"] and "//:mok_wheel" in call.attrs["data"]
            assert not any(dep.startswith("//mok") for dep in call.attrs["deps"])


def test_extension_sources_built_once_per_arch(evaluated):
    assert cs.check_extension(ROOT, evaluated.calls, cs.read_extension(ROOT)) == []


def test_versions_agree_with_lock_pyproject_and_extension(evaluated):
    problems = cs.check_versions(ROOT, evaluated.calls, cs.read_extension(ROOT), cs.read_lock(ROOT))
    assert problems == []


def test_the_wheel_ships_pyprojects_licence_files(evaluated):
    """py_wheel's extra_distinfo_files: pyproject.toml's license-files, each an existing file at
    its own path under dist-info/licenses/, as the PEP 517 backend ships them (PEP 639)."""
    sys.path.insert(0, str(ROOT / "tools" / "build"))
    from mok_build import spec

    (wheel,) = [c.attrs for c in evaluated.calls if c.key == cs.PY_WHEEL]
    paths = spec.load_project(ROOT).license_files
    assert wheel["extra_distinfo_files"] == {path: f"licenses/{path}" for path in paths}
    assert all((ROOT / path).is_file() for path in paths)


def test_the_wheel_ships_pyprojects_console_scripts(evaluated):
    """py_wheel's entry_points: pyproject.toml's [project.scripts], as the PEP 517 backend
    writes them to entry_points.txt."""
    sys.path.insert(0, str(ROOT / "tools" / "build"))
    from mok_build import spec

    (wheel,) = [c.attrs for c in evaluated.calls if c.key == cs.PY_WHEEL]
    scripts = spec.load_project(ROOT).scripts
    assert scripts == (("mok", "mok.cli:main"),)
    assert wheel["entry_points"] == {"console_scripts": [f"{n} = {t}" for n, t in scripts]}


def test_the_wheel_declares_pyprojects_extras(evaluated):
    """py_wheel's extra_requires: pyproject.toml's [project.optional-dependencies], which the PEP
    517 backend writes as Provides-Extra and marked Requires-Dist lines."""
    sys.path.insert(0, str(ROOT / "tools" / "build"))
    from mok_build import metadata, spec

    (wheel,) = [c.attrs for c in evaluated.calls if c.key == cs.PY_WHEEL]
    project = spec.load_project(ROOT)
    assert wheel["extra_requires"] == {extra: list(reqs) for extra, reqs in project.extras}
    lines = metadata.core_metadata(project, ROOT).split("\n\n")[0].splitlines()
    assert "Provides-Extra: cli" in lines
    assert "Requires-Dist: tqdm>=4.66; extra == 'cli'" in lines


def test_bazelrc_and_bazelversion():
    assert cs.check_bazelrc(ROOT) == []


@pytest.mark.skipif(not BUILDIFIER.exists(), reason="buildifier not installed: run `npm ci`")
@pytest.mark.parametrize("mode", ["--mode=check", "--lint=warn"])
def test_buildifier(mode):
    # The warning set tools/check_build_files.sh uses (default, less unsorted-dict-items).
    files = [str(p) for p in bazel_files(ROOT)]
    result = subprocess.run(
        [str(BUILDIFIER), mode, "--warnings=-unsorted-dict-items", *files],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---- the checks fail when they should ---------------------------------------------------------


def _break(root: Path, path: str, old: str, new: str) -> None:
    target = root / path
    text = target.read_text()
    assert old in text, f"{path} no longer contains {old!r}: update this test"
    target.write_text(text.replace(old, new, 1))


def _remove_source(root: Path) -> None:
    (root / "csrc/mxfp8/quantize.cu").unlink()


def _untargeted_test(root: Path) -> None:
    (root / "tests/integration").mkdir(exist_ok=True)
    (root / "tests/integration/test_new.py").write_text("def test_nothing():\n    pass\n")


def _unlisted_source(root: Path) -> None:
    (root / "csrc/extra.cu").write_text("// compiled by nobody\n")


def _pybind11_drift(root: Path) -> None:
    _break(
        root,
        "MODULE.bazel",
        '"pybind11_bazel", version = "3.0.1"',
        '"pybind11_bazel", version = "3.0.2"',
    )


def _unknown_tag(root: Path) -> None:
    _break(root, "MODULE.bazel", "cuda.toolkit(", "cuda.toolchain(")


def _empty_nvl72_tier(root: Path) -> None:
    text = (root / "tests/gpu/BUILD.bazel").read_text()
    (root / "tests/gpu/BUILD.bazel").write_text(re.sub(r"nvl72 = \[[^\]]*\]", "nvl72 = []", text))


def _test_only_config(root: Path) -> None:
    _break(root, ".bazelrc", "common:gpu --local_test_jobs=1", "test:gpu --local_test_jobs=1")


BREAKAGES = {
    "missing source": (_remove_source, r"csrc/mxfp8/quantize\.cu.*(missing|no such file)"),
    "untargeted test": (_untargeted_test, r"tests/integration/test_new\.py: 0 py_test targets"),
    "unbuilt csrc source": (_unlisted_source, r"csrc/extra\.cu: a csrc source not in EXTENSION"),
    "pybind11 drift": (
        _pybind11_drift,
        r"pybind11 3\.0\.1 in the lock, 3\.0\.2 from pybind11_bazel",
    ),
    "unknown extension tag": (_unknown_tag, r"has no attribute `toolchain`"),
    "empty nvl72 tier": (_empty_nvl72_tier, r"--config=nvl72 selects no test target"),
    "test-only config": (_test_only_config, r"test:gpu .*must be `common:`"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_checker_catches(breakage, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=_copy_ignore)
    apply, expected = BREAKAGES[breakage]
    apply(copy)
    problems = cs.run_checks(copy)
    assert any(re.search(expected, p) for p in problems), problems


@pytest.mark.skipif(not BUILDIFIER.exists(), reason="buildifier not installed: run `npm ci`")
def test_buildifier_catches_bad_formatting(tmp_path):
    bad = tmp_path / "BUILD.bazel"
    bad.write_text('load("//x:y.bzl","z")\nz(name="a",srcs=["b"],)\n')
    result = subprocess.run(
        [str(BUILDIFIER), "--mode=check", str(bad)], capture_output=True, text=True
    )
    assert result.returncode != 0


# ---- the py_test entry point: launch modes and the wheel's hash ------------------------------


def _pytest_main():
    import importlib.util

    module_spec = importlib.util.spec_from_file_location(
        "pytest_main", ROOT / "tools/bazel/pytest_main.py"
    )
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_torchrun_launch_modes():
    main = _pytest_main()
    host = main.torchrun_argv("host", {})
    assert host[1:] == ["-m", "torch.distributed.run", "--nproc-per-node=gpu", "--standalone"]
    rack = main.torchrun_argv(
        "rack", {"MOK_NNODES": "18", "MOK_RDZV_ENDPOINT": "tray0:29500", "MOK_RDZV_ID": "r1"}
    )
    assert {"--nnodes=18", "--rdzv-endpoint=tray0:29500", "--rdzv-id=r1"} <= set(rack)
    with pytest.raises(SystemExit, match="MOK_NNODES, MOK_RDZV_ENDPOINT, MOK_RDZV_ID unset"):
        main.torchrun_argv("rack", {})


def test_a_wheel_with_another_hash_is_refused(tmp_path, monkeypatch):
    main = _pytest_main()
    wheel = tmp_path / "mok-0.1.0-cp312-cp312-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"not the tested bytes")
    monkeypatch.setenv("MOK_WHEEL", str(wheel))
    monkeypatch.setenv("MOK_WHEEL_SHA256", "0" * 64)
    with pytest.raises(SystemExit, match="MOK_WHEEL_SHA256 says 0000"):
        main._wheel({})
    monkeypatch.delenv("MOK_WHEEL")
    with pytest.raises(SystemExit, match="no wheel to test"):
        main._wheel({"--require-wheel": ""})
