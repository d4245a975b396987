"""Argument checks of mok.mxfp8: the exception type and a message naming the argument."""

from __future__ import annotations

import pytest
import torch

from mok import mxfp8

X = torch.zeros(128, 256, dtype=torch.bfloat16)
DATA = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
SC = torch.zeros(1, 2, 32, 16, dtype=torch.uint8)
RC_64_ROWS = torch.zeros(64, 4, dtype=torch.uint8)
RC_2_GROUPS = torch.zeros(128, 2, dtype=torch.uint8)

BAD_CALLS = [
    pytest.param(lambda: mxfp8.quantize([1.0]), TypeError, "`x`.*list", id="x_not_tensor"),
    pytest.param(lambda: mxfp8.quantize(X.float()), TypeError, "`x`.*bf16.*float32", id="x_f32"),
    pytest.param(lambda: mxfp8.quantize(X[0]), ValueError, r"`x`.*\[M, N\].*\[256\]", id="x_1d"),
    pytest.param(lambda: mxfp8.quantize(X[None, None]), ValueError, "`x`", id="x_4d"),
    pytest.param(lambda: mxfp8.quantize(X[:100]), ValueError, r"M.*128.*100", id="m_100"),
    pytest.param(lambda: mxfp8.quantize(X[:, :64]), ValueError, r"N.*128.*64", id="n_64"),
    pytest.param(lambda: mxfp8.quantize(X[:0]), ValueError, r"M.*128.*got 0", id="m_0"),
    pytest.param(lambda: mxfp8.quantize(X, False, False), ValueError, "both", id="no_output"),
    pytest.param(lambda: mxfp8.quantize(X, 1), TypeError, "return_normal.*int", id="flag_int"),
    pytest.param(lambda: mxfp8.dequantize(X, SC), TypeError, "`data_fp8`.*bf16", id="data_bf16"),
    pytest.param(lambda: mxfp8.dequantize(DATA, SC.int()), TypeError, "scales_swiz", id="sc_int"),
    pytest.param(lambda: mxfp8.dequantize(DATA, SC[:, :1]), ValueError, r"1, 1, 32", id="sc_shape"),
    pytest.param(lambda: mxfp8.dequantize(DATA[:, :64], SC), ValueError, "N", id="data_n_64"),
    pytest.param(lambda: mxfp8.swizzle_scales(SC), ValueError, "scales_rc", id="swz_rank"),
    pytest.param(lambda: mxfp8.swizzle_scales(RC_64_ROWS), ValueError, r"\(R\).*64", id="swz_r64"),
    pytest.param(lambda: mxfp8.swizzle_scales(RC_2_GROUPS), ValueError, r"C/32.*4.*2", id="swz_g2"),
    pytest.param(lambda: mxfp8.unswizzle_scales(SC, 100, 256), ValueError, "rows", id="uns_rows"),
    pytest.param(lambda: mxfp8.unswizzle_scales(SC, 128, 128), ValueError, r"\[1, 1", id="uns_sh"),
    pytest.param(lambda: mxfp8.scale_bytes(SC), TypeError, "`x`.*uint8", id="scale_bytes_u8"),
    pytest.param(lambda: mxfp8.scale_bytes(X[:, :33]), ValueError, "C.*32.*33", id="sb_c33"),
    pytest.param(lambda: mxfp8.to_e4m3(X), TypeError, "`y`.*float32.*bf16", id="to_e4m3_bf16"),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_CALLS)
def test_bad_arguments(call, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()
