// The value a bf16 GEMM reads for an MXFP8 element, computed without going through E4M3 bytes:
// bf16(e4m3(x * 2^-e) * 2^e) for x in a block with scale exponent e, exactly as
// launch_quantize followed by launch_dequantize gives it.
//
// Two forms. The exact one (rounded_value) handles every input, NaN, inf and the extreme scale
// exponents included, by cases on the bits. The fast one (rounded_value_fast) is branch-free and
// covers the blocks that matter in practice; the rounding kernels are bound by instruction issue
// (docs/mxfp8.md, rounding passes), so it is the hot path and the exact form the fallback for
// blocks it does not cover.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mxfp8/math.cuh"

namespace mok::mxfp8 {

// The value of to_e4m3(y) as an fp32, from fp32 and integer operations only: E4M3's subnormals
// (below 2^-6) are the multiples of 2^-9 and its normals keep 3 mantissa bits, both rounded to
// nearest even; |y| from 448 up (only inf: the scale keeps finite blocks within 448) saturates
// to 448 and NaN stays NaN, as the saturating conversion does. The cases are told apart on the
// bits, so no floating-point comparison can misread a NaN. Going through E4M3 bytes and back
// costs two conversion instructions per element, which made the rounding pass ~2x slower.
__device__ __forceinline__ float e4m3_value(float y) {
  const uint32_t sign = __float_as_uint(y) & 0x80000000u;
  const uint32_t magnitude = __float_as_uint(y) & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return y;  // NaN
  uint32_t bits;
  if (magnitude >= 0x43e00000u) {  // 448 and above
    bits = 0x43e00000u;
  } else if (magnitude < 0x3c800000u) {  // below 2^-6: add and subtract 2^14, whose ulp is 2^-9
    bits = __float_as_uint(__fsub_rn(__fadd_rn(__uint_as_float(magnitude), 16384.0f), 16384.0f));
  } else {  // round the 20 dropped mantissa bits to nearest even
    bits = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) & 0xfff00000u;
  }
  return __uint_as_float(bits | sign);
}

// Exact form: element x of a block with inverse scale `inv` = 2^-e and scale 2^e, as fp32
// (bf16(...) of it is what mxfp8_dequantize writes: an exact fp32 product rounded to bf16).
__device__ __forceinline__ float rounded_value(float x, float inv, float scale) {
  return __fmul_rn(e4m3_value(x * inv), scale);
}

// The fast form covers scale exponents in [kFastMinExponent, kFastMaxExponent] for blocks
// without NaN. Below the range, e - 6 would leave fp32's normal exponents (and fast_floor_bits'
// 0 means "not covered"); above it, the rounding constant 2^(E + 20) of the block's largest |x|
// (E <= e + 8) nears fp32's largest binade (it overflows from e = 100 on; 98 keeps a margin).
constexpr int kFastMinExponent = -120;
constexpr int kFastMaxExponent = 98;

// The fp32 exponent field (bits 23-30) of 2^(e - 6), the smallest E4M3 normal times 2^e, for a
// block the fast form covers; 0 for a block it does not (extreme e, or a NaN in the block).
__device__ __forceinline__ uint32_t fast_floor_bits(int e, bool has_nan) {
  const bool covered = !has_nan && e >= kFastMinExponent && e <= kFastMaxExponent;
  return covered ? static_cast<uint32_t>(e - 6 + 127) << 23 : 0u;
}

// Fast form, for finite x with |x| <= 448 * 2^e (every element of its block) and
// floor_bits = fast_floor_bits(e, false) != 0. E4M3 keeps 3 mantissa bits below the leading one
// of |x| = m * 2^E, or below 2^(e-6) for smaller values (its subnormals, spaced 2^(e-9)).
// Adding c = 2^(max(E, e-6) + 20) puts the sum's ulp exactly there, so the fp32 addition rounds
// |x| to nearest even on E4M3's grid and subtracting c is exact; the sign goes back on last.
// Equal to rounded_value for every bf16 x and e in range: tests/cpu/test_mxfp8_fast_round.py
// checks the form exhaustively against the reference, the GPU tests the kernels bit for bit
// against quantize + dequantize.
__device__ __forceinline__ float rounded_value_fast(float x, uint32_t floor_bits) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t exponent = max(bits & 0x7f800000u, floor_bits);
  const float magic = __uint_as_float(exponent + (20u << 23));
  const float magnitude = __uint_as_float(bits & 0x7fffffffu);
  const float rounded = __fsub_rn(__fadd_rn(magnitude, magic), magic);
  return __uint_as_float(__float_as_uint(rounded) | (bits & 0x80000000u));
}

// Packed form, for a word of two bf16 from a block the fast form covers whose magnitudes are
// both at least its floor 2^(e-6) (fast_floor_bits >> 16 in bf16 bits): E4M3 normals once
// scaled, which keep the top 3 of bf16's 7 mantissa bits. So both halves round to nearest even
// in one integer add on the word: 7 plus the lowest kept bit carries into the kept bits exactly
// when the 4 dropped bits round up (on into the exponent at a binade's end, as rounding does),
// and the mask drops them. A finite half is at most 0x7f7f | sign, so the add never carries from
// the low half into the high one. 4 instructions a pair against the fast form's ~17; the
// rounding kernels are issue-bound.
__device__ __forceinline__ uint32_t rounded_pair_packed(uint32_t word) {
  return (word + 0x00070007u + ((word >> 4) & 0x00010001u)) & 0xfff0fff0u;
}

// Two fp32 values as one packed bf16 pair (round to nearest even), the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float first, float second) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Two fp32 values that bf16 holds exactly as one packed pair: their high halves. The fast form's
// results have at most 4 significant bits and magnitudes of at least 2^(e-9) >= 2^-129, so their
// low 16 bits are zero; one byte permute instead of a conversion.
__device__ __forceinline__ uint32_t pack_exact_bf16x2(float first, float second) {
  return __byte_perm(__float_as_uint(first), __float_as_uint(second), 0x7632);
}

}  // namespace mok::mxfp8
