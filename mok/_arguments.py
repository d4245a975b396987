"""One validator per kind of argument; every public entry point calls these.

Messages follow one pattern: "`x` must be bf16 [T, H] = [512, 7168], got float32 [512, 7000]".
Dtype problems raise TypeError, shape/alignment/value problems ValueError (API.md, Errors).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_DTYPE_NAMES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.float8_e4m3fn: "float8_e4m3fn",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def describe(value: object) -> str:
    """A short description of what the caller passed, for error messages."""
    if isinstance(value, torch.Tensor):
        return f"{dtype_name(value.dtype)} {list(value.shape)} on {value.device}"
    return type(value).__name__


def _shape_text(dims: Sequence[str] | None, shape: Sequence[int | None]) -> str:
    sizes = ", ".join("*" if s is None else str(s) for s in shape)
    if dims is None:
        return f"[{sizes}]"
    return f"[{', '.join(dims)}] = [{sizes}]"


class DTypeError(TypeError, ValueError):
    """A tensor of the wrong dtype. Both a TypeError and a ValueError: the original package
    raises one or the other depending on the layer, and its users catch either."""


def check_tensor(
    name: str,
    value: object,
    *,
    dtype: torch.dtype | None,
    shape: Sequence[int | None],
    dims: Sequence[str] | None = None,
    device: torch.device | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """Check one tensor argument: type, dtype (None = any: the caller converts), shape (None =
    any size), device, contiguity. Runs on every call of every entry point, so the message is
    only built for a failure."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"`{name}` must be a tensor ({_expected(dtype, dims, shape)}), got "
                        f"{describe(value)}")  # fmt: skip
    if dtype is not None and value.dtype != dtype:
        raise DTypeError(f"`{name}` must be {_expected(dtype, dims, shape)}, got {describe(value)}")
    if not _shape_matches(value.shape, shape):
        raise ValueError(f"`{name}` must be {_expected(dtype, dims, shape)}, got {describe(value)}")
    if device is not None and value.device != _as_device(device):
        raise ValueError(f"`{name}` must be on {device}, got {describe(value)}")
    if contiguous and not value.is_contiguous():
        raise ValueError(f"`{name}` must be contiguous, got strides {list(value.stride())}")
    return value


def _shape_matches(got: Sequence[int], want: Sequence[int | None]) -> bool:
    # A plain loop, not all(<generator>): a third less host time in a check every call makes.
    if len(got) != len(want):
        return False
    for size, wanted in zip(got, want):  # noqa: B905, SIM110 (lengths checked above)
        if wanted is not None and size != wanted:
            return False
    return True


def _expected(dtype: torch.dtype | None, dims, shape) -> str:
    return f"{'tensor' if dtype is None else dtype_name(dtype)} {_shape_text(dims, shape)}"


def _as_device(device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def check_multiple(name: str, value: int, multiple: int, *, minimum: int = 1) -> int:
    """Check that an integer is >= minimum and a multiple of `multiple`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {describe(value)}")
    if value < minimum or value % multiple != 0:
        expected = f">= {minimum}"
        if multiple != 1:
            expected = f"a multiple of {multiple} and {expected}"
        raise ValueError(f"`{name}` must be {expected}, got {value}")
    return value


def check_range(name: str, value: int, low: int, high: int) -> int:
    """Check that an integer lies in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {describe(value)}")
    if not low <= value <= high:
        raise ValueError(f"`{name}` must be in [{low}, {high}], got {value}")
    return value


def check_type(name: str, value: object, expected: type) -> None:
    """TypeError naming the argument unless `value` is an `expected` (e.g. a MoKConfig)."""
    if not isinstance(value, expected):
        raise TypeError(f"`{name}` must be a {expected.__name__}, got {describe(value)}")
