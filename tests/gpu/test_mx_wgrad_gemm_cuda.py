"""The MXFP8 backward's weight gradients on an activation read as stored (grouped GEMM
K_GROUPED_MXFP8_TN, cuda_weight_grads_mx.weight_grads_mx): d_out[seg]^T @ x[seg] per expert with x
given as its transposed MXFP8 pair (blocks of 32 rows), against fp32 products of the pair's
mxfp8_dequantize values and against the bf16 weight-gradient kind (3) on those values.

One GPU. x is rounded by mok's kernel (mxfp8.mxfp8_round, the forward's pull-and-round) from
fresh random bf16 whose rows span many scale exponents (seed printed; replay with
MOK_TEST_SEED). Outputs are checked whole, their memory NaN before each launch
(gpu_helpers.poison_next_allocation), so empty experts must have been written zero.
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import (
    case_generator,
    module_seed,
    poison_next_allocation,
    requires_gpu_module,
    segment_sizes,
)

from mok.backends.cuda import grouped_gemm, mxfp8
from mok.backends.cuda.weight_grads_mx import MxRowsT, weight_grads_mx

pytestmark = [pytest.mark.gpu, requires_gpu_module(), pytest.mark.usefixtures("grouped_gemms")]

# (rows per expert, K = x's columns, N = d_out's columns): segments of 128-row multiples, as the
# schedule's (256); empty experts; partly filled k tiles through row sources below; the
# DeepSeek-V4-Pro-like d_W_gate (K = H 7168, N = I 3072) and d_W_down (K = I 3072, N = H 7168).
CASES = [
    ([256], 128, 128),
    ([512, 0, 256, 768], 256, 384),
    ([0, 0, 0], 128, 128),
    ([128, 384, 128], 384, 256),
    ([256, 256], 7168, 3072),
    ([256, 512], 3072, 7168),
    ([2048, 2048, 1024, 2048], 1024, 2048),  # several work tiles per CTA
]
IDS = [f"rows{'-'.join(map(str, r))}-K{k}-N{n}" for r, k, n in CASES]

seed = module_seed("MXFP8 weight-gradient GEMM")


def _rows_pair(gen, total: int, k: int, spread: int = 8):
    """(MxRowsT, bf16 dequantized values [total, K]) of random x whose rows' magnitudes span
    2^-spread .. 2^spread, rounded as the forward rounds the routed rows."""
    x = torch.randn((total, k), generator=gen, device="cuda")
    exponents = torch.randint(-spread, spread + 1, (total, 1), generator=gen, device="cuda")
    _, (data_t, scales_t) = mxfp8.mxfp8_round((x * 2.0**exponents).bfloat16(), transposed=True)
    values = mxfp8.mxfp8_dequantize(data_t, scales_t).T.contiguous()
    return MxRowsT(data_t, scales_t), values


def _segments_product(d_out, values, rows):
    """fp32 d_out[seg]^T @ values[seg] per expert: [E, N, K]."""
    out, start = [], 0
    for r in rows:
        out.append(d_out[start : start + r].float().T @ values[start : start + r].float())
        start += r
    return torch.stack(out)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_fp32_products_and_the_bf16_kind_on_the_values(case, seed):
    rows, k, n = case
    gen = case_generator(case, seed)
    total = sum(rows) + 256
    pair, values = _rows_pair(gen, total, k)
    d_gate, d_up = (torch.randn((total, n), generator=gen, device="cuda").bfloat16() for _ in "gu")
    poison_next_allocation((len(rows), n, k), torch.bfloat16, count=2)
    got = weight_grads_mx([(d_gate, pair), (d_up, pair)], segment_sizes(rows))
    before = grouped_gemm.weight_grads([(d_gate, values), (d_up, values)], segment_sizes(rows))
    for d_out, mine, bf16_kind in zip((d_gate, d_up), got, before, strict=True):
        assert mine.dtype == torch.bfloat16 and mine.shape == (len(rows), n, k)
        ref = _segments_product(d_out, values, rows)
        scale = ref.abs().max().clamp_min(1e-6).item()
        # The same exact products summed in fp32, rounded to bf16 once.
        torch.testing.assert_close(mine.float(), ref, rtol=2**-7, atol=2e-3 * scale)
        torch.testing.assert_close(mine.float(), bf16_kind.float(), rtol=2**-7, atol=2e-3 * scale)
        for e, r in enumerate(rows):
            if r == 0:
                assert (mine[e] == 0).all(), f"expert {e} has no rows: exact zeros"


@pytest.mark.parametrize("spread", [0, 40, 120])
def test_one_hot_gradients_give_the_dequantized_rows_bit_for_bit(spread, seed):
    """d_out one-hot per segment (row r of a segment: column r) makes d_W[e][r] = x[row0 + r]:
    the conversion, each segment's k-tile and scale-tile offsets and the transposed output must
    give mxfp8_dequantize's bits, in every expert."""
    experts, k, n = 3, 384, 256
    gen = case_generator((k, n, spread), seed)
    pair, values = _rows_pair(gen, experts * n, k, spread)
    eye = torch.eye(n, device="cuda").bfloat16().repeat(experts, 1)
    got = weight_grads_mx([(eye, pair)], segment_sizes([n] * experts))[0]
    for e in range(experts):
        assert torch.equal(got[e], values[e * n : (e + 1) * n]), f"expert {e}"


