"""The build: one description (extension.bzl), the pinned toolchain, the wheel and what it ships.

Tests that need a built wheel use $MOK_WHEEL (tools/test_wheel.sh sets it), else the one
dist/mok-*.whl, else build one (about 20 s on 2 cores).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mok
from mok.backends.cuda import extension as _extension

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "build"))

from mok_build import archive, spec, toolchain  # noqa: E402
from mok_build import compile as compile_steps  # noqa: E402
from tool_loading import load_tool, needs  # noqa: E402

SPEC = spec.load_extension_spec(REPO)
TOOLCHAIN_PACKAGES = (
    "nvidia-cuda-nvcc",
    "nvidia-nvvm",
    "nvidia-cuda-crt",
    "nvidia-cuda-cccl",
    "nvidia-cuda-runtime",
    "pybind11",
)


def _lock_versions() -> dict[str, str]:
    text = (REPO / "requirements.lock").read_text()
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.MULTILINE)
    return {spec.normalize(name): version for name, version in pins}


# --- the one description -------------------------------------------------------------------


def test_extension_bzl_is_plain_literals():
    values = spec.read_bzl(REPO / spec.EXTENSION_BZL)
    assert values["ARCHS"] == ["sm_90a", "sm_100a", "sm_103a"]
    assert set(values["GENCODE"]) == set(values["ARCHS"])


@pytest.mark.parametrize("listing", ["EXTENSION_SOURCES", "EXTENSION_HEADERS"])
def test_extension_bzl_lists_existing_files(listing):
    files = getattr(SPEC, listing.lower())
    assert files, f"{listing} is empty"
    assert [f for f in files if not (REPO / f).is_file()] == []


def test_every_csrc_file_is_listed():
    on_disk = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "csrc").rglob("*")
        if p.suffix in {".cu", ".cpp", ".h", ".hpp", ".cuh"}
    }
    assert on_disk == set(SPEC.extension_sources) | set(SPEC.extension_headers)


def test_gencode_targets_exactly_its_own_arch():
    for arch in SPEC.archs:
        number = arch.removeprefix("sm_")
        assert SPEC.gencode[arch] == f"arch=compute_{number},code=sm_{number}"


def test_runtime_tables_match_extension_bzl():
    capabilities = {
        arch: f"{major}.{minor}" for (major, minor), arch in _extension.ARCH_BY_CAPABILITY.items()
    }
    assert capabilities == SPEC.compute_capability
    assert SPEC.module_names == _extension.MODULE_NAMES


def test_a_malformed_description_is_rejected(tmp_path):
    bzl = tmp_path / "x.bzl"
    bzl.write_text('ARCHS = ["sm_90a"]\nFLAGS = select({"//c": []})\n')
    with pytest.raises(spec.SpecError, match="FLAGS is not a literal"):
        spec.read_bzl(bzl)


# --- the pinned toolchain ------------------------------------------------------------------


def test_build_requirements_match_the_lock():
    project = spec.load_project(REPO)
    pins = spec.pinned_requirements(project.build_requires)
    assert len(pins) == len(project.build_requires), "every build requirement must be name==ver"
    lock = _lock_versions()
    assert {name: lock.get(name) for name in pins} == pins
    assert set(TOOLCHAIN_PACKAGES) <= set(pins)


def test_cuda_version_is_the_locked_nvcc():
    assert _lock_versions()["nvidia-cuda-nvcc"] == SPEC.cuda_version


def _fake_nvcc(tmp_path: Path, output: str) -> Path:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    nvcc.chmod(0o755)
    return nvcc


def test_a_different_nvcc_is_refused(tmp_path):
    nvcc = _fake_nvcc(
        tmp_path,
        "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.2, V13.2.51",
    )
    with pytest.raises(toolchain.ToolchainError, match=r"nvcc 13\.2\.51.*only with nvcc 13\.0\.88"):
        toolchain.check_nvcc(nvcc, "13.0.88")


def test_the_pinned_nvcc_is_accepted(tmp_path):
    nvcc = _fake_nvcc(tmp_path, "Cuda compilation tools, release 13.0, V13.0.88")
    assert toolchain.check_nvcc(nvcc, "13.0.88") == "13.0.88"


def test_an_nvcc_without_a_version_is_refused(tmp_path):
    with pytest.raises(toolchain.ToolchainError, match="printed no version"):
        toolchain.check_nvcc(_fake_nvcc(tmp_path, "hello"), "13.0.88")


def test_nvcc_is_searched_only_in_site_packages(tmp_path):
    with pytest.raises(toolchain.ToolchainError, match="system nvcc is deliberately never used"):
        toolchain.find_nvcc([str(tmp_path)])
    fake = tmp_path / toolchain.NVCC_RELATIVE
    fake.parent.mkdir(parents=True)
    fake.write_text("")
    assert toolchain.find_nvcc(["/nonexistent", str(tmp_path)]) == fake.resolve()


def test_a_wrong_build_requirement_version_is_refused():
    with pytest.raises(toolchain.ToolchainError, match=r"pytest==0\.0\.1 \(found"):
        toolchain.check_pins({"pytest": "0.0.1"})


def test_the_host_compiler_is_pinned(tmp_path, monkeypatch):
    compiler = tmp_path / "x86_64-linux-gnu-g++-12"
    compiler.write_text("#!/bin/sh\necho 13.3.0\n")  # only builtins: PATH is tmp_path alone
    compiler.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(toolchain.ToolchainError, match=r"GCC 13\.3\.0.*only with GCC 12\.2\.0"):
        toolchain.find_host_compiler(compiler.name, "12.2.0")
    with pytest.raises(toolchain.ToolchainError, match="g\\+\\+-12-aarch64-linux-gnu"):
        toolchain.find_host_compiler("aarch64-linux-gnu-g++-12", "12.2.0")


def test_every_target_cpu_has_a_compiler_and_a_tag():
    assert set(SPEC.host_cpus) == {"x86_64", "aarch64"}
    for cpu in SPEC.host_cpus:
        assert SPEC.host_compilers[cpu].startswith(f"{cpu}-linux-gnu-g++")
        assert SPEC.wheel_platforms[cpu].endswith(f"_{cpu}")


@pytest.mark.parametrize(("value", "expected"), [("", platform.machine()), ("aarch64", "aarch64")])
def test_target_cpu_comes_from_the_environment(value, expected):
    assert spec.target_cpu(SPEC, {"MOK_TARGET_CPU": value}) == expected
    with pytest.raises(spec.SpecError, match="choose from x86_64, aarch64"):
        spec.target_cpu(SPEC, {"MOK_TARGET_CPU": "riscv64"})


def test_a_cross_build_needs_the_target_cuda_runtime(tmp_path):
    other = "aarch64" if platform.machine() == "x86_64" else "x86_64"
    with pytest.raises(toolchain.ToolchainError, match=rf"tools/cross_cuda\.py {other}"):
        toolchain.target_cuda_lib(tmp_path, other, {})
    lib = tmp_path / "target" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart_static.a").write_bytes(b"!<arch>\n")
    found = toolchain.target_cuda_lib(
        tmp_path, other, {"MOK_CUDA_TARGET_ROOT": str(lib.parents[2])}
    )
    assert found == lib.resolve()
    assert toolchain.target_cuda_lib(tmp_path, platform.machine(), {}) == tmp_path / "lib"


def test_hidden_compiler_inputs_are_dropped():
    env = toolchain.clean_environment({"PATH": "/bin", "NVCC_APPEND_FLAGS": "-G"}, 5)
    assert env["PATH"] == "/bin" and "NVCC_APPEND_FLAGS" not in env
    assert env["SOURCE_DATE_EPOCH"] == "5"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", ("sm_90a", "sm_100a", "sm_103a")), ("sm_90a", ("sm_90a",)), ("sm_103a, sm_90a", None)],
    ids=["default-all", "one", "two"],
)
def test_mok_archs_selects_a_subset(value, expected):
    got = spec.selected_archs(SPEC, {"MOK_ARCHS": value})
    assert got == (expected or ("sm_103a", "sm_90a"))


def test_mok_archs_rejects_unknown_archs():
    with pytest.raises(spec.SpecError, match="sm_80"):
        spec.selected_archs(SPEC, {"MOK_ARCHS": "sm_90a,sm_80"})


# --- archives ------------------------------------------------------------------------------


def test_wheel_writer_is_deterministic_and_records_hashes(tmp_path):
    files = {"pkg/b.py": b"b = 1\n", "pkg/a.so": b"\x7fELF", "pkg-1.dist-info/WHEEL": b"W\n"}
    first, second = tmp_path / "1.whl", tmp_path / "2.whl"
    archive.write_wheel(first, files, "pkg-1.dist-info", 1_700_000_000)
    archive.write_wheel(second, dict(reversed(files.items())), "pkg-1.dist-info", 1_700_000_000)
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as wheel:
        names = wheel.namelist()
        assert names == ["pkg/a.so", "pkg/b.py", "pkg-1.dist-info/WHEEL", "pkg-1.dist-info/RECORD"]
        assert wheel.getinfo("pkg/a.so").external_attr >> 16 == 0o100755
        record = wheel.read("pkg-1.dist-info/RECORD").decode()
    assert "pkg/b.py,sha256=" in record and record.endswith("pkg-1.dist-info/RECORD,,\n")


def test_sources_are_compiled_from_one_fixed_path(tmp_path):
    """nvcc hashes a source's real path into internal symbol names, so every build compiles a
    copy at the same path: the listed files only, removed afterwards."""
    root = tmp_path / "checkout"
    (root / "csrc" / "sm90").mkdir(parents=True)
    (root / "csrc" / "sm90" / "a.cu").write_text("// a")
    (root / "csrc" / "b.h").write_text("// b")
    (root / "csrc" / "unlisted.cu").write_text("// not staged")
    stage = tmp_path / "stage"
    with compile_steps.staged_sources(root, ["csrc/sm90/a.cu", "csrc/b.h"], stage) as staged:
        assert staged == stage
        assert (stage / "csrc" / "sm90" / "a.cu").read_text() == "// a"
        assert (stage / "csrc" / "b.h").read_text() == "// b"
        assert not (stage / "csrc" / "unlisted.cu").exists()
    assert not stage.exists()


def test_serialized_wgmma_fails_the_build():
    serialized = (
        "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to insufficient register resources for the function 'k'"
    )
    with pytest.raises(compile_steps.CompileError, match="C7512.*serialized"):
        compile_steps.check_diagnostics(
            "sm_90a nvcc csrc/gemm/sm90/m_grouped_mxfp8_nt.cu", serialized
        )
    plain = "ptxas info    : Used 80 registers"
    compile_steps.check_diagnostics("sm_90a nvcc csrc/mxfp8/quantize.cu", plain)


def test_a_compile_step_that_prints_c7512_fails(tmp_path):
    """run_step applies the check: a compiler that succeeds but reports serialized wgmma (here
    a shell standing in for nvcc) fails the build; the same compiler quiet passes."""
    cfg = compile_steps.BuildConfig(root=tmp_path, build_dir=tmp_path, version="0", git_commit="x",
                                    jobs=1)  # fmt: skip
    progress = compile_steps.Progress(2, write=lambda line: None)

    def step(message: str) -> compile_steps.Step:
        argv = ("/bin/sh", "-c", f"echo '{message}' >&2")
        return compile_steps.Step("sm_90a nvcc fake.cu", argv, tmp_path / "fake.o")

    with pytest.raises(compile_steps.CompileError, match="C7512"):
        compile_steps.run_step(step("ptxas info    : (C7512) serialized"), cfg, progress)
    compile_steps.run_step(step("ptxas info    : Used 80 registers"), cfg, progress)


def test_source_date_epoch_has_a_fixed_default():
    assert archive.source_date_epoch({}) == archive.DEFAULT_EPOCH
    assert archive.source_date_epoch({"SOURCE_DATE_EPOCH": "42"}) == 42


# --- the built wheel -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    if os.environ.get("MOK_WHEEL"):
        return Path(os.environ["MOK_WHEEL"])
    found = sorted((REPO / "dist").glob("mok-*.whl"))
    if len(found) == 1:
        return found[0]
    out = tmp_path_factory.mktemp("wheel")
    argv = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)]
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True)
    return next(out.glob("mok-*.whl"))


def _wheel_members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as wheel:
        return {name: wheel.read(name) for name in wheel.namelist()}


def test_wheel_carries_one_module_per_arch(built_wheel):
    names = _wheel_members(built_wheel).keys()
    modules = sorted(n for n in names if n.startswith("mok/_C_") and n.endswith(".so"))
    expected = sorted(f"mok/{SPEC.module_names[arch]}" for arch in SPEC.archs)
    assert [m.split(".")[0] for m in modules] == expected


def test_wheel_name_and_tag(built_wheel):
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    cpu = next(cpu for cpu in SPEC.host_cpus if built_wheel.name.endswith(f"_{cpu}.whl"))
    tag = SPEC.wheel_platforms[cpu]
    assert built_wheel.name == f"mok-{mok.__version__}-{python}-{python}-{tag}.whl"


def test_wheel_record_matches_its_members(built_wheel):
    members = _wheel_members(built_wheel)
    record = members.pop("mok-" + mok.__version__ + ".dist-info/RECORD").decode()
    for line in record.splitlines()[:-1]:
        name, digest, size = line.split(",")
        expected = archive._record_hash(members[name])
        assert (digest, int(size)) == (expected, len(members[name])), name
    assert len(record.splitlines()) - 1 == len(members)


@needs("auditwheel")
def test_auditwheel_accepts_the_wheel_tag(built_wheel):
    check_wheel = load_tool("check_wheel")
    report = check_wheel.audit(built_wheel)
    print(f"auditwheel: {built_wheel.name} is consistent with {report['overall_tag']}")
    assert check_wheel.problems(built_wheel, report) == []


@pytest.mark.parametrize(
    ("name", "overall", "expected"),
    [
        ("mok-0.1.0-cp312-cp312-manylinux_2_34_x86_64.whl", "manylinux_2_34_x86_64", None),
        ("mok-0.1.0-cp312-cp312-manylinux_2_34_x86_64.whl", "manylinux_2_28_x86_64", None),
        ("mok-0.1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "manylinux_2_34_x86_64", "need"),
        ("mok-0.1.0-cp312-cp312-manylinux_2_34_x86_64.whl", "manylinux_2_34_aarch64", "aarch64"),
    ],
    ids=["honest", "stricter", "older-than-needed", "wrong-cpu"],
)
def test_wheel_tag_judged_by_auditwheel_report(name, overall, expected):
    found = load_tool("check_wheel").problems(Path(name), {"overall_tag": overall})
    assert (found == []) if expected is None else expected in " ".join(found)


def test_modules_embed_no_build_paths(built_wheel):
    leaks = re.compile(rb"/(work|root|home|tmp/mok-|tmp/pip-)|site-packages|\.venv|tmpxft")
    for name, data in _wheel_members(built_wheel).items():
        if name.endswith(".so"):
            assert leaks.findall(data) == [], name


def test_wheel_ships_every_licence_file(built_wheel):
    """PEP 639: each of pyproject.toml's license-files under dist-info/licenses/ at its path,
    byte for byte, and named by a License-File line of METADATA."""
    members = _wheel_members(built_wheel)
    dist_info = f"mok-{mok.__version__}.dist-info"
    paths = spec.load_project(REPO).license_files
    assert "LICENSE" in paths and "third_party/cutlass/LICENSE.txt" in paths
    for path in paths:
        assert members[f"{dist_info}/licenses/{path}"] == (REPO / path).read_bytes(), path
    headers = members[f"{dist_info}/METADATA"].decode().split("\n\n", 1)[0].splitlines()
    named = [line.removeprefix("License-File: ") for line in headers if "License-File" in line]
    assert named == list(paths)


# --- what is installed ---------------------------------------------------------------------

installed_only = pytest.mark.skipif(
    os.environ.get("MOK_EXPECT_INSTALLED") != "1",
    reason="runs against an installed wheel only (tools/test_wheel.sh sets MOK_EXPECT_INSTALLED=1)",
)


@installed_only
def test_mok_is_imported_from_the_installed_wheel():
    location = Path(mok.__file__).resolve()
    assert not location.is_relative_to(REPO / "mok"), (
        f"mok imported from the source tree: {location}"
    )


@installed_only
@pytest.mark.parametrize("arch", SPEC.archs)
def test_installed_module_reports_its_build(arch):
    assert arch in _extension.installed_archs()
    info = _extension.load_arch(arch).build_info()
    assert info["arch"] == arch and info["archs"] == (arch,)
    assert info["nvcc_version"] == SPEC.cuda_version
    assert info["version"] == mok.__version__
