"""The CUDA engine's GEMM glue (mok.backends.cuda.routed_gemms.GroupedGemms) against the
reference's masked products, on the CPU: torch._grouped_mm runs there too, so segment offsets,
the zeroed rows past the schedule and empty experts are checked in CI, not only on a GPU."""

from __future__ import annotations

import pytest
import torch

from mok import experts
from mok.backends.cuda.routed_gemms import GroupedGemms

SEGMENTS = {
    "balanced": [256, 256, 256],
    "empty-middle": [512, 0, 256],
    "empty-last": [256, 0, 0],
    "one-expert": [768],
}


def _schedule(tokens_per_expert: list[int], spare_rows: int = 256):
    counts = torch.tensor(tokens_per_expert, dtype=torch.int32)
    rows = int(counts.sum()) + spare_rows
    num_tokens = counts.sum().reshape(1).to(torch.int32)
    peer_rank = torch.zeros(rows, dtype=torch.int32)
    return (peer_rank, peer_rank.clone(), num_tokens, counts)


def _engines(tokens_per_expert):
    schedule = _schedule(tokens_per_expert)
    rows = schedule[0].shape[0]
    masked = experts.MaskedGemms(
        experts.row_experts(schedule[3], schedule[2], rows), len(tokens_per_expert)
    )
    return GroupedGemms(schedule, len(tokens_per_expert)), masked, rows


@pytest.mark.parametrize("segments", SEGMENTS.values(), ids=SEGMENTS.keys())
def test_linear_matches_masked_products(segments):
    grouped, masked, rows = _engines(segments)
    generator = torch.Generator().manual_seed(len(segments))
    a = torch.randn(rows, 128, generator=generator).bfloat16()
    weight = (torch.randn(len(segments), 64, 128, generator=generator) / 11).bfloat16()
    got, want = grouped.linear(a, weight), masked.linear(a, weight)
    used = sum(segments)
    assert torch.equal(got[used:], torch.zeros_like(got[used:]))  # rows past the schedule
    # grouped_mm stores bf16: one bf16 rounding of the fp32 product.
    torch.testing.assert_close(got, want.bfloat16().float(), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("segments", SEGMENTS.values(), ids=SEGMENTS.keys())
def test_weight_grad_matches_and_empty_experts_are_zero(segments):
    grouped, masked, rows = _engines(segments)
    generator = torch.Generator().manual_seed(7 + len(segments))
    d_out = torch.randn(rows, 64, generator=generator).bfloat16()
    a = torch.randn(rows, 128, generator=generator).bfloat16()
    got, want = grouped.weight_grad(d_out, a), masked.weight_grad(d_out, a)
    assert got.shape == (len(segments), 64, 128)
    for expert, count in enumerate(segments):
        if count == 0:
            assert not got[expert].any(), "an expert without rows must get an exact-zero gradient"
    torch.testing.assert_close(got, want.bfloat16().float(), rtol=2**-7, atol=1e-2)
