"""mok's grouped expert GEMMs (mok.backends.cuda.grouped_gemm) against fp32 products per segment.

One GPU, no process group. Segments follow the schedule's layout (rows per expert, read on the
device), including empty experts, a single huge expert and sizes that are not tile multiples;
outputs are poisoned with NaN before each launch so a row or expert the kernel skips shows.
Fresh random data every run (seed printed; replay with MOK_TEST_SEED).
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import (
    module_seed,
    poison_next_allocation,
    requires_gpu_module,
    skip_without_grouped_gemms,
)

from mok.backends.cuda import grouped_gemm

pytestmark = [pytest.mark.gpu, requires_gpu_module()]

# (rows per expert, K, N): the schedule pads to 256; the benchmarks also use ragged counts.
CASES = [
    ([256], 128, 256),
    ([512, 0, 256, 768], 256, 136),
    ([0, 0, 0], 128, 128),
    ([2048, 256, 0, 1024], 1024, 512),
    ([256, 256], 7168, 3072),
    ([100, 0, 37, 301], 512, 384),
]
IDS = [f"rows{'-'.join(map(str, r))}-K{k}-N{n}" for r, k, n in CASES]


seed = module_seed("grouped GEMM")


@pytest.fixture(autouse=True)
def _needs_kernels():
    skip_without_grouped_gemms()


def _randn(gen, *shape):
    return torch.randn(shape, generator=gen, device="cuda").bfloat16()


def _segments(rows):
    starts = [sum(rows[:e]) for e in range(len(rows))]
    return list(zip(starts, rows, strict=True))


def _setup(case, seed, extra_rows=256):
    rows, k, n = case
    gen = torch.Generator(device="cuda").manual_seed(seed + hash(str(case)) % 100_000)
    total = sum(rows) + extra_rows
    counts = torch.tensor(rows, dtype=torch.int32, device="cuda")
    return gen, counts, total, k, n


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _close(got, ref):
    """bf16/fp32 output vs the fp32 product: within bf16 rounding plus accumulation order."""
    got = got.float()
    scale = ref.abs().max().clamp_min(1e-6)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, rtol=2**-7, atol=2e-3 * scale.item())


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_linear_two_sets_match_segment_products(case, seed):
    gen, counts, total, k, n = _setup(case, seed)
    a = _randn(gen, total, k)
    w1, w2 = _randn(gen, len(case[0]), n, k), _randn(gen, len(case[0]), n, k)
    outs = [_poisoned((total, n), torch.bfloat16) for _ in range(2)]
    grouped_gemm._launch(
        grouped_gemm.Kind.M_GROUPED_BF16_NT, [(a, w1, outs[0]), (a, w2, outs[1])], counts, n, k,
        total,
    )  # fmt: skip
    for w, out in zip((w1, w2), outs, strict=True):
        ref = torch.zeros(total, n, device="cuda")
        for e, (start, r) in enumerate(_segments(case[0])):
            ref[start : start + r] = a[start : start + r].float() @ w[e].float().T
        _close(out, ref)
        assert (out[sum(case[0]) :] == 0).all(), "rows past the segments must be zeroed"
    alone = grouped_gemm.linear(a, [w2], counts)[0]
    assert torch.equal(alone, outs[1]), "a set's result must not depend on the launch's other set"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_linear_transposed_and_sum(case, seed):
    gen, counts, total, k, n = _setup(case, seed)
    experts = len(case[0])
    a1, a2 = _randn(gen, total, k), _randn(gen, total, k)
    w1, w2 = _randn(gen, experts, k, n), _randn(gen, experts, k, n)
    single = grouped_gemm.linear_transposed(a1, w1, counts)
    summed = grouped_gemm.linear_sum([(a1, w1), (a2, w2)], counts)
    ref1 = torch.zeros(total, n, device="cuda")
    ref2 = torch.zeros(total, n, device="cuda")
    for e, (start, r) in enumerate(_segments(case[0])):
        ref1[start : start + r] = a1[start : start + r].float() @ w1[e].float()
        ref2[start : start + r] = a2[start : start + r].float() @ w2[e].float()
    assert single.dtype == torch.float32 and summed.dtype == torch.bfloat16
    torch.testing.assert_close(single, ref1, rtol=1e-5, atol=1e-4 * ref1.abs().max().item())
    _close(summed, ref1 + ref2)
    assert (single[sum(case[0]) :] == 0).all() and (summed[sum(case[0]) :] == 0).all()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_weight_grads_and_empty_experts(case, seed):
    gen, counts, total, k, n = _setup(case, seed)
    experts = len(case[0])
    d1, d2, a = _randn(gen, total, n), _randn(gen, total, n), _randn(gen, total, k)
    outs = [_poisoned((experts, n, k), torch.bfloat16) for _ in range(2)]
    grouped_gemm._launch(
        grouped_gemm.Kind.K_GROUPED_BF16_TN, [(d1, a, outs[0]), (d2, a, outs[1])], counts, k, n
    )
    for d_out, out in zip((d1, d2), outs, strict=True):
        for e, (start, r) in enumerate(_segments(case[0])):
            if r == 0:
                assert (out[e] == 0).all() and not torch.signbit(out[e]).any(), "empty expert"
                continue
            ref = d_out[start : start + r].float().T @ a[start : start + r].float()
            _close(out[e], ref)


def _row_sources(case, gen):
    """The schedule's row sources for `case`: each segment ends in a random run of padding rows
    (-1; the whole segment for some), and one routed segment has a -1 row inside its routed rows.
    Returns (row_source int32 [total], skipped bool [total]): the rows no tile may touch, i.e. each
    segment's rows after its last routed one, at most the last 256 of them (the GEMM's rule)."""
    rows, _, _ = case
    total = sum(rows) + 256
    source = torch.full((total,), -1, dtype=torch.int32)
    skipped = torch.zeros(total, dtype=torch.bool)
    for start, r in _segments(rows):
        pad = int(torch.randint(0, min(r, 300) + 1, (1,), generator=gen, device="cuda"))
        routed = r - pad
        source[start : start + routed] = 0
        if routed > 2:
            source[start + routed // 2] = -1  # a hole: computed, it is not trailing padding
        skipped[start + max(routed, r - 256) : start + r] = True
    return source.cuda(), skipped.cuda()


def _poison_rows(t, skipped):
    """`t` with NaN in the skipped rows: a tile that reads one shows in every product."""
    return torch.where(skipped[:, None], float("nan"), t.float()).to(t.dtype)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_padding_rows_get_no_tiles(case, seed):
    """Given row sources, each segment's trailing padding rows are neither read nor computed:
    NaN there stays out of every result, those rows of D come out zero (D's memory NaN before
    the launch; two operand sets, whose groups are expert-major, so expert e's padding starts at
    its own segment's count), and a launch over zero padding rows equals the one without row
    sources bit for bit."""
    gen, counts, _, k, n = _setup(case, seed)
    source, skipped = _row_sources(case, gen)
    total, experts = source.shape[0], len(case[0])
    keep = (~skipped)[:, None]
    a = _randn(gen, total, k) * keep
    w, w2, w_t = _randn(gen, experts, n, k), _randn(gen, experts, n, k), _randn(gen, experts, k, n)
    d_out = _randn(gen, total, n) * keep
    full = {
        "linear": grouped_gemm.linear(a, [w], counts)[0],
        "linear2": grouped_gemm.linear(a, [w2], counts)[0],
        "sum": grouped_gemm.linear_sum([(a, w_t), (a, w_t)], counts),
        "wgrad": grouped_gemm.weight_grads([(d_out, a)], counts)[0],
    }
    a_nan, d_nan = _poison_rows(a, skipped), _poison_rows(d_out, skipped)
    poison_next_allocation((total, n), torch.bfloat16, count=3)
    linear, linear2 = grouped_gemm.linear(a_nan, [w, w2], counts, source)
    skip = {
        "linear": linear,
        "linear2": linear2,
        "sum": grouped_gemm.linear_sum([(a_nan, w_t), (a_nan, w_t)], counts, source),
        "wgrad": grouped_gemm.weight_grads([(d_nan, a_nan)], counts, source)[0],
    }
    for name, got in skip.items():
        assert torch.equal(got, full[name]), f"{name}: padding rows changed the result"
    for name in ("linear", "linear2", "sum"):
        assert (skip[name][skipped] == 0).all(), f"{name}: a padding row is not zero"


def test_two_sets_zero_each_experts_own_padding(seed):
    """With two operand sets (gate and up), each expert's padding rows come out zero from its
    own routed count: counts falling expert by expert, so zeroing from another group's count
    (d753745's bug: group e is expert e / 2 here) leaves rows of D unwritten (NaN below)."""
    gen, counts, _, k, n = _setup(([512, 512, 512], 256, 128), seed)
    source = torch.full((sum(counts.tolist()),), -1, dtype=torch.int32, device="cuda")
    for start, routed in ((0, 500), (512, 300), (1024, 100)):
        source[start : start + routed] = 0
    a = _randn(gen, source.shape[0], k) * (source >= 0)[:, None]
    w, w2 = _randn(gen, 3, n, k), _randn(gen, 3, n, k)
    poison_next_allocation((source.shape[0], n), torch.bfloat16, count=2)
    for name, got in zip(
        ("gate", "up"), grouped_gemm.linear(a, [w, w2], counts, source), strict=True
    ):
        assert (got[source < 0] == 0).all(), f"{name}: a padding row is not zero"


def test_repeated_launches_are_bitwise_identical(seed):
    gen, counts, total, k, n = _setup(CASES[3], seed)
    a, w = _randn(gen, total, k), _randn(gen, len(CASES[3][0]), n, k)
    d_out = _randn(gen, total, n)
    terms = [(d_out, w), (_randn(gen, total, n), _randn(gen, len(CASES[3][0]), n, k))]

    def launches():
        return (
            grouped_gemm.linear(a, [w], counts)[0],
            grouped_gemm.weight_grads([(d_out, a)], counts)[0],
            grouped_gemm.linear_sum(terms, counts),
        )

    first = launches()
    for _ in range(4):
        assert all(torch.equal(x, y) for x, y in zip(first, launches(), strict=True))


def test_bad_arguments_raise_before_any_launch():
    counts = torch.tensor([256], dtype=torch.int32, device="cuda")
    a = torch.zeros(256, 100, dtype=torch.bfloat16, device="cuda")  # K = 100: not a multiple of 8
    w = torch.zeros(1, 128, 100, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="`k` must be a positive multiple of 8"):
        grouped_gemm.linear(a, [w], counts)
    a = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    pair = grouped_gemm.Kind.M_GROUPED_BF16_NN_PAIR
    with pytest.raises(
        ValueError,
        match=r"variants \(M_GROUPED_BF16_NN_PAIR, M_GROUPED_MXFP8_NT_PAIR\) need their second",
    ):
        grouped_gemm._launch(pair, [(a, w, out)], counts, 128, 128)
    with pytest.raises(ValueError, match="`d2` must be 0"):
        grouped_gemm._launch(pair, [(a, w, out), (a, w, out)], counts, 128, 128)
    a_96 = torch.zeros(256, 96, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(
        ValueError,
        match=r"`k` must be a multiple of 64 for the pair variants \(M_GROUPED_BF16_NN_PAIR",
    ):
        grouped_gemm._launch(pair, [(a_96, w, out), (a_96, w, None)], counts, 128, 96)
    with pytest.raises(ValueError, match="`kind` must be in"):
        grouped_gemm._launch(10, [(a, w, out)], counts, 128, 128)
