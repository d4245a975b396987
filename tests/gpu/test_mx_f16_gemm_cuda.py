"""The MXFP8 GEMM on f16 operands rebased per row (f16_rows.linear_mx_f16,
M_GROUPED_MXFP8_NT_F16_ROWS) against M_GROUPED_MXFP8_NT (bf16 operands) on the same MXFP8-rounded
rows and weights, and the rebasing helpers.

One GPU. Weights are quantized by mok's kernel from fresh random bf16 (seed printed; replay with
MOK_TEST_SEED); activations are MXFP8-rounded like the forward's; outputs poisoned with NaN.
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import case_generator, module_seed, requires_gpu_module, spread_mxfp8_weight

from mok.backends.cuda import grouped_gemm, mxfp8
from mok.backends.cuda.experimental import f16_rows

pytestmark = [pytest.mark.gpu, requires_gpu_module(), pytest.mark.usefixtures("grouped_gemms")]

CASES = [
    ([256], 128, 128),
    ([512, 0, 256, 768], 256, 384),
    ([100, 0, 37, 301], 512, 640),
    ([256, 256], 7168, 3072),
]
IDS = [f"rows{'-'.join(map(str, r))}-K{k}-N{n}" for r, k, n in CASES]

seed = module_seed("f16 MXFP8 GEMM")


def _weight(gen, experts, n, k, spread: int):
    return grouped_gemm.MxWeight(*spread_mxfp8_weight(gen, experts, n, k, spread))


def _rounded_rows(gen, total, k, spread: int):
    """MXFP8-rounded bf16 rows whose magnitudes vary by 2^spread from row to row."""
    padded = -(-total // 128) * 128  # mxfp8_round takes whole 128-row tiles
    x = torch.randn((padded, k), generator=gen, device="cuda")
    x = x * 2.0 ** torch.randint(-spread, spread + 1, (padded, 1), generator=gen, device="cuda")
    return mxfp8.mxfp8_round(x.bfloat16())[0][:total].contiguous()


def test_rebase_rows_is_exact_on_rounded_rows(seed):
    x = _rounded_rows(case_generator("rebase", seed), 512, 1024, spread=40)
    values, exponents = f16_rows.rebase_rows(x)
    assert values.dtype == torch.float16 and exponents.dtype == torch.uint8
    back = values.float() * torch.exp2(exponents.float() - 127)[:, None]
    assert torch.equal(back, x.float())
    peak = values.float().abs().amax(dim=1)
    assert ((peak >= 2**14) & (peak < 2**15)).all()


def test_row_exponents_follow_each_rows_largest(seed):
    """Each bf16 row's biased exponent of its largest |x| minus 14, at least 0: zero and tiny
    rows give 0, a NaN row 241 (its values are NaN whatever the factor)."""
    gen = case_generator("row-exponents", seed)
    x = torch.randn((300, 136), generator=gen, device="cuda")
    x = (x * 2.0 ** torch.randint(-130, 120, (300, 1), generator=gen, device="cuda")).bfloat16()
    x[3], x[7, 5] = 0.0, float("nan")
    got = f16_rows.row_exponents(x)
    _, exponent = torch.frexp(x.float().abs().amax(dim=1))  # [2^(k-1), 2^k): k
    want = torch.where(x.isnan().any(dim=1), 241, (exponent - 1 + 113).clamp(0, 254))
    want[3] = 0
    assert torch.equal(got.int(), want.int())


def _reference_rebase(scales):
    """rebase_weight's row exponents and factor bits in torch, entry by entry: row r of a tile,
    K block b at [r % 32, 4 (r / 32) + b]."""
    tiles = scales.view(scales.shape[0], scales.shape[1], 32, 4, 4).int()
    largest = torch.where(tiles == 255, 0, tiles).amax(dim=(1, 4))  # [tiles, r % 32, r / 32]
    row_exponents = (largest - 7).clamp(0, 254)  # [tiles, 32, 4]
    exponent = tiles - row_exponents[:, None, :, :, None]
    factors = torch.exp2(exponent.clamp(max=15).float()).half()
    factors = torch.where(tiles == 255, torch.nan, factors).view(torch.int16)
    return row_exponents.transpose(1, 2).reshape(-1), factors.view(scales.shape)


@pytest.mark.parametrize("spread", [4, 60])
def test_rebase_weight_matches_the_scale_bytes(spread, seed):
    """Row exponents (largest scale byte - 7, NaN bytes left out) and f16 factors 2^(E - R)
    (zero under 2^-24, NaN for byte 255) bit for bit as the torch formulas give them."""
    weight = _weight(case_generator(("rebase-weight", spread), seed), 2, 256, 512, spread=spread)
    weight.scales[1, 2, 5, 9] = 255  # a NaN scale byte
    weight.scales[0, 1, 3, 2] = 0  # 2^-127: far more than 24 binades under its row's largest
    got = f16_rows.rebase_weight(weight)
    want_rows, want_factors = _reference_rebase(weight.scales)
    assert got.data.data_ptr() == weight.data.data_ptr(), "the E4M3 bytes are read as stored"
    assert torch.equal(got.row_exponents.int(), want_rows)
    assert torch.equal(got.factors, want_factors)
    assert got.factors[0, 1, 3, 2] == 0 and got.factors[1, 2, 5, 9] == 0x7E00


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("spread", [4, 60])
def test_matches_m_grouped_mxfp8_nt_bit_for_bit(case, spread, seed):
    """The f16 products are M_GROUPED_MXFP8_NT's bf16 products times a power of two per row, so the
    fp32 sums and the bf16 outputs are the same bits (weight rows spanning 2^+-spread, activation
    rows 2^+-10: the products stay normal fp32 values in both kinds)."""
    rows, k, n = case
    gen = case_generator((case, spread), seed)
    total, experts = sum(rows) + 256, len(rows)
    x = _rounded_rows(gen, total, k, spread=10)
    w1, w2 = (_weight(gen, experts, n, k, spread) for _ in range(2))
    counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
    want = grouped_gemm.linear_mx(x, [w1, w2], counts)
    rebased = [f16_rows.rebase_weight(w) for w in (w1, w2)]
    got = f16_rows.linear_mx_f16(f16_rows.rebase_rows(x), rebased, counts)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16
        assert torch.equal(g, w)
        assert (g[sum(rows) :] == 0).all(), "rows past the segments must be zeroed"


def test_nan_weights_and_repeats(seed):
    """A NaN weight byte makes its output column NaN, as mxfp8_dequantize's value does; five
    launches give the same bits."""
    gen = case_generator("nan", seed)
    counts = torch.tensor([256, 256], dtype=torch.int32, device="cuda")
    x = _rounded_rows(gen, 512, 256, spread=4)
    weight = _weight(gen, 2, 128, 256, spread=4)
    weight.data.view(torch.uint8)[1, 5, 3] = 0x7F
    a, weight = f16_rows.rebase_rows(x), f16_rows.rebase_weight(weight)
    first = f16_rows.linear_mx_f16(a, [weight], counts)[0]
    assert first[256:, 5].isnan().all() and not first[:256].isnan().any()
    assert not first[256:, :5].isnan().any()
    for _ in range(5):
        again = f16_rows.linear_mx_f16(a, [weight], counts)[0]
        assert torch.equal(again.view(torch.int16), first.view(torch.int16))


def test_bad_arguments_raise_before_any_launch():
    counts = torch.tensor([256], dtype=torch.int32, device="cuda")
    data = torch.zeros(1, 128, 128, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.zeros(1, 1, 32, 16, dtype=torch.uint8, device="cuda")
    bf16_rows = f16_rows.RebasedRows(
        torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda"),
        torch.zeros(256, dtype=torch.uint8, device="cuda"),
    )
    weight = f16_rows.rebase_weight((data, scales))
    with pytest.raises(TypeError, match="a.values"):
        f16_rows.linear_mx_f16(bf16_rows, [weight], counts)
    short = f16_rows.RebasedRows(bf16_rows.values.half(), bf16_rows.exponents[:100])
    with pytest.raises(ValueError, match="a.exponents"):
        f16_rows.linear_mx_f16(short, [weight], counts)
    half_rows = f16_rows.RebasedRows(bf16_rows.values.half(), bf16_rows.exponents)
    with pytest.raises(TypeError, match="must be a RebasedWeight"):
        f16_rows.linear_mx_f16(half_rows, [(data, scales)], counts)
    with pytest.raises(ValueError, match="weight.scales"):
        f16_rows.rebase_weight((data, scales[:, :, :16]))
    out = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    a = bf16_rows.values.half()
    with pytest.raises(ValueError, match="`a_exponent` must be"):
        grouped_gemm._launch(grouped_gemm.Kind.M_GROUPED_MXFP8_NT_F16_ROWS, [(a, data, out)],
        counts, 128, 128,
                          b_scales=[scales])  # fmt: skip
    with pytest.raises(ValueError, match="are for M_GROUPED_MXFP8_NT_F16_ROWS only"):
        exponents = (bf16_rows.exponents, [bf16_rows.exponents])
        grouped_gemm._launch(grouped_gemm.Kind.M_GROUPED_MXFP8_NT, [(a, data, out)], counts, 128,
        128,
                          b_scales=[scales], exponents=exponents)  # fmt: skip
