"""flake.nix and flake.lock, checked without nixpkgs (which cannot be fetched where CI runs).

With Nix installed (Debian's nix-bin) the flake is parsed by nix-instantiate and its outputs are
evaluated against a stub nixpkgs, which shows the flake's own version assertions pass for the
versions the repository pins and fail for others. Without Nix a structural check stands in.
Either way its CUDA, Python and Bazel versions are compared with extension.bzl, pyproject.toml
and .bazelversion, and flake.lock must pin nixpkgs by rev and narHash.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAKE = (ROOT / "flake.nix").read_text()
NIX = shutil.which("nix-instantiate")
# Parsing and pure evaluation need no store daemon; an empty build-users-group stops Nix asking
# for the nixbld group that a daemon-less Debian install does not create.
NIX_ENV = {**os.environ, "NIX_CONFIG": "build-users-group =", "NIX_REMOTE": ""}
needs_nix = pytest.mark.skipif(
    NIX is None,
    reason="nix-instantiate not installed (apt-get install nix-bin): structural check only",
)


def _extension() -> dict:
    tree = ast.parse((ROOT / "tools/build/extension.bzl").read_text())
    return {
        n.targets[0].id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
    }


def _python_version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["requires-python"].removeprefix(">=")


def _bazel_version() -> str:
    return (ROOT / ".bazelversion").read_text().strip()


@needs_nix
def test_flake_parses_with_nix():
    result = subprocess.run(
        [NIX, "--parse", str(ROOT / "flake.nix")], capture_output=True, text=True, env=NIX_ENV
    )
    assert result.returncode == 0, result.stderr


def test_flake_structure():
    # Balanced brackets outside strings and comments, and the outputs a contributor relies on.
    code = re.sub(r"#[^\n]*|''(?:[^']|'(?!'))*''|\"(?:[^\"\\\\]|\\\\.)*\"", "", FLAKE)
    for pair in ("{}", "[]", "()"):
        assert code.count(pair[0]) == code.count(pair[1]), f"unbalanced {pair}"
    for needle in (
        "inputs.nixpkgs.url",
        "outputs",
        "devShells =",
        "packages =",
        "checks =",
        "mkShell",
    ):
        assert needle in FLAKE
    assert '"x86_64-linux"' in FLAKE and '"aarch64-linux"' in FLAKE


def test_flake_versions_match_the_repository():
    major, minor, _ = _extension()["CUDA_VERSION"].split(".")
    py_major, py_minor = _python_version().split(".")
    expected = [
        f"pkgs.cudaPackages_{major}_{minor}",
        f"pkgs.python{py_major}{py_minor}",
        f"pkgs.bazel_{_bazel_version().split('.')[0]}",
        "pkgs.ruff",
        "pkgs.uv",
        "pkgs.bazel-buildtools",
    ]
    assert [e for e in expected if e not in FLAKE] == []


def test_flake_lock_pins_nixpkgs_by_rev_and_nar_hash():
    lock = json.loads((ROOT / "flake.lock").read_text())
    node = lock["nodes"][lock["nodes"]["root"]["inputs"]["nixpkgs"]]
    locked, original = node["locked"], node["original"]
    assert (locked["type"], locked["owner"], locked["repo"]) == ("github", "NixOS", "nixpkgs")
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"])
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked["narHash"])
    url = re.search(r'inputs\.nixpkgs\.url = "github:([^/]+)/([^/]+)/([^"]+)"', FLAKE)
    assert url and (original["owner"], original["repo"], original["ref"]) == url.groups()


# A stand-in for nixpkgs: just the attributes flake.nix uses, at versions the test chooses, and
# the few lib functions it calls, written with the meaning nixpkgs' lib gives them.
STUB_NIXPKGS = """
{ system, config ? { } }:
let
  v = builtins.fromJSON (builtins.readFile ./versions.json);
  pkg = pname: version: { inherit pname version; outPath = "/nix/store/stub-" + pname; };
  drv = args: args // { outPath = "/nix/store/stub-" + args.pname; };
  removePrefix = p: s:
    let n = builtins.stringLength p; in
    if builtins.substring 0 n s == p then builtins.substring n (builtins.stringLength s) s else s;
  lib = {
    inherit removePrefix;
    assertMsg = pred: msg: pred || builtins.throw msg;
    attrValues = set: map (name: set.${name}) (builtins.attrNames set);
    concatMapStrings = f: list: builtins.concatStringsSep "" (map f list);
    makeLibraryPath = list: builtins.concatStringsSep ":" (map (p: "${p}/lib") list);
    cleanSource = src: src;
    versions.majorMinor = s: let p = builtins.splitVersion s; in
      builtins.elemAt p 0 + "." + builtins.elemAt p 1;
  };
  cc = pkg "gcc" "14";
