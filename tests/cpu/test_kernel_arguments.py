"""The CUDA kernel wrappers check every operand's shape before any launch (the kernels trust the
sizes they are given): a mismatch is a ValueError naming the argument, a wrong index dtype a
TypeError. These checks run before any device is touched, so they are tested on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from mok.backends.cuda import elementwise, grouped_gemm
from mok.backends.cuda.experimental import swiglu_epilogue

ROWS = torch.tensor([256, 0], dtype=torch.int32)
NUM_TOKENS = torch.tensor([256], dtype=torch.int32)
FP8 = torch.float8_e4m3fn


def _t(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: grouped_gemm.linear(_t(256, 16), [_t(2, 8, 24)], ROWS), ValueError,
         r"`weights\[0\]` must be tensor \[E, N, K\] = \[2, 8, 16\], got bf16 \[2, 8, 24\]"),
        (lambda: grouped_gemm.linear(_t(256, 16), [_t(2, 8, 16), _t(2, 16, 16)], ROWS), ValueError,
         r"`weights\[1\]` must be tensor \[E, N, K\] = \[2, 8, 16\]"),
        (lambda: grouped_gemm.linear(_t(256, 16), [_t(3, 8, 16)], ROWS), ValueError,
         r"`weights\[0\]` must be tensor \[E, N, K\] = \[2, 8, 16\], got bf16 \[3, 8, 16\]"),
        (lambda: grouped_gemm.linear(_t(256, 16), [_t(2, 8, 16)], ROWS.long()), TypeError,
         r"`rows` must be int32 \[E\]"),
        (lambda: grouped_gemm.linear(_t(256), [_t(2, 8, 16)], ROWS), ValueError,
         r"`a` must be tensor \[R, K\]"),
        (lambda: grouped_gemm.linear_transposed(_t(256, 16), _t(2, 8, 32), ROWS), ValueError,
         r"`weight_t` must be tensor \[E, K, N\] = \[2, 16, \*\]"),
        (lambda: grouped_gemm.linear_sum([(_t(256, 16), _t(2, 16, 8)), (_t(256, 16), _t(2, 8, 8))],
                                      ROWS), ValueError,
         r"`terms\[1\]\[1\] \(w\)` must be tensor \[E, K, N\] = \[2, 16, 8\], got bf16 "
         r"\[2, 8, 8\]"),
        (lambda: grouped_gemm.linear_sum([(_t(256, 16), _t(2, 16, 8)), (_t(256, 32), _t(2, 16, 8))],
                                      ROWS), ValueError,
         r"`terms\[1\]\[0\] \(a\)` must be tensor \[R, K\] = \[256, 16\]"),
        (lambda: grouped_gemm.linear_sum([(_t(256, 16), _t(3, 16, 8)), (_t(256, 16), _t(3, 16, 8))],
                                      ROWS), ValueError,
         r"`terms\[0\]\[1\] \(w\)` must be tensor \[E, K, N\] = \[2, 16, 8\], got bf16 "
         r"\[3, 16, 8\]"),
        (lambda: grouped_gemm.weight_grads([(_t(128, 8), _t(256, 16))], ROWS), ValueError,
         r"`pairs\[0\]\[0\] \(d_out\)` must be tensor \[R, N\] = \[256, 8\], got bf16 \[128, 8\]"),
        (lambda: grouped_gemm.weight_grads([(_t(256, 8), _t(256, 16)), (_t(256, 8), _t(256, 8))],
                                        ROWS), ValueError,
         r"`pairs\[1\]\[1\] \(a\)` must be tensor \[R, K\] = \[256, 16\]"),
        (lambda: grouped_gemm.linear_mx(_t(256, 128), [(_t(2, 128, 128, dtype=FP8),
                                                     _t(1, 1, 32, 16, dtype=torch.uint8))],
                                     ROWS), ValueError,
         r"`weights\[0\]\[1\] \(scales\)` must be uint8 \[E\*N/128, K/128, 32, 16\] = "
         r"\[2, 1, 32, 16\], got uint8 \[1, 1, 32, 16\]"),
        (lambda: grouped_gemm.linear_mx(_t(256, 128), [(_t(2, 128, 128),
                                                     _t(2, 1, 32, 16, dtype=torch.uint8))],
                                     ROWS), TypeError,
         r"`weights\[0\]\[0\] \(data\)` must be float8_e4m3fn \[E, N, K\] = \[2, 128, 128\]"),
        (lambda: grouped_gemm.linear_mx(_t(256, 128), [(_t(2, 64, 128, dtype=FP8),
                                                     _t(1, 1, 32, 16, dtype=torch.uint8))],
                                     ROWS), ValueError,
         r"MXFP8 weights need N and K multiples of 128, got N=64, K=128"),
        (lambda: grouped_gemm.linear(_t(256, 16), [_t(2, 8, 16)] * 3, ROWS), ValueError,
         r"`weights` must hold 1 or 2 operand sets, got 3"),
        (lambda: grouped_gemm.weight_grads([], ROWS), ValueError,
         r"`pairs` must hold 1 or 2 operand sets, got 0"),
        (lambda: grouped_gemm.linear(_t(256, 16), [_t(2, 8, 16)], ROWS, _t(256, dtype=torch.int64)),
         TypeError, r"`row_source` must be int32 \[R\]"),
        (lambda: grouped_gemm.weight_grads([(_t(256, 8), _t(256, 16))], ROWS,
                                        _t(255, dtype=torch.int32)), ValueError,
         r"`row_source` must be int32 \[R\] = \[256\], got int32 \[255\]"),
        (lambda: swiglu_epilogue.linear_swiglu(_t(256, 16), _t(2, 128, 16), _t(2, 128, 8), ROWS),
         ValueError, r"`w_up` must be tensor \[E, N, K\] = \[2, 128, 16\], got bf16 "
         r"\[2, 128, 8\]"),
        (lambda: swiglu_epilogue.linear_swiglu(_t(256, 16), _t(2, 64, 16), _t(2, 64, 16), ROWS),
         ValueError, r"linear_swiglu needs N a multiple of 128, got N=64"),
        (lambda: swiglu_epilogue.linear_swiglu(_t(256, 16), _t(2, 128, 16), _t(2, 128, 16), ROWS,
                                         limit=float("inf")), ValueError,
         r"`limit` must be None or finite and >= 0, got inf"),
        (lambda: elementwise.swiglu(_t(256, 64), _t(256, 32), NUM_TOKENS, None), ValueError,
         r"`up` must be tensor \[R, I\] = \[256, 64\], got bf16 \[256, 32\]"),
        (lambda: elementwise.swiglu(_t(256, 64), _t(256, 64), ROWS, None), ValueError,
         r"`num_tokens` must be int32 \[1\]"),
        (lambda: elementwise.swiglu_backward(_t(256, 64, dtype=torch.float32), _t(255),
                                              _t(256, 64), _t(256, 64), _t(256, 64),
                                              NUM_TOKENS, None), ValueError,
         r"`router_weight` must be tensor \[R\] = \[256\]"),
        (lambda: elementwise.swiglu_backward(_t(200, 64), _t(256), _t(256, 64), _t(256, 64),
                                              _t(256, 64), NUM_TOKENS, None), ValueError,
         r"`d_h` must be tensor \[R, I\] = \[256, 64\], got bf16 \[200, 64\]"),
        (lambda: elementwise.scale_rows(_t(256, 64), _t(128), NUM_TOKENS), ValueError,
         r"`weight` must be tensor \[R\] = \[256\]"),
        (lambda: elementwise.swiglu_mxfp8(_t(256, 128), _t(256, 256), NUM_TOKENS, None),
         ValueError, r"`up` must be tensor \[R, I\] = \[256, 128\], got bf16 \[256, 256\]"),
        (lambda: elementwise.swiglu_mxfp8(_t(256, 64), _t(256, 64), NUM_TOKENS, None),
         ValueError, r"`gate` must be \[R, I\] with R and I multiples of 128 .*\[256, 64\]"),
    ],
    ids=[
        "linear-K", "linear-N-differs", "linear-experts", "rows-dtype", "a-rank",
        "transposed-K", "sum-second-w", "sum-second-a", "sum-experts", "wgrad-rows",
        "wgrad-second-pair", "mx-scales", "mx-data-dtype", "mx-tiles", "three-sets", "no-pairs",
        "row-source-dtype", "row-source-rows", "swiglu-gemm-up", "swiglu-gemm-n",
        "swiglu-gemm-limit",
        "swiglu-up", "swiglu-num-tokens", "swiglu-bwd-router-weight", "swiglu-bwd-d_h",
        "scale-rows-weight", "swiglu-mxfp8-up", "swiglu-mxfp8-tiles",
    ],
)  # fmt: skip
def test_mismatched_operands_are_refused_before_any_launch(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_mxfp8_weight_gradients_launch_one_kind_9_of_both_pairs(monkeypatch):
    """weight_grads_mx hands the grouped GEMM each (d_out, x's E4M3 bytes, output) set, x's
    scale tiles, n = K, k = N and total_rows = R (captured instead of launched), and refuses
    operands whose shapes or tiles disagree."""
    from mok.backends.cuda.weight_grads_mx import MxRowsT, weight_grads_mx

    launches = []
    monkeypatch.setattr(grouped_gemm, "_launch", lambda *args, **kw: launches.append((args, kw)))
    d_gate, d_up = _t(256, 128), _t(256, 128)
    pair = MxRowsT(_t(384, 256, dtype=FP8), _t(3, 2, 32, 16, dtype=torch.uint8))
    outs = weight_grads_mx([(d_gate, pair), (d_up, pair)], ROWS)
    assert [tuple(o.shape) for o in outs] == [(2, 128, 384)] * 2
    ((kind, sets, rows, n, k, total, source, scales), _) = launches[0]
    assert (kind, n, k, total, source) == (
        grouped_gemm.Kind.K_GROUPED_MXFP8_TN,
        384,
        128,
        256,
        None,
    )
    assert all(s[0] is d and s[1] is pair.data and s[2] is o
               for s, d, o in zip(sets, (d_gate, d_up), outs, strict=True))  # fmt: skip
    assert rows is ROWS and all(sc is pair.scales for sc in scales)
    with pytest.raises(ValueError, match=r"`pairs\[0\]\[1\]\[1\] \(scales\)` must be uint8 "):
        weight_grads_mx([(d_gate, MxRowsT(pair.data, pair.scales[:, :1]))], ROWS)
    with pytest.raises(ValueError, match="N, K and R multiples of 128, got N=64, K=384, R=256"):
        weight_grads_mx([(_t(256, 64), pair)], ROWS)
