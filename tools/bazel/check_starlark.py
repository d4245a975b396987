"""Static checks of the Bazel files, for machines where Bazel >= 7 cannot run.

    python tools/bazel/check_starlark.py [REPO_ROOT]

Prints one line per problem and exits 1 when there is any. It evaluates every MODULE.bazel /
BUILD.bazel / .bzl with stubbed rules (starlark_eval.py), then checks what Bazel itself would not
see, or would see only on a GPU runner:
  - every tests/**/test_*.py has a py_test named after it,
  - every source named in tools/build/extension.bzl (and every csrc/ source) is compiled for every
    architecture, each module carrying only its own architecture,
  - versions agree: Python, CUDA and pybind11 vs requirements.lock and extension.bzl, the wheel's
    metadata vs pyproject.toml,
  - every .bazelrc config is a `common:` one (build, cquery and test all accept it), and every
    tier's tag filter selects at least one test (an empty tier makes `bazel test` exit 4).
Attribute names, labels and repositories are left to `bazel build --nobuild` (ci.yml), which
knows them exactly.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from pinned_rules import CUDA_COMPONENTS, CUDA_REDIST_COMPONENTS
from starlark_eval import Call, Evaluator, evaluate_repository, label_to_path

PY_TEST = ("@rules_python//python:py_test.bzl", "py_test")
PY_WHEEL = ("@rules_python//python:packaging.bzl", "py_wheel")
CUDA_LIBRARY = ("@rules_cuda//cuda:defs.bzl", "cuda_library")
PYBIND_EXTENSION = ("@pybind11_bazel//:build_defs.bzl", "pybind_extension")
PIP = ("@rules_python//python/extensions:pip.bzl", "pip")
PYTHON = ("@rules_python//python/extensions:python.bzl", "python")
CUDA = ("@rules_cuda//cuda:extensions.bzl", "toolchain")


def read_extension(root: Path) -> dict:
    """tools/build/extension.bzl is plain literal assignments: read them as Python literals."""
    tree = ast.parse((root / "tools/build/extension.bzl").read_text())
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }


def read_lock(root: Path) -> dict[str, str]:
    """name -> pinned version of requirements.lock (pip format, one `name==version` per entry)."""
    pins = re.findall(
        r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)",
        (root / "requirements.lock").read_text(),
        re.M,
    )
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


def _split_label(label: str, package: str) -> tuple[str, str]:
    if label.startswith("//"):
        pkg, sep, name = label[2:].partition(":")
        return pkg, name if sep else pkg.rsplit("/", 1)[-1]
    return package, label.lstrip(":")


def check_tests(root: Path, calls: list[Call]) -> list[str]:
    """Each tests/**/test_*.py is run by exactly one target named after it (its one-process run);
    GPU files may have more (<name>_multi_gpu, <name>_nvl72)."""
    owners: dict[str, list[str]] = {}
    for call in calls:
        if call.key != PY_TEST:
            continue
        for src in call.attrs.get("srcs", []):
            if not src.startswith("//"):
                package, name = _split_label(src, call.package)
                owners.setdefault(f"{package}/{name}", []).append(call.attrs.get("name", ""))
    problems = []
    for path in sorted(root.glob("tests/**/test_*.py")):
        rel = path.relative_to(root).as_posix()
        names = owners.get(rel, [])
        if names.count(path.stem) != 1:
            want = f"want one named {path.stem}"
            problems.append(f"{rel}: {len(names)} py_test targets run it ({want})")
    return problems


def check_extension(root: Path, calls: list[Call], extension: dict) -> list[str]:
    """Every listed (and every csrc/) source is compiled into every arch's module, for that arch."""
    sources = set(extension["EXTENSION_SOURCES"])
    problems = [
        f"{s}: listed in extension.bzl but missing"
        for s in sorted(sources)
        if not (root / s).is_file()
    ]
    on_disk = {
        p.relative_to(root).as_posix()
        for ext in ("*.cu", "*.cpp")
        for p in root.glob(f"csrc/**/{ext}")
    }
    problems += [f"{s}: a csrc source not in EXTENSION_SOURCES" for s in sorted(on_disk - sources)]
    rules = {
        (c.package, c.attrs.get("name")): c
        for c in calls
        if c.key in (CUDA_LIBRARY, PYBIND_EXTENSION)
    }
    for arch in extension["ARCHS"]:
        module = extension["MODULE_NAMES"][arch]
        found = [
            c for (pkg, name), c in rules.items() if name == module and c.key == PYBIND_EXTENSION
        ]
        if len(found) != 1:
            problems.append(f"{arch}: want one pybind_extension {module}, found {len(found)}")
            continue
        objects = [
            rules.get(_split_label(d, found[0].package)) for d in found[0].attrs.get("deps", [])
        ]
        objects = [o for o in objects if o is not None]
        built = {label_to_path(s, o.package) for o in objects for s in o.attrs.get("srcs", [])}
        problems += [f"{arch}: {s} is not compiled into {module}" for s in sorted(sources - built)]
        code = dict(item.split("=") for item in extension["GENCODE"][arch].split(","))
        for obj in objects:
            if obj.attrs.get("archs") != [f"{code['arch']}:{code['code']}"]:
                problems.append(
                    f"{obj.attrs['name']}: archs {obj.attrs.get('archs')} is not {arch} alone"
                )
    return problems