in {
  inherit lib;
  mkShell = args: args;
  stdenv = { mkDerivation = drv; cc = { cc = { lib = pkg "gcc-lib" "14"; }; }; };
  stdenvNoCC = { mkDerivation = drv; };
  fetchurl = { url, sha256 }: "/nix/store/" + sha256 + "-" + baseNameOf url;
  cudaPackages_13_0 = {
    cuda_nvcc = pkg "cuda_nvcc" v.nvcc;
    backendStdenv = { inherit cc; };
  };
  python312 = pkg "python3" v.python;
  bazel_8 = pkg "bazel" v.bazel;
  bazel-buildtools = pkg "bazel-buildtools" "8.2.1";
  ruff = pkg "ruff" "0";
  uv = pkg "uv" "0";
  nodejs = pkg "nodejs" "0";
  diffoscope = pkg "diffoscope" "0";
  unzip = pkg "unzip" "0";
  zlib = pkg "zlib" "0";
  autoPatchelfHook = pkg "auto-patchelf-hook" "0";
}
"""


def _evaluate_with_stub(
    tmp_path: Path, versions: dict, what: str = "shell"
) -> subprocess.CompletedProcess:
    stub = tmp_path / "nixpkgs"
    stub.mkdir(exist_ok=True)
    (stub / "default.nix").write_text(STUB_NIXPKGS)
    (stub / "versions.json").write_text(json.dumps(versions))
    results = {
        # The dev shell's packages per system.
        "shell": "builtins.mapAttrs (s: v: map (p: p.pname) v.default.packages) outputs.devShells",
        # Every output's names, and the wheel build's environment on aarch64.
        "outputs": "{ packages = builtins.mapAttrs (s: v: builtins.attrNames v) outputs.packages;"
        " checks = builtins.mapAttrs (s: v: builtins.attrNames v) outputs.checks;"
        " wheel = { inherit (outputs.packages.aarch64-linux.wheel) MOK_HOST_CXX buildPhase; }; }",
    }
    expr = (
        f"let flake = import {ROOT / 'flake.nix'};"
        f" outputs = flake.outputs {{ self = {{ }}; nixpkgs = {stub}; }};"
        f" in {results[what]}"
    )
    return subprocess.run(
        [NIX, "--eval", "--strict", "--json", "--expr", expr],
        capture_output=True,
        text=True,
        env=NIX_ENV,
    )


def _pinned_versions() -> dict:
    return {
        "nvcc": _extension()["CUDA_VERSION"],
        "python": _python_version() + ".11",
        "bazel": _bazel_version(),
    }


@needs_nix
def test_flake_evaluates_for_the_pinned_versions(tmp_path):
    result = _evaluate_with_stub(tmp_path, _pinned_versions())
    assert result.returncode == 0, result.stderr
    shells = json.loads(result.stdout)
    assert set(shells) == {"x86_64-linux", "aarch64-linux"}
    for packages in shells.values():
        assert {"bazel", "cuda_nvcc", "python3", "ruff", "uv", "bazel-buildtools"} <= set(packages)


@needs_nix
def test_flake_has_a_wheel_and_checks_for_both_systems(tmp_path):
    result = _evaluate_with_stub(tmp_path, _pinned_versions(), "outputs")
    assert result.returncode == 0, result.stderr
    outputs = json.loads(result.stdout)
    for system in ("x86_64-linux", "aarch64-linux"):
        assert outputs["packages"][system] == ["default", "wheel"]
        assert outputs["checks"][system] == ["cpu-tests"]
    assert "python -m build --wheel --no-isolation" in outputs["wheel"]["buildPhase"]
    assert outputs["wheel"]["MOK_HOST_CXX"].endswith("/bin/c++")


@needs_nix
@pytest.mark.parametrize(
    ("field", "wrong", "message"),
    [
        ("nvcc", "13.0.48", "tools/build/extension.bzl pins"),
        ("python", "3.13.1", "pyproject.toml requires"),
        ("bazel", "8.6.0", ".bazelversion says"),
    ],
)
def test_flake_refuses_other_versions(tmp_path, field, wrong, message):
    result = _evaluate_with_stub(tmp_path, {**_pinned_versions(), field: wrong})
    assert result.returncode != 0 and message in result.stderr, result.stderr


# ---- nix/wheels.nix: generated from the lock, and agreeing with it ----------------------------

WHEEL_LINE = re.compile(
    r'^\s*"(?P<name>[^"]+)" = \{ version = "(?P<version>[^"]+)"; url = "(?P<url>[^"]+)"; '
    r'sha256 = "(?P<sha256>[0-9a-f]{64})"; \};$'
)


def _nix_wheels() -> dict[str, dict[str, dict[str, str]]]:
    systems: dict[str, dict[str, dict[str, str]]] = {}
    current = None
    for line in (ROOT / "nix/wheels.nix").read_text().splitlines():
        if match := re.match(r'^  "([\w-]+)" = \{$', line):
            current = systems.setdefault(match[1], {})
        elif match := WHEEL_LINE.match(line):
            current[match["name"]] = match.groupdict()
    return systems


def _lock_hashes() -> dict[str, tuple[str, set[str]]]:
    """name -> (version, every hash the lock allows), for the entries Nix should fetch."""
    text = (ROOT / "requirements.lock").read_text()
    found = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)(?: ; ([^\\\n]+))?", block)
        if not match or (match[3] and "sys_platform == 'linux'" not in match[3]):
            continue
        name = re.sub(r"[-_.]+", "-", match[1]).lower()
        found[name] = (match[2], set(re.findall(r"--hash=sha256:([0-9a-f]{64})", block)))
    return found


def test_nix_wheels_agree_with_the_lock():
    """Every wheel Nix fetches is a file the lock pins, by version and by one of its hashes, and
    every Linux entry of the lock is fetched (diffoscope, an sdist, comes from nixpkgs)."""
    lock = _lock_hashes()
    systems = _nix_wheels()
    assert set(systems) == {"x86_64-linux", "aarch64-linux"}
    for system, wheels in systems.items():
        assert set(wheels) == set(lock) - {"diffoscope"}, system
        for name, wheel in wheels.items():
            version, hashes = lock[name]
            assert wheel["version"] == version, (system, name)
            assert wheel["sha256"] in hashes, (system, name)
            assert wheel["url"].endswith(".whl"), (system, name)
        cpu = system.split("-")[0]
        assert wheels["torch"]["url"].endswith(f"_{cpu}.whl")
        assert wheels["nvidia-cuda-nvcc"]["url"].endswith(f"_{cpu}.whl")
    assert "--hash" in (ROOT / "requirements.lock").read_text()


def test_flake_reads_the_generated_wheels():
    assert "import ./nix/wheels.nix" in FLAKE
    assert "fetchurl { inherit (wheel) url sha256; }" in FLAKE


@needs_nix
def test_nix_wheels_evaluate():
    result = subprocess.run(
        [NIX, "--eval", "--strict", "--json", str(ROOT / "nix/wheels.nix")],
        capture_output=True,
        text=True,
        env=NIX_ENV,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout).keys() == {"x86_64-linux", "aarch64-linux"}
