"""The combine epilogues' public entry (mok.ops.fwd_epilogue / bwd_epilogue) checks their
arguments before any backend runs, and the CUDA epilogues (mok.backends.cuda.epilogue) hand the
kernel the sizes they trust. Neither touches a device, so both are tested here on CPU tensors,
with the launch recorded instead of run."""

from __future__ import annotations

import pytest
import torch

from mok import ops
from mok.backends.cuda import epilogue

fwd_epilogue, bwd_epilogue = ops.fwd_epilogue, ops.bwd_epilogue


def _bf16(*shape):
    return torch.zeros(shape, dtype=torch.bfloat16)


def _weights(tokens, topk, dtype=torch.float32):
    return torch.zeros(tokens, topk, dtype=dtype)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: fwd_epilogue(None, _bf16(8, 128).float(), _weights(4, 2)),
         TypeError,
         r"`combine_buffer` must be bf16 \[T \* k, H\] = \[\*, \*\], got float32 \[8, 128\]"),
        (lambda: fwd_epilogue(None, _bf16(8, 128), _weights(3, 2)), ValueError,
         r"`topk_weights` must be float32 \[T, k\] = \[4, 2\], got float32 \[3, 2\]"),
        (lambda: fwd_epilogue(None, _bf16(8, 128), _weights(4, 2, torch.float64)),
         TypeError, r"`topk_weights` must be float32 \[T, k\]"),
        (lambda: fwd_epilogue(None, _bf16(8, 128), _weights(8, 1)[0]), ValueError,
         r"`topk_weights` must be float32 \[T, k\] = \[\*, \*\], got float32 \[1\]"),
        (lambda: fwd_epilogue(_bf16(8, 128), _bf16(8, 128), _weights(4, 2)),
         ValueError, r"`y_shared` must be bf16 \[T, H\] = \[4, 128\], got bf16 \[8, 128\]"),
        (lambda: fwd_epilogue(None, _bf16(9, 128), _weights(4, 2)), ValueError,
         r"`combine_buffer` must be bf16 \[T \* k, H\] with k = 2 and H a multiple of 8, "
         r"got \[9, 128\]"),
        (lambda: bwd_epilogue(None, _bf16(8, 100), 2), ValueError,
         r"`d_x_routed_buffer` must be .* H a multiple of 8, got \[8, 100\]"),
        (lambda: bwd_epilogue(None, _bf16(8 * 128), 2), ValueError,
         r"`d_x_routed_buffer` must be bf16 \[T \* k, H\] = \[\*, \*\], got bf16 \[1024\]"),
        (lambda: bwd_epilogue(_bf16(4, 64), _bf16(8, 128), 2), ValueError,
         r"`d_x_shared` must be bf16 \[T, H\] = \[4, 128\]"),
        (lambda: bwd_epilogue(None, _bf16(8, 128), 0), ValueError,
         r"`topk` must be in \[1, 255\], got 0"),
    ],
    ids=[
        "fwd-routed-dtype", "fwd-weights-rows", "fwd-weights-dtype", "fwd-weights-1d",
        "fwd-shared-shape", "fwd-rows-not-multiple-of-k", "bwd-hidden-not-multiple-of-8",
        "bwd-routed-1d", "bwd-shared-shape", "bwd-topk-zero",
    ],
)  # fmt: skip
def test_bad_arguments_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.fixture
def launches(monkeypatch):
    recorded = []
    monkeypatch.setattr(
        epilogue.extension,
        "launch",
        lambda device, kernel, **arguments: recorded.append((device, kernel, arguments)),
    )
    return recorded


def test_forward_hands_the_kernel_its_sizes_and_operands(launches):
    shared, combine = _bf16(4, 128), _bf16(12, 128)
    column_major = _weights(4, 3).t().contiguous().t()
    out = epilogue.fwd_epilogue(shared, combine, column_major)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (4, 128)
    [(device, kernel, arguments)] = launches
    assert (device, kernel) == (combine.device, "comm_epilogue")
    assert (arguments["tokens"], arguments["hidden"], arguments["topk"]) == (4, 128, 3)
    assert arguments["shared"] == shared.data_ptr()
    assert arguments["routed"] == combine.data_ptr()
    assert arguments["weights"] not in (0, column_major.data_ptr())  # a row-major copy
    assert arguments["out"] == out.data_ptr()


def test_backward_passes_no_weights_and_no_shared_rows(launches):
    out = epilogue.bwd_epilogue(None, _bf16(16, 256), 8)
    assert tuple(out.shape) == (2, 256)
    [(_, _, arguments)] = launches
    assert (arguments["tokens"], arguments["hidden"], arguments["topk"]) == (2, 256, 8)
    assert arguments["shared"] == 0 and arguments["weights"] == 0


def test_no_tokens_launch_nothing(launches):
    out = epilogue.fwd_epilogue(None, _bf16(0, 128), _weights(0, 4))
    assert tuple(out.shape) == (0, 128)
    assert launches == []
