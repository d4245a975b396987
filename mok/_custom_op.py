"""mok's custom ops and the direct path the eager functional API takes to their bodies.

A call through the torch dispatcher (autograd, ADInplaceOrView and the backend kernel, plus the
aliasing check of the outputs) costs ~50 µs of host time on top of the op's own work. The eager
functional API makes six such calls per step, all on the host's critical path before the GPU
has its first large kernel, so outside `torch.compile` it calls the Python function behind each
op directly: the same code, with the same argument checks. Under `torch.compile` it calls the
op itself, which the compiler traces through its fake implementation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_BODIES: dict[object, Callable] = {}


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
