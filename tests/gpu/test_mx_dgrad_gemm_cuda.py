"""The MXFP8 backward's data-gradient GEMMs on weights read as stored: d_h to fp32
(grouped_gemm.linear_mx with out_dtype fp32, M_GROUPED_MXFP8_NT_F32) and d_x = a1 @ W1^T + a2 @
W2^T in one accumulation (grouped_gemm.linear_mx_sum, M_GROUPED_MXFP8_NT_PAIR), against fp32
products of the weights' mxfp8_dequantize values and against the bf16 kinds they replace on those
values.

One GPU. Weights are quantized by mok's kernel from fresh random bf16 (seed printed; replay
with MOK_TEST_SEED), their rows spanning many scale exponents. Outputs are checked whole, their
memory NaN before each launch (gpu_helpers.poison_next_allocation), so rows past the segments
must have been written zero.
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
    spread_mxfp8_weight,
)

from mok.backends.cuda import grouped_gemm, mxfp8

pytestmark = [pytest.mark.gpu, requires_gpu_module(), pytest.mark.usefixtures("grouped_gemms")]

# (rows per expert, K, N): K and N whole scale tiles; ragged and empty segments; the
# DeepSeek-V4-Pro-like d_h (K = H 7168, N = I 3072) and d_x (K = I 3072, N = H 7168).
CASES = [
    ([256], 128, 128),
    ([512, 0, 256, 768], 256, 384),
    ([0, 0, 0], 128, 128),
    ([100, 0, 37, 301], 512, 640),
    ([256, 256], 7168, 3072),
    ([256, 512], 3072, 7168),
    ([2048, 2048, 1024, 2048], 1024, 2048),  # several work tiles per CTA
]
IDS = [f"rows{'-'.join(map(str, r))}-K{k}-N{n}" for r, k, n in CASES]

seed = module_seed("MXFP8 data-gradient GEMMs")


def _weight(gen, experts, n, k, spread: int):
    """(MxWeightT, bf16 dequantized values) of gpu_helpers.spread_mxfp8_weight's weight."""
    data, scales = spread_mxfp8_weight(gen, experts, n, k, spread)
    return grouped_gemm.MxWeightT(data, scales), mxfp8.mxfp8_dequantize(data, scales)


def _segments_product(terms, rows, total, n):
    """fp32 sum over (a, values) terms of a[seg] @ values[e]^T; zero past the segments."""
    out = torch.zeros(total, n, device="cuda")
    start = 0
    for e, r in enumerate(rows):
        for a, values in terms:
            out[start : start + r] += a[start : start + r].float() @ values[e].float().T
        start += r
    return out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fp32_output_matches_fp32_products_and_the_transposed_bf16_kind(case, seed):
    rows, k, n = case
    gen = case_generator(case, seed)
    total = sum(rows) + 256
    a = torch.randn((total, k), generator=gen, device="cuda").bfloat16()
    weight, values = _weight(gen, len(rows), n, k, spread=4)
    poison_next_allocation((total, n), torch.float32)
    counts = segment_sizes(rows)
    got = grouped_gemm.linear_mx(a, [weight], counts, out_dtype=torch.float32)[0]
    assert got.dtype == torch.float32
    ref = _segments_product([(a, values)], rows, total, n)
    scale = ref.abs().max().clamp_min(1e-6).item()
    # The same exact products summed in fp32 in another order.
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * scale)
    before = grouped_gemm.linear_transposed(a, values.transpose(1, 2).contiguous(), counts)
    torch.testing.assert_close(got, before, rtol=1e-4, atol=1e-4 * scale)
    assert (got[sum(rows) :] == 0).all(), "rows past the segments must be zeroed"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pair_sum_matches_fp32_products_and_the_bf16_pair_kind(case, seed):
    rows, k, n = case
    gen = case_generator(case, seed)
    total = sum(rows) + 256
    a1, a2 = (torch.randn((total, k), generator=gen, device="cuda").bfloat16() for _ in range(2))
    (w1, v1), (w2, v2) = (_weight(gen, len(rows), n, k, spread=4) for _ in range(2))
    poison_next_allocation((total, n), torch.bfloat16)
    got = grouped_gemm.linear_mx_sum([(a1, w1), (a2, w2)], segment_sizes(rows))
    assert got.dtype == torch.bfloat16
    ref = _segments_product([(a1, v1), (a2, v2)], rows, total, n)
    scale = ref.abs().max().clamp_min(1e-6).item()
    torch.testing.assert_close(got.float(), ref, rtol=2**-7, atol=2e-3 * scale)
    weights_t = [v.transpose(1, 2).contiguous() for v in (v1, v2)]
    before = grouped_gemm.linear_sum([(a1, weights_t[0]), (a2, weights_t[1])], segment_sizes(rows))
    torch.testing.assert_close(got.float(), before.float(), rtol=2**-7, atol=2e-3 * scale)
    assert (got[sum(rows) :] == 0).all(), "rows past the segments must be zeroed"


