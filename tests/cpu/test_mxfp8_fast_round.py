"""The CUDA kernels' fast MXFP8 rounding form (csrc/mxfp8/round.cuh) against the
reference, for every finite bf16 value and every scale exponent the form covers.

The kernels round the elements of most blocks to what a GEMM reads (bf16 of the E4M3 element
times 2^e) with `(|x| + c) - c`, c = 2^(max(E_x, e - 6) + 20), in fp32 with round to nearest
even, put the sign back and keep the high 16 bits; blocks with a scale exponent outside
[kFastMinExponent, kFastMaxExponent] (or a NaN) take the exact form. This test computes that form
with the same IEEE fp32 operations on the CPU and reads the range from the header, so a range or
a derivation that breaks bit equality with quantize + dequantize fails here, without a GPU; the
GPU tests check the kernels themselves bit for bit (tests/gpu/test_mxfp8_cuda.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from mok import mxfp8

HEADER = Path(__file__).resolve().parents[2] / "csrc" / "mxfp8" / "round.cuh"
if not HEADER.exists():
    pytest.skip(f"csrc/ is not next to the tests ({HEADER})", allow_module_level=True)

EXPONENT_FIELD = 0x7F800000
MAGNITUDE = 0x7FFFFFFF
SIGN = -0x80000000  # int32 bit 31


def _constant(name: str) -> int:
    found = re.search(rf"constexpr int {name} = (-?\d+);", HEADER.read_text())
    assert found, f"{name} not found in {HEADER}"
    return int(found.group(1))


def _finite_bf16() -> torch.Tensor:
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = values.view(torch.bfloat16).float()
    return values[torch.isfinite(values)]


def _fast_form(x: torch.Tensor, e: int) -> torch.Tensor:
    """rounded_value_fast(x, fast_floor_bits(e, false)) as the kernels compute it (fp32)."""
    bits = x.view(torch.int32)
    floor_bits = (e - 6 + 127) << 23
    magic = (torch.clamp(bits & EXPONENT_FIELD, min=floor_bits) + (20 << 23)).view(torch.float32)
    magnitude = (bits & MAGNITUDE).view(torch.float32)
    rounded = (magnitude + magic) - magic
    return (rounded.view(torch.int32) | (bits & SIGN)).view(torch.float32)


def test_range_keeps_the_floor_normal_and_the_constant_finite():
    """fast_floor_bits' value 0 means "not covered", so e - 6 must keep a normal exponent field;
    a block's largest |x| <= 448 * 2^e has E <= e + 8, and 2^(E + 20) must stay finite."""
    low, high = _constant("kFastMinExponent"), _constant("kFastMaxExponent")
    assert low <= high
    assert low - 6 + 127 >= 1
    assert high + 8 + 20 + 127 <= 254


def test_fast_form_is_quantize_then_dequantize_for_every_bf16():
    x = _finite_bf16()
    mismatches = []
    for e in range(_constant("kFastMinExponent"), _constant("kFastMaxExponent") + 1):
        block = x[x.abs() <= 448.0 * 2.0**e]  # the values a block with scale 2^e can hold
        want = (mxfp8.to_e4m3(block * 2.0**-e).float() * 2.0**e).to(torch.bfloat16)
        got = _fast_form(block, e).view(torch.int32)
        low_bits_set = (got & 0xFFFF) != 0  # the kernels keep the high half (pack_exact_bf16x2)
        high = (got >> 16).to(torch.int16)
        wrong = low_bits_set | (high != want.view(torch.int16))
        if wrong.any():
            first = block[wrong][0].item()
            mismatches.append(f"e={e}: {int(wrong.sum())} values, first x={first!r}")
    assert not mismatches, "; ".join(mismatches[:5])


PACKED_FORM = "return (word + 0x00070007u + ((word >> 4) & 0x00010001u)) & 0xfff0fff0u;"


def _packed_form(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """rounded_pair_packed on words of two bf16 (int64 bit patterns of the halves), in 32 bits:
    the header's expression, which the test checks is still the one computed here."""
    assert PACKED_FORM in HEADER.read_text(), f"rounded_pair_packed changed in {HEADER}"
    word = (high << 16) | low
    rounded = (word + 0x00070007 + ((word >> 4) & 0x00010001)) & 0xFFF0FFF0
    return rounded & 0xFFFFFFFF


def test_packed_form_is_quantize_then_dequantize_at_and_above_the_floor():
    """The packed form, which the kernels take for a chunk whose magnitudes are all at least the
    block's floor 2^(e-6), rounds both halves of a word as quantize + dequantize does, for every
    such bf16 (each value once in the high half and once in the low half, beside another)."""
    x = _finite_bf16()
    mismatches = []
    for e in range(_constant("kFastMinExponent"), _constant("kFastMaxExponent") + 1):
        floor = 2.0 ** (e - 6)
        block = x[(x.abs() <= 448.0 * 2.0**e) & (x.abs() >= floor)]
        want = (mxfp8.to_e4m3(block * 2.0**-e).float() * 2.0**e).to(torch.bfloat16)
        want = want.view(torch.int16).to(torch.int64) & 0xFFFF
        bits = block.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
        partner = bits.flip(0)
        word = _packed_form(bits, partner)
        swapped = _packed_form(partner, bits)
        wrong = ((word >> 16) != want) | ((swapped & 0xFFFF) != want)
        if wrong.any():
            mismatches.append(f"e={e}: {int(wrong.sum())} values, first x={block[wrong][0]!r}")
    assert not mismatches, "; ".join(mismatches[:5])


def test_packed_form_never_carries_out_of_a_finite_half():
    """The add's carry stays in its half for every finite bf16 (either sign)."""
    bits = _finite_bf16().to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    assert int((bits + 7 + ((bits >> 4) & 1)).max()) < 0x10000