def test_padding_rows_repeats_and_misaligned_segments(seed):
    """Row sources leave each segment's trailing padding out (NaN in d_out there stays out; x's
    padding rows are zero, as in the routed buffers), five launches give the same bits, and an
    expert whose segment does not start at a multiple of 128 rows gets NaN, not another
    segment's rows."""
    rows, k, n = [512, 256, 0, 768], 256, 384
    gen = case_generator("padding", seed)
    total = sum(rows) + 256
    source = torch.zeros(total, dtype=torch.int32, device="cuda")
    source[300:512] = -1  # expert 0's last 212 rows are padding: a partly used k tile
    source[sum(rows) :] = -1
    padding = source[:, None] < 0
    x = torch.where(padding, 0.0, torch.randn((total, k), generator=gen, device="cuda"))
    _, (data_t, scales_t) = mxfp8.mxfp8_round(x.bfloat16(), transposed=True)
    pair = MxRowsT(data_t, scales_t)
    d_out = torch.randn((total, n), generator=gen, device="cuda")
    clean = torch.where(padding, 0.0, d_out).bfloat16()
    poisoned = torch.where(padding, float("nan"), d_out).bfloat16()
    counts = segment_sizes(rows)
    want = weight_grads_mx([(clean, pair)], counts)[0]
    for _ in range(5):
        poison_next_allocation((len(rows), n, k), torch.bfloat16)
        got = weight_grads_mx([(poisoned, pair)], counts, source)[0]
        assert torch.equal(got, want)
    misaligned = weight_grads_mx([(clean, pair)], segment_sizes([64, 448, 256, 768]))[0]
    assert misaligned[1].isnan().all(), "expert 1's segment starts at row 64"
    assert not misaligned[[0, 2, 3]].isnan().any()


def test_bad_arguments_raise_before_any_launch():
    counts = segment_sizes([256])
    d_out = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    data = torch.zeros(128, 256, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.zeros(1, 2, 32, 16, dtype=torch.uint8, device="cuda")
    pair = MxRowsT(data, scales)
    with pytest.raises(ValueError, match=r"pairs\[0\]\[1\]\[0\] \(data\)"):
        weight_grads_mx([(d_out, MxRowsT(data[:, :128], scales))], counts)
    with pytest.raises(ValueError, match=r"pairs\[1\]\[1\]\[1\] \(scales\)"):
        weight_grads_mx([(d_out, pair), (d_out, MxRowsT(data, scales[:, :1]))], counts)
    with pytest.raises(ValueError, match=r"pairs\[1\]\[0\] \(d_out\)"):
        weight_grads_mx([(d_out, pair), (d_out[:, :64], pair)], counts)
    with pytest.raises(ValueError, match="N, K and R multiples of 128, got N=192"):
        weight_grads_mx([(torch.zeros(256, 192, device="cuda"), pair)], counts)
    with pytest.raises(ValueError, match="must hold 1 or 2 operand sets"):
        weight_grads_mx([(d_out, pair)] * 3, counts)
    out = torch.zeros(1, 128, 128, dtype=torch.bfloat16, device="cuda")
    kind = grouped_gemm.Kind.K_GROUPED_MXFP8_TN
    with pytest.raises(ValueError, match="K_GROUPED_MXFP8_TN needs `total_rows`"):
        grouped_gemm._launch(kind, [(d_out, data, out)], counts, 128, 128, 200, b_scales=[scales])
