"""Evaluate the repository's MODULE.bazel, BUILD.bazel and .bzl files without Bazel.

Bazel >= 7 cannot run where CI runs, so the files are evaluated with starlark-pyo3 against stubs:
every rule, macro and extension tag that pinned_rules.py knows is replaced by a recorder, and what
the files declare comes back as a list of Call records for check_starlark.py to judge. Loading a
symbol that pinned_rules.py does not list fails the evaluation, so nothing unvetted slips through.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import starlark as sl
from pinned_rules import EXTENSIONS, MODULE_FUNCTIONS, NATIVE, RULES, VALUES

SKIP_DIRS = {".git", "node_modules", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"}
# Output trees of the PEP 517 build, at the top of the repository only (tools/build is source).
ROOT_SKIP_DIRS = {"build", "dist"}
BUILD_NAMES = ("BUILD.bazel", "BUILD")
_PRELUDE_ID = "@mok_checker//:prelude.bzl"

# Starlark side of the stubs. Structs and closures must be built in Starlark: a Python function
# handed to starlark-pyo3 can be called but not returned as a value.
_PRELUDE = """
def _tag(bzl, name, tag):
    def record(**attrs):
        _record_tag(bzl, name, tag, attrs)
    return record

def use_extension(extension_bzl_file, extension_name, dev_dependency = False, isolate = False):
    tags = {t: _tag(extension_bzl_file, extension_name, t)
            for t in _extension_tags(extension_bzl_file, extension_name)}
    return struct(__extension__ = [extension_bzl_file, extension_name], **tags)

def use_repo(extension_proxy, *args, **kwargs):
    _record_use_repo(extension_proxy.__extension__, list(args), kwargs)

def select(conditions, no_match_error = ""):
    return conditions.get("//conditions:default", conditions.values()[0])

native = struct(
    alias = alias,
    config_setting = config_setting,
    exports_files = exports_files,
    filegroup = filegroup,
    glob = glob,
    package_name = package_name,
    test_suite = test_suite,
)
"""

# skylib's paths functions our macros use, as plain Starlark with the library's semantics.
_SKYLIB_PATHS = """
def _basename(p):
    return p.rpartition("/")[-1]

def _dirname(p):
    prefix, sep, _ = p.rpartition("/")
    return prefix if prefix or not sep else "/"

def _split_extension(p):
    b = _basename(p)
    last_dot = b.rfind(".")
    if last_dot <= 0:
        return (p, "")
    dot_distance_from_end = len(b) - last_dot
    return (p[:-dot_distance_from_end], p[-dot_distance_from_end:])

