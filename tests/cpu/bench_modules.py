"""benchmarks/ modules for the CPU tests of the benchmark suite (benchmarks/ is not a package:
its modules import each other by their plain names, as they do when run as scripts)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@functools.cache
def load(name: str):
    """A benchmarks/ module under a private name."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"mok_bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
