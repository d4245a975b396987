"""The GitHub workflows and the update bot's configuration: pinned, and running what the issue asks.

Plain text checks (the lock carries no YAML parser): every action is pinned by commit, CI calls
the Makefile's targets and Bazel's CPU tier, the GPU workflow stays off pull requests, releases
ship SHA256SUMS, and Renovate covers every pinned file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _workflow(name: str) -> str:
    return (WORKFLOWS / name).read_text()


@pytest.mark.parametrize("name", ["ci.yml", "gpu.yml", "gpu-tests.yml", "release.yml"])
def test_actions_pinned_by_commit(name):
    uses = re.findall(r"uses:\s*(\S+)(.*)", _workflow(name))
    assert uses
    for action, comment in uses:
        if action.startswith("./.github/workflows/"):
            continue  # this repository's own reusable workflow, at the same commit
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), action
        assert re.search(r"#\s*v?\d+\.\d+\.\d+", comment), f"{action}: name the release it pins"


@pytest.mark.parametrize(
    ("name", "commands"),
    [
        (
            "ci.yml",
            [
                "make lint",
                "make test",
                "make repro",
                "make repro-aarch64",
                "bazel build --nobuild //...",
                "bazel run //:buildifier.check",
                "bazel test --config=cpu",
            ],
        ),
        (
            "gpu.yml",
            [
                "bazel test --config=${{ matrix.config }} //tests/...",
                "self-hosted",
                "uses: ./.github/workflows/gpu-tests.yml",
            ],
        ),
        (
            "gpu-tests.yml",
            ["--config=release_wheel", "MOK_WHEEL_SHA256=", "bazel test --config=nvl72"],
        ),
        (
            "release.yml",
            [
                "make repro",
                "make repro-aarch64",
                "tools/test_wheel.sh",
                "sha256sum -c SHA256SUMS",
                "uses: ./.github/workflows/gpu-tests.yml",
                "needs: [build, gpu]",
            ],
        ),
    ],
)
def test_workflows_run_the_documented_commands(name, commands):
    text = _workflow(name)
    assert [c for c in commands if c not in text] == []


def test_self_hosted_runners_never_run_pull_requests():
    for name in ("gpu.yml", "gpu-tests.yml", "release.yml"):
        assert "pull_request" not in _workflow(name), name


def test_release_publishes_only_what_the_gpu_runners_tested():
    """Tested then shipped, by SHA-256: each GPU runner reports the sha256sum line of the wheel it
    tested (checked by the test runner against MOK_WHEEL_SHA256), and publish refuses a wheel
    whose line no runner reported, and a reported line that SHA256SUMS does not hold."""
    tests, release = _workflow("gpu-tests.yml"), _workflow("release.yml")
    assert tests.count('sha256sum "$wheel" | sed') == 2  # host runners and NVL72 trays
    assert tests.count("name: tested-") == 2
    publish = release.split("\n  publish:\n", 1)[1]
    assert "pattern: tested-*" in publish
    assert 'grep -qxF "$(sha256sum "$wheel")" ../tested/tested-*' in publish
    assert 'grep -qxF "$(cat "$line_file")" SHA256SUMS' in publish
    assert "make" not in publish and "bazel" not in publish  # nothing is rebuilt before upload


def test_renovate_covers_every_pinned_file():
    config = json.loads((ROOT / ".github" / "renovate.json").read_text())
    assert config["nix"]["enabled"] is True  # Renovate leaves flake.lock alone unless asked
    assert any("requirements\\.lock" in p for p in config["pip-compile"]["managerFilePatterns"])
    assert any("requirements\\.in" in p for p in config["pip_requirements"]["managerFilePatterns"])
    disabled = {
        m
        for rule in config["packageRules"]
        if rule.get("enabled") is False
        for m in rule.get("matchManagers", [])
        if not rule.get("matchPackageNames")
    }
    assert not disabled & {"bazel-module", "bazelisk", "github-actions", "npm", "nix"}


# Renovate's pip-compile manager (lib/modules/manager/pip-compile/common.ts, as of 2026-08): the
# command is read from the lock's header with this expression, then every option is checked
# against its list for `uv`; options that take a value must be written `--option=value`.
RENOVATE_HEADER = re.compile(r"^(#.*?\r?\n)+# {4}(?P<command>\S*)(?P<arguments> .*?)?\r?\n")
RENOVATE_UV_OPTIONS_WITH_VALUES = {
    "--constraints", "--constraint", "--python-version", "--no-emit-package", "--prerelease",
    "--format", "--resolution", "--fork-strategy", "--exclude-newer", "--exclude-newer-package",
    "--group", "--override", "--overrides", "--output-file", "--extra", "--extra-index-url",
}  # fmt: skip
RENOVATE_UV_FLAGS = {
    "--no-strip-extras", "--universal", "-v", "--generate-hashes", "--emit-index-url",
    "--index-url", "--all-extras",
}  # fmt: skip


def renovate_header_problems(lock_text: str, file_name: str) -> list[str]:
    """What Renovate's pip-compile manager would reject in this lock's header."""
    match = RENOVATE_HEADER.match(lock_text)
    if match is None:
        return ["no header Renovate can read (was --no-header passed?)"]
    argv = match["arguments"].split() if match["arguments"] else []
    if match["command"] != "uv" or argv[:2] != ["pip", "compile"]:
        return [f"header command {match['command']} {' '.join(argv[:2])} is not uv pip compile"]
    problems, sources, output = [], [], None
    for arg in argv[2:]:
        option, has_value, value = arg.partition("=")
        if not arg.startswith("-"):
            sources.append(arg)
        elif option in RENOVATE_UV_OPTIONS_WITH_VALUES and has_value:
            output = value if option == "--output-file" else output
        elif arg not in RENOVATE_UV_FLAGS:
            problems.append(f"Renovate rejects {arg}")
    if not sources:
        problems.append("no source file named in the header")
    if output != file_name:
        problems.append(f"--output-file={output}, not {file_name}")
    return problems


def test_lock_header_is_one_renovate_can_rerun():
    assert (
        renovate_header_problems((ROOT / "requirements.lock").read_text(), "requirements.lock")
        == []
    )


def test_lock_header_check_rejects_what_renovate_rejects():
    good = (ROOT / "requirements.lock").read_text()
    assert renovate_header_problems(good.split("\n", 2)[2], "requirements.lock")  # no header
    bad = good.replace("--universal", "--python-platform=linux", 1)
    assert renovate_header_problems(bad, "requirements.lock") == [
        "Renovate rejects --python-platform=linux"
    ]


def test_make_lock_writes_the_header_command():
    """`make lock` runs the command the header records, so Renovate's refresh equals it."""
    header = (ROOT / "requirements.lock").read_text().splitlines()[1].split(None, 1)[1]
    recipe = (ROOT / "Makefile").read_text().split("\nlock: env\n", 1)[1].split("\n\n", 1)[0]
    first = recipe.replace("\\\n", " ").splitlines()[0]  # then nix/wheels.nix is regenerated
    command = " ".join(first.split()).replace(" --quiet", "")
    assert command.endswith(header.removeprefix("uv "))


def test_lock_covers_x86_64_and_aarch64():
    """Universal: the packages only Linux needs are kept by marker, not dropped by a platform."""
    text = (ROOT / "requirements.lock").read_text()
    assert "--universal" in text.splitlines()[1]
    assert re.search(r"^triton==\S+ ; sys_platform == 'linux'", text, re.M)