paths = struct(basename = _basename, dirname = _dirname, split_extension = _split_extension)
"""

_NAMES_BY_KIND = {
    "module": ("module", "bazel_dep", "use_extension", "use_repo", "register_toolchains"),
    "build": (
        "glob",
        "package",
        "exports_files",
        "filegroup",
        "alias",
        "config_setting",
        "test_suite",
        "select",
    ),
    "bzl": ("native", "select"),
}


@dataclass
class Call:
    """One rule, macro or tag invocation seen while evaluating."""

    kind: str  # "rule", "native", "module", "tag"
    key: tuple[str, ...]  # RULES / NATIVE / MODULE_FUNCTIONS / EXTENSIONS key (+ tag)
    package: str  # package whose BUILD file was being evaluated ("" = root)
    attrs: dict = field(default_factory=dict)


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Bazel glob syntax: ** spans directories, * and ? stay within one path segment."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        else:
            char = pattern[i]
            out.append({"*": "[^/]*", "?": "[^/]"}.get(char, re.escape(char)))
            i += 1
    return re.compile("".join(out) + r"\Z")


def is_package(directory: Path) -> bool:
    return any((directory / name).is_file() for name in BUILD_NAMES)


def package_files(root: Path, package: str) -> list[str]:
    """Files of a package, relative to it; subpackages (dirs with a BUILD file) are not its own."""
    base = root / package
    found: list[str] = []
    stack = [base]
    while stack:
        directory = stack.pop()
        for entry in sorted(directory.iterdir()):
            if entry.is_dir():
                if not _skipped(entry.name) and not is_package(entry):
                    stack.append(entry)
            elif entry.is_file():
                found.append(entry.relative_to(base).as_posix())
    return sorted(found)


def _skipped(name: str) -> bool:
    return name in SKIP_DIRS or name.startswith((".venv", "bazel-"))


def bazel_files(root: Path) -> list[Path]:
    """MODULE.bazel, every BUILD file and every .bzl of the repository (not vendored trees)."""
    found = []
    for directory, subdirs, files in os.walk(root):
        top = Path(directory) == root
        subdirs[:] = sorted(d for d in subdirs if not (_skipped(d) or top and d in ROOT_SKIP_DIRS))
        found += [Path(directory) / f for f in files if f in BUILD_NAMES or f.endswith(".bzl")]
    found.sort()
    if (root / "MODULE.bazel").is_file():
        found.insert(0, root / "MODULE.bazel")
    return found


class Evaluator:
    """Evaluates Bazel files with recording stubs; results accumulate in .calls and .problems."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[Call] = []
        self.problems: list[str] = []
        self.package = ""
        self.loaded_repos: set[str] = set()
        self.extension_repos: set[str] = set()
        self._bzl_cache: dict[str, sl.FrozenModule] = {}
        self._globals = sl.Globals.extended_by([sl.LibraryExtension.StructType])
        self._prelude = self._build_prelude()
        self._skylib_paths = self._eval_source("skylib/paths.bzl", _SKYLIB_PATHS, sl.Module())

    # ---- stubs bound into the prelude --------------------------------------------------------
    def _build_prelude(self) -> sl.FrozenModule:
        module = sl.Module()
        for name in NATIVE:
            module.add_callable(name, self._native_recorder(name))
        for name in MODULE_FUNCTIONS:
            module.add_callable(name, self._module_recorder(name))
        module.add_callable("glob", self._glob)
        module.add_callable("package_name", lambda: self.package)
        module.add_callable("_extension_tags", lambda bzl, name: sorted(EXTENSIONS[(bzl, name)]))
        module.add_callable("_record_tag", self._record_tag)
        module.add_callable("_record_use_repo", self._record_use_repo)
        return self._eval_source("prelude.bzl", _PRELUDE, module)

    def _native_recorder(self, name: str):
        def record(*args, **attrs):
            if args and name == "exports_files":
                attrs = {"srcs": args[0], **attrs}
            self.calls.append(Call("native", (name,), self.package, attrs))

        return record

    def _module_recorder(self, name: str):
        def record(*args, **attrs):
            if name == "register_toolchains":
                attrs = {"toolchains": list(args), **attrs}
            self.calls.append(Call("module", (name,), "", attrs))

        return record

    def _record_tag(self, bzl: str, name: str, tag: str, attrs: dict) -> None:
        if (bzl, name) not in EXTENSIONS:
            self.problems.append(f"MODULE.bazel: extension {name} of {bzl} is not in pinned_rules")
        self.calls.append(Call("tag", (bzl, name, tag), "", attrs))

    def _record_use_repo(self, extension: list, names: list, renames: dict) -> None:
        self.extension_repos |= set(names) | set(renames)

    def _rule_recorder(self, key: tuple[str, str]):
        def record(**attrs):
            self.calls.append(Call("rule", key, self.package, attrs))

        return record

    def _glob(self, include, exclude=(), exclude_directories=1, allow_empty=False) -> list[str]:
        files = package_files(self.root, self.package) if include else []
        keep = [glob_to_regex(p) for p in include]
        drop = [glob_to_regex(p) for p in exclude]
        hits = [
            f for f in files if any(k.match(f) for k in keep) and not any(d.match(f) for d in drop)
        ]
        if not hits and not allow_empty:
            # Bazel 8 defaults to --incompatible_disallow_empty_glob.
            raise ValueError(f"glob({list(include)}) in //{self.package} matches nothing")
        return hits

    # ---- loading -----------------------------------------------------------------------------
    def _eval_source(self, name: str, source: str, module: sl.Module) -> sl.FrozenModule:
        ast = sl.parse(name, source, sl.Dialect.extended())
        sl.eval(module, ast, self._globals, sl.FileLoader(self._load))
        return module.freeze()

    def _stub_module(self, label: str) -> sl.FrozenModule:
        if label == _PRELUDE_ID:
            return self._prelude
        self.loaded_repos.add(label[1:].split("//")[0])
        if label == "@bazel_skylib//lib:paths.bzl":
            return self._skylib_paths
        module = sl.Module()
        symbols = [key[1] for key in RULES if key[0] == label]
        if not symbols and not any(key[0] == label for key in VALUES):
            raise ValueError(f"load of {label}: not a file pinned_rules.py knows")
        for symbol in symbols:
            module.add_callable(symbol, self._rule_recorder((label, symbol)))
        return module.freeze()

    def _load(self, label: str) -> sl.FrozenModule:
        if label.startswith("@"):
            return self._stub_module(label)
        path = label_to_path(label, self.package)
        if path not in self._bzl_cache:
            self._bzl_cache[path] = self._eval_file(path, "bzl")
        return self._bzl_cache[path]

    def _eval_file(self, relpath: str, kind: str) -> sl.FrozenModule:
        source = (self.root / relpath).read_text()
        names = ", ".join(f'"{n}"' for n in _NAMES_BY_KIND[kind])
        # Same line, so every line number in an error still points at the real file.
        header = f'load("{_PRELUDE_ID}", {names}); '
        return self._eval_source(relpath, header + source, sl.Module())

    # ---- public ------------------------------------------------------------------------------
    def evaluate(self, path: Path) -> None:
        """Evaluate one file; a failure becomes a problem instead of an exception."""
        relpath = path.relative_to(self.root).as_posix()
        kind = "module" if path.name == "MODULE.bazel" else "build"
        if path.suffix == ".bzl":
            kind = "bzl"
        directory = path.parent.relative_to(self.root).as_posix()
        self.package = "" if directory == "." else directory
        try:
            if kind == "bzl":
                self._load(f"//{self.package}:{path.name}")
            else:
                self._eval_file(relpath, kind)
        except (sl.StarlarkError, ValueError, OSError) as error:
            self.problems.append(f"{relpath}: does not evaluate: {error}")


def label_to_path(label: str, package: str) -> str:
    """Repository-relative path of a main-repository file label, relative to `package`."""
    if label.startswith("//"):
        pkg, _, name = label[2:].partition(":")
        return f"{pkg}/{name}" if pkg else name
    name = label[1:] if label.startswith(":") else label
    return f"{package}/{name}" if package else name


def evaluate_repository(root: Path) -> Evaluator:
    """Evaluate MODULE.bazel, every BUILD file and every .bzl under `root`."""
    evaluator = Evaluator(root)
    for path in bazel_files(root):
        evaluator.evaluate(path)
    return evaluator
