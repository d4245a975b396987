"""The grouped GEMM that reads MXFP8 weights as stored (grouped_gemm.linear_mx, M_GROUPED_MXFP8_NT)
against the bf16 GEMM (M_GROUPED_BF16_NT) on the same weights' mxfp8_dequantize values and against
fp32 products.

One GPU. Weights are quantized by mok's kernel from fresh random bf16 (seed printed; replay with
MOK_TEST_SEED), with rows spanning many scale exponents so that every scale path is exercised;
outputs whose rows past the segments are checked for zeros are NaN before their launch
(gpu_helpers.poison_next_allocation).
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import (
    case_generator,
    module_seed,
    poison_next_allocation,
    requires_gpu_module,
    spread_mxfp8_weight,
)

from mok.backends.cuda import grouped_gemm, mxfp8

pytestmark = [pytest.mark.gpu, requires_gpu_module(), pytest.mark.usefixtures("grouped_gemms")]

# (rows per expert, K, N) with K and N whole scale tiles; ragged and empty segments included.
CASES = [
    ([256], 128, 128),
    ([512, 0, 256, 768], 256, 384),
    ([0, 0, 0], 128, 128),
    ([2048, 256, 0, 1024], 1024, 512),
    ([256, 256], 7168, 3072),
    ([100, 0, 37, 301], 512, 640),
    ([2048, 2048, 1024, 2048], 1024, 2048),  # ~7 work tiles per CTA
]
IDS = [f"rows{'-'.join(map(str, r))}-K{k}-N{n}" for r, k, n in CASES]

seed = module_seed("MXFP8-weight GEMM")


def _weight(gen, experts, n, k, spread: int):
    """(MxWeight, bf16 dequantized values) of gpu_helpers.spread_mxfp8_weight's weight."""
    data, scales = spread_mxfp8_weight(gen, experts, n, k, spread)
    return grouped_gemm.MxWeight(data, scales), mxfp8.mxfp8_dequantize(data, scales)


def _close(got, ref):
    got = got.float()
    assert torch.isfinite(got).all()
    scale = ref.abs().max().clamp_min(1e-6)
    torch.testing.assert_close(got, ref, rtol=2**-7, atol=2e-3 * scale.item())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_bf16_gemm_on_dequantized_weights(case, seed):
    rows, k, n = case
    gen = case_generator(case, seed)
    total, experts = sum(rows) + 256, len(rows)
    a = torch.randn((total, k), generator=gen, device="cuda").bfloat16()
    (w1, v1), (w2, v2) = (_weight(gen, experts, n, k, spread=4) for _ in range(2))
    counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
    poison_next_allocation((total, n), torch.bfloat16, count=2)
    got = grouped_gemm.linear_mx(a, [w1, w2], counts)
    want = grouped_gemm.linear(a, [v1, v2], counts)
    starts = [sum(rows[:e]) for e in range(experts)]
    for out, bf16_out, values in zip(got, want, (v1, v2), strict=True):
        ref = torch.zeros(total, n, device="cuda")
        for e, (start, r) in enumerate(zip(starts, rows, strict=True)):
            ref[start : start + r] = a[start : start + r].float() @ values[e].float().T
        _close(out, ref)
        # The same bf16 products in another fp32 summation order: a rounding apart at most.
        _close(out, bf16_out.float())
        assert (out[sum(rows) :] == 0).all(), "rows past the segments must be zeroed"


@pytest.mark.parametrize("spread", [0, 60, 135])
def test_selecting_rows_returns_the_dequantized_weight_bit_for_bit(spread, seed):
    """With one-hot activations each output is one weight value times 1: the conversion inside
    the GEMM must give mxfp8_dequantize's bf16 bits for every scale (subnormal results at
    spread 135, scale bytes past 240), as the bf16 GEMM on those values does."""
    n, k = 256, 512
    gen = case_generator((n, k, spread), seed)
    weight, values = _weight(gen, 2, n, k, spread)
    a = torch.eye(k, device="cuda").bfloat16().repeat(2, 1)  # expert e's rows select column r
    counts = torch.tensor([k, k], dtype=torch.int32, device="cuda")
    got = grouped_gemm.linear_mx(a, [weight], counts)[0]
    want = grouped_gemm.linear(a, [values], counts)[0]
    assert torch.equal(got, want)
    for e in range(2):
        assert torch.equal(got[e * k : (e + 1) * k], values[e].T)