def _tags(calls: list[Call], key: tuple[str, str], tag: str) -> list[dict]:
    return [c.attrs for c in calls if c.kind == "tag" and c.key == (*key, tag)]


def check_versions(
    root: Path, calls: list[Call], extension: dict, lock: dict[str, str]
) -> list[str]:
    deps = {c.attrs["name"]: c.attrs.get("version") for c in calls if c.key == ("bazel_dep",)}
    problems = []
    bindings = deps.get("pybind11_bazel", "").split(".bzl.")[0]
    if lock.get("pybind11") != bindings:
        problems.append(
            f"pybind11 {lock.get('pybind11')} in the lock, {bindings} from pybind11_bazel"
        )
    problems += _check_python(root, calls)
    problems += _check_cuda(calls, extension, lock)
    problems += _check_wheel(root, calls, extension)
    return problems


def _check_python(root: Path, calls: list[Call]) -> list[str]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    want = project["requires-python"].removeprefix(">=")
    problems = []
    for attrs in _tags(calls, PYTHON, "toolchain") + _tags(calls, PIP, "parse"):
        if attrs.get("python_version") != want:
            problems.append(
                f"MODULE.bazel: python_version {attrs.get('python_version')}, pyproject {want}"
            )
    for attrs in _tags(calls, PIP, "parse"):
        locks = list(attrs.get("requirements_by_platform", {})) or [attrs.get("requirements_lock")]
        if locks != ["//:requirements.lock"]:
            problems.append("MODULE.bazel: pip.parse must read //:requirements.lock, the one lock")
    return problems


def _check_cuda(calls: list[Call], extension: dict, lock: dict[str, str]) -> list[str]:
    problems = []
    redists = _tags(calls, CUDA, "redist_json")
    if len(redists) != 1 or not re.fullmatch(r"[0-9a-f]{64}", redists[0].get("sha256", "")):
        return ["MODULE.bazel: exactly one cuda.redist_json, pinned by sha256, is required"]
    redist = redists[0]
    components = CUDA_REDIST_COMPONENTS.get(redist.get("version"), {})
    nvcc = components.get("cuda_nvcc")
    if nvcc != extension["CUDA_VERSION"] or nvcc != lock.get("nvidia-cuda-nvcc"):
        problems.append(
            f"CUDA redist {redist.get('version')} has nvcc {nvcc}; extension.bzl says "
            f"{extension['CUDA_VERSION']}, the lock nvidia-cuda-nvcc {lock.get('nvidia-cuda-nvcc')}"
        )
    unknown = set(redist.get("components", [])) - CUDA_COMPONENTS
    if unknown or not redist.get("components"):
        problems.append(
            f"MODULE.bazel: redist components must be a subset of rules_cuda's: {unknown}"
        )
    return problems


def _check_wheel(root: Path, calls: list[Call], extension: dict) -> list[str]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wheels = [c.attrs for c in calls if c.key == PY_WHEEL]
    if len(wheels) != 1:
        return [f"want exactly one py_wheel, found {len(wheels)}"]
    wheel, problems = wheels[0], []
    expected = {
        "distribution": project["name"],
        "version": project["version"],
        "requires": project.get("dependencies", []),
        "python_requires": project["requires-python"],
        "stamp": 0,
        "platform": extension["WHEEL_PLATFORMS"]["x86_64"],
        "python_tag": "cp" + project["requires-python"].removeprefix(">=").replace(".", ""),
    }
    for attr, want in expected.items():
        if wheel.get(attr) != want:
            problems.append(f"py_wheel {attr} = {wheel.get(attr)!r}, pyproject.toml gives {want!r}")
    return problems


