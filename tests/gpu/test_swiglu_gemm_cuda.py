"""The forward's gate/up GEMM with SwiGLU in its epilogue (experimental: linear_swiglu,
M_GROUPED_BF16_NT_SWIGLU) against the two steps it replaces: the bf16 GEMM (M_GROUPED_BF16_NT)
over gate and up, then mok's SwiGLU kernel on their bf16 values. The fused kernel must give their
bits, clamp or not.

One GPU. Fresh random data every run (seed printed; replay with MOK_TEST_SEED); every output
is poisoned with NaN before the launch, so a row or column the kernel skips shows.
"""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import module_seed, requires_gpu_module, skip_without_grouped_gemms

from mok.backends.cuda import elementwise, grouped_gemm
from mok.backends.cuda.experimental import swiglu_epilogue

pytestmark = [pytest.mark.gpu, requires_gpu_module()]

# (rows per expert, K, N): ragged and empty segments, rows that are not tile multiples, N one
# tile or many, the DeepSeek-V4-Pro-like K and N.
CASES = [
    ([256], 128, 128),
    ([512, 0, 256, 768], 256, 384),
    ([0, 0, 0], 128, 128),
    ([100, 0, 37, 301], 520, 640),
    ([256, 256], 7168, 3072),
]
IDS = [f"rows{'-'.join(map(str, r))}-K{k}-N{n}" for r, k, n in CASES]
LIMITS = [None, 1.5, 0.0]

seed = module_seed("SwiGLU GEMM")


@pytest.fixture(autouse=True)
def _needs_kernels():
    skip_without_grouped_gemms()


def _operands(case, seed, extra_rows=256):
    rows, k, n = case
    gen = torch.Generator(device="cuda").manual_seed(seed + hash(str(case)) % 100_000)
    total = sum(rows) + extra_rows
    a = torch.randn((total, k), generator=gen, device="cuda").bfloat16()
    gate_w, up_w = (
        (torch.randn((len(rows), n, k), generator=gen, device="cuda") / k**0.5).bfloat16()
        for _ in range(2)
    )
    return a, gate_w, up_w, torch.tensor(rows, dtype=torch.int32, device="cuda")


def _fused(a, gate_w, up_w, counts, limit, row_source=None, zero_rest=True):
    """Kind 5 into NaN-poisoned outputs -> (gate, up, hidden)."""
    n = gate_w.shape[1]
    outs = [torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
            for _ in range(3)]  # fmt: skip
    sets = [(a, gate_w, outs[0]), (a, up_w, outs[1])]
    total_rows = a.shape[0] if zero_rest else 0
    grouped_gemm._launch(grouped_gemm.Kind.M_GROUPED_BF16_NT_SWIGLU, sets, counts, n, a.shape[1],
    total_rows,
                      row_source, hidden=outs[2], limit=limit)  # fmt: skip
    return outs


def _unfused(a, gate_w, up_w, counts, limit, row_source=None):
    gate, up = grouped_gemm.linear(a, [gate_w, up_w], counts, row_source)
    used = counts.sum(dtype=torch.int32).reshape(1)
    return gate, up, elementwise.swiglu(gate, up, used, limit)


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_is_the_gemm_then_swiglu_bit_for_bit(case, limit, seed):
    a, gate_w, up_w, counts = _operands(case, seed)
    got = _fused(a, gate_w, up_w, counts, limit)
    want = _unfused(a, gate_w, up_w, counts, limit)
    for name, g, w in zip(("gate", "up", "hidden"), got, want, strict=True):
        assert torch.equal(g, w), f"{name} differs from the unfused steps"
    rows = sum(case[0])
    assert all((t[rows:] == 0).all() for t in got), "rows past the segments must be zeroed"
    # And the products themselves (the unfused steps could share a mistake): fp32 per segment.
    start = 0
    for e, r in enumerate(case[0]):
        ref = a[start : start + r].float() @ up_w[e].float().T
        torch.testing.assert_close(got[1][start : start + r].float(), ref, rtol=2**-7, atol=1e-2)
        start += r


def test_padding_rows_are_skipped_and_repeats_are_identical(seed):
    """Row sources leave each segment's trailing padding out (NaN there stays out of every
    output, whose padding rows are zero), and five launches give the same bits."""
    case = ([512, 256, 0, 768], 256, 384)
    a, gate_w, up_w, counts = _operands(case, seed)
    source = torch.zeros(a.shape[0], dtype=torch.int32, device="cuda")
    source[256:512] = -1  # expert 0's last 256 rows are padding
    source[sum(case[0]) :] = -1
    clean = torch.where(source[:, None] < 0, 0.0, a.float()).bfloat16()
    poisoned = torch.where(source[:, None] < 0, float("nan"), a.float()).bfloat16()
    want = _unfused(clean, gate_w, up_w, counts, 2.0)
    for _ in range(5):
        got = _fused(poisoned, gate_w, up_w, counts, 2.0, source)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
    assert all((t[256:512] == 0).all() for t in want)


def test_linear_swiglu_entry_point(seed):
    """The public form allocates its outputs and gives the same bits."""
    a, gate_w, up_w, counts = _operands(CASES[1], seed)
    got = swiglu_epilogue.linear_swiglu(a, gate_w, up_w, counts, limit=3.0)
    want = _unfused(a, gate_w, up_w, counts, 3.0)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_bad_arguments_raise_before_any_launch():
    counts = torch.tensor([256], dtype=torch.int32, device="cuda")
    a = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(1, 192, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="N a multiple of 128, got N=192"):
        swiglu_epilogue.linear_swiglu(a, w, w, counts)
    w = torch.zeros(1, 128, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="`limit` must be None or finite and >= 0"):
        swiglu_epilogue.linear_swiglu(a, w, w, counts, limit=-1.0)
    out = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="M_GROUPED_BF16_NT_SWIGLU needs the up set"):
        grouped_gemm._launch(grouped_gemm.Kind.M_GROUPED_BF16_NT_SWIGLU, [(a, w, out)], counts,
        128, 128,
                          hidden=out)  # fmt: skip
    with pytest.raises(ValueError, match="are for M_GROUPED_BF16_NT_SWIGLU only"):
        grouped_gemm._launch(
            grouped_gemm.Kind.M_GROUPED_BF16_NT, [(a, w, out)], counts, 128, 128, hidden=out
        )
    with pytest.raises(ValueError, match="`hidden` must be"):
        grouped_gemm._launch(grouped_gemm.Kind.M_GROUPED_BF16_NT_SWIGLU, [(a, w, out), (a, w,
        out)], counts,
                          128, 128)  # fmt: skip