def test_many_work_tiles_per_cta_return_the_dequantized_weights_bit_for_bit(seed):
    """Eight experts' gate and up weights, one-hot activations: ~4 work tiles per CTA (two sets
    x 8 experts x 16 x 2 tiles on 132 SMs), so the persistent CTAs move on through the pipeline's
    stages across expert and set changes (the smaller cases give a CTA one tile). Each output
    must be its weight's dequantized value, bit for bit."""
    experts, n, k = 8, 2048, 512
    gen = case_generator("many tiles", seed)
    (w1, v1), (w2, v2) = (_weight(gen, experts, n, k, spread=60) for _ in range(2))
    a = torch.eye(k, device="cuda").bfloat16().repeat(experts, 1)
    counts = torch.full((experts,), k, dtype=torch.int32, device="cuda")
    outputs = grouped_gemm.linear_mx(a, [w1, w2], counts)
    for got, values in zip(outputs, (v1, v2), strict=True):
        for e in range(experts):
            assert torch.equal(got[e * k : (e + 1) * k], values[e].T), f"expert {e}"


def test_nan_weights_and_nan_scales_give_nan_where_dequantize_does(seed):
    """E4M3 NaN bytes (0x7F, 0xFF) and E8M0 NaN scale bytes (255) among ordinary ones, with
    one-hot activations: a weight row holding a NaN value makes its whole output column NaN
    (0 * NaN), as the bf16 GEMM on mxfp8_dequantize's values gives; every other output is that
    row's dequantized value, bit for bit (zero scale bytes, 2^-127, included)."""
    n, k = 256, 256
    gen = case_generator("nan", seed)
    weight, _ = _weight(gen, 1, n, k, spread=130)
    data = weight.data.view(torch.uint8).clone()
    nan_at = torch.rand(data.shape, generator=gen, device="cuda") < 0.001
    data[nan_at] = torch.where(torch.rand(data.shape, generator=gen, device="cuda") < 0.5,
                               0x7F, 0xFF)[nan_at].to(torch.uint8)  # fmt: skip
    scales = weight.scales.clone()
    scales.view(-1)[torch.randperm(scales.numel(), generator=gen, device="cuda")[:8]] = 255
    scales.view(-1)[torch.randperm(scales.numel(), generator=gen, device="cuda")[:8]] = 0
    pair = grouped_gemm.MxWeight(data.view(torch.float8_e4m3fn), scales)
    values = mxfp8.mxfp8_dequantize(*pair)
    a = torch.eye(k, device="cuda").bfloat16()
    counts = torch.tensor([k], dtype=torch.int32, device="cuda")
    got = grouped_gemm.linear_mx(a, [pair], counts)[0]
    want = grouped_gemm.linear(a, [values], counts)[0]
    nan_rows = values[0].isnan().any(dim=1)
    assert 0 < int(nan_rows.sum()) < n
    assert torch.equal(got.isnan(), nan_rows[None, :].expand(k, n))
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[:, ~nan_rows], values[0][~nan_rows].T)