@pytest.mark.parametrize("spread", [0, 60, 135])
def test_one_hot_rows_give_the_dequantized_weights_bit_for_bit(spread, seed):
    """With one-hot activations each output is weight values times 1 (fp32 kind) and, for the
    pair, bf16(v1 + 2 v2) of one value of each weight: both sets' conversions, scale tiles and
    X descriptors must give mxfp8_dequantize's bits on either side of the pairs' seam (scale
    bytes past 240 and bf16 subnormal values at spread 135)."""
    experts, n, k = 3, 256, 512
    gen = case_generator((n, k, spread), seed)
    (w1, v1), (w2, v2) = (_weight(gen, experts, n, k, spread) for _ in range(2))
    eye = torch.eye(k, device="cuda").bfloat16().repeat(experts, 1)  # row r of a segment: column r
    counts = segment_sizes([k] * experts)
    got = grouped_gemm.linear_mx(eye, [w1], counts, out_dtype=torch.float32)[0]
    pair = grouped_gemm.linear_mx_sum([(eye, w1), (2 * eye, w2)], counts)
    for e in range(experts):
        segment = slice(e * k, (e + 1) * k)
        assert torch.equal(got[segment], v1[e].float().T), f"expert {e}"
        want = (v1[e].float() + 2 * v2[e].float()).T.bfloat16()
        assert torch.equal(pair[segment], want), f"expert {e}"


def test_padding_rows_and_repeats(seed):
    """Row sources skip each segment's trailing padding (NaN there stays out; those rows come
    back zero) and five launches of each kind give the same bits."""
    rows, k, n = [512, 256, 0, 768], 256, 384
    gen = case_generator("padding", seed)
    total = sum(rows) + 256
    source = torch.zeros(total, dtype=torch.int32, device="cuda")
    source[256:512] = -1  # expert 0's last 256 rows are padding
    source[sum(rows) :] = -1
    padding = source[:, None] < 0
    a1, a2 = (torch.randn((total, k), generator=gen, device="cuda") for _ in range(2))
    clean = [torch.where(padding, 0.0, a).bfloat16() for a in (a1, a2)]
    poisoned = [torch.where(padding, float("nan"), a).bfloat16() for a in (a1, a2)]
    (w1, _), (w2, _) = (_weight(gen, len(rows), n, k, spread=4) for _ in range(2))
    counts = segment_sizes(rows)
    want_h = grouped_gemm.linear_mx(clean[0], [w1], counts, out_dtype=torch.float32)[0]
    want_x = grouped_gemm.linear_mx_sum([(clean[0], w1), (clean[1], w2)], counts)
    for _ in range(5):
        poison_next_allocation((total, n), torch.float32)
        got_h = grouped_gemm.linear_mx(poisoned[0], [w1], counts, source, out_dtype=torch.float32)
        poison_next_allocation((total, n), torch.bfloat16)
        got_x = grouped_gemm.linear_mx_sum([(poisoned[0], w1), (poisoned[1], w2)], counts, source)
        assert torch.equal(got_h[0], want_h)
        assert torch.equal(got_x, want_x)
    assert (want_h[256:512] == 0).all() and (want_x[256:512] == 0).all()


def test_bad_arguments_raise_before_any_launch():
    counts = segment_sizes([256])
    a = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    data = torch.zeros(1, 128, 128, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.zeros(1, 1, 32, 16, dtype=torch.uint8, device="cuda")
    weight = grouped_gemm.MxWeightT(data, scales)
    with pytest.raises(ValueError, match="`out_dtype` must be torch.bfloat16 or torch.float32"):
        grouped_gemm.linear_mx(a, [weight], counts, out_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"terms\[1\]\[0\] \(a\)"):
        grouped_gemm.linear_mx_sum([(a, weight), (a[:128], weight)], counts)
    with pytest.raises(ValueError, match=r"terms\[1\]\[1\]\[1\] \(scales\)"):
        grouped_gemm.linear_mx_sum([(a, weight), (a, (data, scales[:, :, :16]))], counts)
    a_192 = torch.zeros(256, 192, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="N and K multiples of 128, got N=128, K=192"):
        grouped_gemm.linear_mx_sum([(a_192, weight), (a_192, weight)], counts)
    out = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    pair = grouped_gemm.Kind.M_GROUPED_MXFP8_NT_PAIR
    with pytest.raises(
        ValueError,
        match=r"variants \(M_GROUPED_BF16_NN_PAIR, M_GROUPED_MXFP8_NT_PAIR\) need their second",
    ):
        grouped_gemm._launch(pair, [(a, data, out)], counts, 128, 128, b_scales=[scales])
    with pytest.raises(ValueError, match="`d2` must be 0"):
        grouped_gemm._launch(pair, [(a, data, out), (a, data, out)], counts, 128, 128,
                          b_scales=[scales, scales])  # fmt: skip
    with pytest.raises(ValueError, match="`b2_scale` must be"):
        grouped_gemm._launch(pair, [(a, data, out), (a, data, None)], counts, 128, 128,
                          b_scales=[scales])  # fmt: skip
