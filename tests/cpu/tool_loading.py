"""Loading the repository's tools/*.py scripts in tests, and skipping where a tool is absent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_tool(name: str):
    """tools/<name>.py as a module."""
    module_spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def needs(module: str):
    """Skip, saying why, where the Python package `module` is not installed."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed (make env)"
    )
