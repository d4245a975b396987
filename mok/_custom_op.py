"""mok's custom ops and the direct path the eager functional API takes to their bodies.

A call through the torch dispatcher (autograd, ADInplaceOrView and the backend kernel, plus the
aliasing check of the outputs) costs ~50 µs of host time on top of the op's own work. The eager
functional API makes six such calls per step (five at EP 1: no routing all-gather), all on the
host's critical path before the GPU has its first large kernel, so outside `torch.compile` it
calls the Python function behind each op directly: the same code (its argument checks too, but
for those its caller has just made: below). Under `torch.compile` it calls the op itself, which
the compiler traces through its fake implementation.

The functional API checks every argument of a pass before it calls that pass's fused op, and
the op body would check the same arguments again (~40-70 µs of host time a pass, also before
the first GEMM); inside `validated()` the fused ops' bodies skip those repeated checks. Called
any other way (through torch.ops, or under torch.compile) they check.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import torch

_BODIES: dict[object, Callable] = {}
_VALIDATED = contextvars.ContextVar("mok_arguments_validated", default=False)


def custom_op(name: str, **options) -> Callable:
    """`torch.library.custom_op(name, **options)` that also keeps the function for `direct`."""

    def register(body: Callable):
        op = torch.library.custom_op(name, **options)(body)
        _BODIES[op] = body
        return op

    return register


def direct(op) -> Callable:
    """The op's Python function in eager mode; the op itself while torch.compile traces."""
    if torch.compiler.is_compiling():
        return op
    return _BODIES[op]


class validated:
    """`with validated():` -- the caller has checked the fused ops' arguments (a class, not a
    generator context manager: it runs twice a step on the host's critical path)."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _VALIDATED.set(True)

    def __exit__(self, *exc_info) -> None:
        _VALIDATED.reset(self._token)


def call_validated(op, *args):
    """`direct(op)(*args)` for arguments the caller has checked: in eager mode the body runs
    inside `validated()`; while torch.compile traces, the op itself (which checks)."""
    if torch.compiler.is_compiling():
        return op(*args)
    with validated():
        return _BODIES[op](*args)


def arguments_validated() -> bool:
    """True inside `validated()`: a fused op body may skip the checks its caller has made."""
    return _VALIDATED.get()