def test_padding_rows_and_repeats(seed):
    """Row sources skip each segment's trailing padding (NaN there stays out, those rows are
    zero) and five launches give the same bits."""
    rows, k, n = [512, 256, 0, 768], 256, 384
    gen = case_generator("padding", seed)
    total = sum(rows) + 256
    counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
    source = torch.zeros(total, dtype=torch.int32, device="cuda")
    source[256:512] = -1  # expert 0's last 256 rows are padding
    source[sum(rows) :] = -1
    a = torch.randn((total, k), generator=gen, device="cuda").bfloat16()
    clean = torch.where(source[:, None] < 0, 0.0, a.float()).bfloat16()
    poisoned = torch.where(source[:, None] < 0, float("nan"), a.float()).bfloat16()
    weight, _ = _weight(gen, len(rows), n, k, spread=4)
    want = grouped_gemm.linear_mx(clean, [weight], counts)[0]
    for _ in range(5):
        got = grouped_gemm.linear_mx(poisoned, [weight], counts, source)[0]
        assert torch.equal(got, want)
    assert (want[256:512] == 0).all()


@pytest.mark.parametrize("gemm", ["mxfp8_nt", "mxfp8_nt_f32", "bf16_nt"])
@pytest.mark.parametrize("used", [1, 37, 64, 65, 128, 129, 255, 256 + 37])
def test_partly_used_last_tiles_give_the_whole_tiles_bits(used, gemm, seed):
    """A segment whose routed rows end inside a tile, NaN in its padding rows (fewer than 256,
    as the schedule pads): the GEMM's tiles stop at the last routed row (TMA's zero fill past
    it, nothing stored there), so the padding rows must be zero and the routed rows must have
    the bits of the same segment computed whole with zero rows there (M_GROUPED_MXFP8_NT: bf16
    D, M_GROUPED_MXFP8_NT_F32: fp32 D, M_GROUPED_BF16_NT: the bf16 GEMM on the dequantized
    weight)."""
    rows, k, n = [-(-used // 256) * 256, 256], 512, 384
    gen = case_generator(("partly used", used, gemm), seed)
    total = sum(rows)
    counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
    source = torch.zeros(total, dtype=torch.int32, device="cuda")
    source[used : rows[0]] = -1  # expert 0 uses its first `used` rows
    a = torch.randn((total, k), generator=gen, device="cuda").bfloat16()
    clean = torch.where(source[:, None] < 0, 0.0, a.float()).bfloat16()
    poisoned = torch.where(source[:, None] < 0, float("nan"), a.float()).bfloat16()
    weight, values = _weight(gen, len(rows), n, k, spread=4)

    def linear(x, row_source=None):
        if gemm == "bf16_nt":
            return grouped_gemm.linear(x, [values], counts, row_source)[0]
        dtype = torch.float32 if gemm == "mxfp8_nt_f32" else torch.bfloat16
        return grouped_gemm.linear_mx(x, [weight], counts, row_source, out_dtype=dtype)[0]

    want = linear(clean)
    got = linear(poisoned, source)
    assert (got[used : rows[0]] == 0).all(), "padding rows must be zero"
    assert torch.equal(got, want)


def test_bad_arguments_raise_before_any_launch():
    counts = torch.tensor([256], dtype=torch.int32, device="cuda")
    a = torch.zeros(256, 192, dtype=torch.bfloat16, device="cuda")
    data = torch.zeros(1, 128, 192, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.zeros(1, 1, 32, 16, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="N and K multiples of 128, got N=128, K=192"):
        grouped_gemm.linear_mx(a, [(data, scales)], counts)
    out = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"K_GROUPED_MXFP8_TN\) need `n` and `k` multiples of 128"):
        grouped_gemm._launch(grouped_gemm.Kind.M_GROUPED_MXFP8_NT, [(a, data, out)], counts, 128,
        192,
                          b_scales=[scales])  # fmt: skip
    with pytest.raises(ValueError, match="`b_scale` must be"):
        grouped_gemm._launch(
            grouped_gemm.Kind.M_GROUPED_MXFP8_NT, [(a, data, out)], counts, 128, 128
        )
    with pytest.raises(ValueError, match=r"must be 0 except for the MXFP8 variants"):
        grouped_gemm._launch(grouped_gemm.Kind.M_GROUPED_BF16_NT, [(a, data, out)], counts, 128,
        128,
                          b_scales=[scales])  # fmt: skip
