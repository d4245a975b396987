"""Runtime settings: every `MOK_*` environment variable, parsed and checked in this one module.

MOK_GROUPED_GEMM, MOK_OVERLAP_CTAS, MOK_SWIGLU_EPILOGUE and MOK_MXFP8_F16 are the defaults of
`MoKConfig`'s speed knobs (its keyword fields after the original's six), read when a MoKConfig
is made. The others are process-wide switches, read when they are used (so a test or a launcher
may change the environment between steps). A bad value raises ValueError naming the variable, on
every backend.

| variable            | type  | default | meaning                                              |
|---------------------|-------|---------|------------------------------------------------------|
| MOK_BACKEND         | str   | auto    | auto (CUDA kernels for CUDA tensors), reference, cuda |
| MOK_GROUPED_GEMM    | str   | auto    | routed GEMMs: auto / mok (mok's), torch (_grouped_mm) |
| MOK_COMM_TIMEOUT_S  | float | 5       | bound of every device-side wait (then TIMEOUT is set)|
|                     |       |         | and, where set, of the reference's collectives       |
| MOK_OVERLAP_CTAS    | int   | 64      | CTAs of a background exchange; 0: all foreground     |
| MOK_DEBUG           | bool  | 0       | check the status word after every functional call    |
| MOK_SWIGLU_EPILOGUE | bool  | 0       | experimental: SwiGLU in the gate/up GEMM's epilogue  |
| MOK_MXFP8_F16       | bool  | 0       | experimental: MXFP8 gate/up GEMM on f16 rebased rows |

The two experimental switches give the same bits as the default and were slower on every GPU
measured (docs/grouped-gemm.md).
"""

from __future__ import annotations

import math
import os

BACKENDS = ("auto", "reference", "cuda")
GROUPED_GEMMS = ("auto", "mok", "torch")
DEFAULT_COMM_TIMEOUT_S = 5.0
# The kernels take the wait bound as uint64 nanoseconds (at most ~584 years); 1e9 s is far inside.
MAX_COMM_TIMEOUT_S = 1e9
DEFAULT_OVERLAP_CTAS = 64


def _choice(variable: str, allowed: tuple[str, ...], default: str) -> str:
    value = os.environ.get(variable, default)
    if value not in allowed:
        raise ValueError(f"{variable} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _switch(variable: str) -> bool:
    return _choice(variable, ("0", "1"), "0") == "1"


def backend() -> str:
    """MOK_BACKEND: which implementation serves an op (see mok.backends)."""
    return _choice("MOK_BACKEND", BACKENDS, "auto")


def grouped_gemm() -> str:
    """MOK_GROUPED_GEMM: auto (mok's GEMMs where the module has them), mok, or torch."""
    return _choice("MOK_GROUPED_GEMM", GROUPED_GEMMS, "auto")


def comm_timeout_ns() -> int:
    """MOK_COMM_TIMEOUT_S seconds (default 5) in nanoseconds: the bound of every device wait."""
    text = os.environ.get("MOK_COMM_TIMEOUT_S", "")
    try:
        seconds = float(text) if text else DEFAULT_COMM_TIMEOUT_S
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < MAX_COMM_TIMEOUT_S:
        raise ValueError(
            f"MOK_COMM_TIMEOUT_S must be a number of seconds in (0, {MAX_COMM_TIMEOUT_S:.0e}), "
            f"got {text!r}"
        )
    return int(seconds * 1e9)


def comm_timeout_s_if_set() -> float | None:
    """MOK_COMM_TIMEOUT_S in seconds where it is set, else None: the reference backend's
    collectives then wait as long as the process group's own timeout does (its ranks compute
    on the host between exchanges, so a default of seconds could cut off a slow rank)."""
    if not os.environ.get("MOK_COMM_TIMEOUT_S", ""):
        return None
    return comm_timeout_ns() / 1e9


def overlap_ctas() -> int:
    """MOK_OVERLAP_CTAS: CTAs of an exchange run beside GEMMs (default 64, about half an
    H100/H200; docs/exchanges.md); 0 runs every exchange in the foreground, on all SMs."""
    text = os.environ.get("MOK_OVERLAP_CTAS", "")
    try:
        ctas = int(text) if text else DEFAULT_OVERLAP_CTAS
    except ValueError:
        ctas = -1
    if ctas < 0:
        raise ValueError(f"MOK_OVERLAP_CTAS must be a CTA count >= 0, got {text!r}")
    return ctas


def debug() -> bool:
    """MOK_DEBUG=1: check the status word after every functional call (a host sync each)."""
    return os.environ.get("MOK_DEBUG", "0") not in ("", "0")


def swiglu_epilogue() -> bool:
    """MOK_SWIGLU_EPILOGUE=1 (experimental): SwiGLU in the BF16 gate/up GEMM's epilogue."""
    return _switch("MOK_SWIGLU_EPILOGUE")


def mxfp8_f16_rows() -> bool:
    """MOK_MXFP8_F16=1 (experimental): the MXFP8 gate/up GEMM reads f16 rows rebased per row."""
    return _switch("MOK_MXFP8_F16")


def check_all() -> None:
    """Parse every variable now (workspace creation does, on every backend), so a bad value is
    an error even where the pass that reads it never runs (e.g. MOK_COMM_TIMEOUT_S off CUDA)."""
    for parse in (backend, grouped_gemm, comm_timeout_ns, overlap_ctas, debug, swiglu_epilogue,
                  mxfp8_f16_rows):  # fmt: skip
        parse()
