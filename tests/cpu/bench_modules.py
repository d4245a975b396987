"""The benchmark modules for the CPU tests of the benchmark suite: the harness and the systems
are the package `mok.bench`; the lab scripts that stay in benchmarks/ (ab.py, probe_gemm.py,
profile_*.py) are scripts, loaded from their files."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@functools.cache
def load(name: str):
    """mok.bench.<name>, or the benchmarks/ script <name> under a private name."""
    script = BENCHMARKS / f"{name}.py"
    if not script.exists():
        return importlib.import_module(f"mok.bench.{name}")
    if str(BENCHMARKS) not in sys.path:  # a script imports its siblings, as run from there
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"mok_bench_{name}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