# The tiers CI and the GPU runners select with --config (README, .github/workflows/gpu.yml).
TIERS = ("cpu", "gpu", "multi_gpu", "nvl72")
# Commands whose options `bazel build`, `bazel cquery` and `bazel test` all read.
_SHARED = "common"


def bazelrc_lines(root: Path) -> list[tuple[str, str | None, list[str]]]:
    """(command, config or None, options) for every option line of .bazelrc, in order."""
    lines = []
    for raw in (root / ".bazelrc").read_text().splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] in ("import", "try-import"):
            continue
        command, _, config = words[0].partition(":")
        lines.append((command, config or None, words[1:]))
    return lines


def config_options(root: Path, config: str, command: str = "test") -> list[str]:
    """The options `bazel <command> --config=<config>` gets from .bazelrc, --config expanded."""
    lines = bazelrc_lines(root)
    if not any(c == config for _, c, _ in lines):
        raise KeyError(f".bazelrc defines no config {config}")
    options: list[str] = []
    for cmd, cfg, words in lines:
        if cfg == config and cmd in (_SHARED, "build", command):
            for word in words:
                if word.startswith("--config="):
                    options += config_options(root, word.split("=", 1)[1], command)
                else:
                    options.append(word)
    return options


def tag_filter(options: list[str]) -> tuple[set[str], set[str]]:
    """(required-any, excluded) tags of the last --test_tag_filters, as Bazel reads it."""
    value = ""
    for option in options:
        if option.startswith("--test_tag_filters="):
            value = option.split("=", 1)[1]
    tags = [t for t in value.split(",") if t]
    return {t for t in tags if not t.startswith("-")}, {t[1:] for t in tags if t.startswith("-")}


def tier_targets(root: Path, calls: list[Call], config: str) -> list[str]:
    """The py_test labels `bazel test --config=<config> //tests/...` runs: a target runs when it
    has one of the filter's positive tags (if it names any) and none of its negative ones;
    `manual` targets are never matched by //tests/..."""
    wanted, excluded = tag_filter(config_options(root, config))
    found = []
    for call in calls:
        if call.key != PY_TEST or not call.package.startswith("tests"):
            continue
        tags = set(call.attrs.get("tags", []))
        if "manual" in tags or tags & excluded or (wanted and not tags & wanted):
            continue
        found.append(f"//{call.package}:{call.attrs['name']}")
    return sorted(found)


def check_tiers(root: Path, calls: list[Call]) -> list[str]:
    """Every tier selects at least one test (an empty one makes `bazel test` exit 4)."""
    problems = []
    for config in TIERS:
        try:
            targets = tier_targets(root, calls, config)
        except KeyError as error:
            problems.append(str(error))
            continue
        if not targets:
            problems.append(f".bazelrc: --config={config} selects no test target")
    return problems


def check_bazelrc(root: Path) -> list[str]:
    problems = []
    version = (root / ".bazelversion").read_text().strip()
    if not re.fullmatch(r"8\.\d+\.\d+", version):
        problems.append(f".bazelversion {version!r} is not a Bazel 8 release")
    for command, config, words in bazelrc_lines(root):
        if config and command != _SHARED:
            problems.append(
                f".bazelrc: {command}:{config} {' '.join(words)}: a config must be `common:` so "
                "that build and cquery accept it as test does"
            )
    rc = (root / ".bazelrc").read_text()
    if re.search(r"^\S+\s+--stamp\b", rc, re.M) or "--nostamp" not in rc:
        problems.append(".bazelrc: builds must not stamp (--nostamp)")
    return problems


def run_checks(root: Path) -> list[str]:
    """Every problem found under `root`, one line each; empty when all is well."""
    evaluator: Evaluator = evaluate_repository(root)
    calls, extension, lock = evaluator.calls, read_extension(root), read_lock(root)
    return [
        *evaluator.problems,
        *check_tests(root, calls),
        *check_extension(root, calls, extension),
        *check_versions(root, calls, extension, lock),
        *check_bazelrc(root),
        *check_tiers(root, calls),
    ]


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[2]).resolve()
    problems = run_checks(root)
    for problem in problems:
        print(problem)
    calls = evaluate_repository(root).calls
    for config in TIERS:
        if not any(config in p for p in problems):
            print(f"--config={config}: {len(tier_targets(root, calls, config))} test targets")
    print(f"{len(problems)} problem(s) in the Bazel files under {root}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
