"""`mok info`: what the installation is and what serves this machine (here: no GPU, and in the
source tree no extension module), as text and as JSON; `mok` alone prints its usage."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mok import cli


def test_info_says_what_serves_a_machine_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setenv("MOK_BACKEND", "reference")
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("mok 0.1.0 (")
    assert "torch " in text
    assert "no CUDA device visible: the reference backend (PyTorch) serves every op" in text
    assert "MOK_BACKEND=reference" in text


def test_info_as_json(capsys):
    assert cli.main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["mok"] == "0.1.0" and facts["devices"] == []
    assert set(facts["settings"]) == {"MOK_BACKEND", "MOK_COMM_TIMEOUT_S", "MOK_DEBUG"}


def test_a_module_that_cannot_load_says_why(capsys, monkeypatch):
    monkeypatch.setattr(cli.extension, "installed_archs", lambda: ("sm_90a",))

    def refuse(arch):
        raise ImportError(f"{arch}: libcuda.so.1 not found")

    monkeypatch.setattr(cli.extension, "load_arch", refuse)
    cli.main(["info"])
    assert "extension sm_90a: cannot load here: sm_90a: libcuda.so.1 not found" in (
        capsys.readouterr().out
    )


def test_no_command_prints_the_usage(capsys):
    assert cli.main([]) == 2
    assert "info" in capsys.readouterr().out


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("MOK_COMM_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="MOK_COMM_TIMEOUT_S must be a number of seconds"):
        cli.main(["info"])


def test_the_wheel_installs_the_command():
    """The PEP 517 backend writes [project.scripts] to the wheel's entry_points.txt (Bazel's
    py_wheel gets the same: tests/cpu/test_bazel_files.py)."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools" / "build"))
    from mok_build import metadata, spec

    text = metadata.entry_points(spec.load_project(root))
    assert text == "[console_scripts]\nmok = mok.cli:main\n"
