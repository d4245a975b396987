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


@pytest.mark.parametrize("name", ["ci.yml", "gpu.yml", "release.yml"])
def test_actions_pinned_by_commit(name):
    uses = re.findall(r"uses:\s*(\S+)(.*)", _workflow(name))
    assert uses
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), action
        assert re.search(r"#\s*v?\d+\.\d+\.\d+", comment), f"{action}: name the release it pins"


@pytest.mark.parametrize(
    ("name", "commands"),
    [
        (
            "ci.yml",
            ["make lint", "make test", "make wheel", "make repro", "bazel test --config=cpu"],
        ),
        ("gpu.yml", ["bazel test --config=${{ matrix.config }} //tests/...", "self-hosted"]),
        ("release.yml", ["make repro", "tools/test_wheel.sh", "sha256sum -c SHA256SUMS"]),
    ],
)
def test_workflows_run_the_documented_commands(name, commands):
    text = _workflow(name)
    assert [c for c in commands if c not in text] == []


def test_self_hosted_runners_never_run_pull_requests():
    assert "pull_request" not in _workflow("gpu.yml")


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
