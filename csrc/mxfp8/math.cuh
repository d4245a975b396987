// MXFP8 (OCP MX, E4M3 elements, one E8M0 scale per 32 elements) arithmetic on packed bf16 words.
//
// Bit-exact contract with mok/mxfp8.py (the reference):
//   scale exponent e = smallest integer with amax <= 448 * 2^e, clamped to [-127, 127];
//   scale byte = e + 127, and an all-zero block gets byte 0 (the clamp already yields 0);
//   element = round-to-nearest-even(x * 2^-e) as E4M3, saturated to +-448.
// Everything is derived from the bits, never from log2/ceil, so no libm rounding can move a scale.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "mxfp8/format.hpp"

namespace mok::mxfp8 {

constexpr uint32_t kAbsMask2 = 0x7fff7fffu;  // clears the sign of both bf16 halves
constexpr uint32_t kSign2 = 0x80008000u;     // the sign bits of both halves
constexpr uint32_t kInf2 = 0x7f807f80u;      // |bf16| bits above this are NaN

// Byte offset of (local row r, k-block kb) inside one tile's swizzled [32, 16] scale block.
__device__ __forceinline__ int swizzled_scale_offset(int r, int kb) {
  return (r % 32) * 16 + (r / 32) * 4 + kb;
}

// Index of element (row, col)'s scale byte among the swizzled scale tiles of a [rows, cols]
// matrix with blocks along its rows (mok.mxfp8's layout: tiles row-major, 128 x 128 each).
__device__ __forceinline__ int64_t swizzled_scale_index(int64_t row, int64_t col, int64_t cols) {
  const int64_t block = col / kBlock;
  const int64_t tile = (row / kTile) * (cols / kTile) + block / (kTile / kBlock);
  return tile * kTileScaleBytes + swizzled_scale_offset(static_cast<int>(row % kTile),
                                                        static_cast<int>(block % (kTile / kBlock)));
}

// Folds one packed bf16 pair into the running block maximum `amax2` (two 16-bit |x| bit patterns;
// unsigned order of magnitudes is numeric order) and returns the pair ready for conversion.
// NaN does not take part in the maximum (the reference ignores it, like fmaxf), and its sign is
// cleared so that every NaN converts to the one canonical E4M3 NaN byte 0x7F.
__device__ __forceinline__ uint32_t scan_pair(uint32_t word, uint32_t& amax2) {
  const uint32_t magnitude = word & kAbsMask2;
  const uint32_t is_nan = __vcmpgtu2(magnitude, kInf2);  // 0xffff in each NaN half
  amax2 = __vmaxu2(amax2, magnitude & ~is_nan);
  return word & ~(is_nan & kSign2);
}

// Scale exponent for a block whose largest non-NaN |x| has bf16 bits `amax_bits`.
// With amax = m * 2^E, 1 <= m < 2 and 448 = 1.75 * 2^8: e = E - 8 if m <= 1.75 else E - 7.
__device__ __forceinline__ int scale_exponent(uint32_t amax_bits) {
  const uint32_t biased = (amax_bits >> 7) & 0xffu;
  const uint32_t mantissa = amax_bits & 0x7fu;
  if (biased == 0xffu) {
    return kMaxExponent;  // Inf (NaN never reaches here): ceil(log2(inf)) clamps to 127
  }
  // bf16 subnormals and zero give E <= -127, which clamps to -127 below (byte 0).
  const int exponent = static_cast<int>(biased) - 127 - 8 + (mantissa > 0x60u ? 1 : 0);
  return max(-kMaxExponent, min(kMaxExponent, exponent));
}

// 2^-e as an fp32; e = 127 needs the fp32 subnormal 2^-127.
__device__ __forceinline__ float inverse_scale(int e) {
  const int biased = 127 - e;  // in [0, 254]
  return biased > 0 ? __uint_as_float(static_cast<uint32_t>(biased) << 23)
                    : __uint_as_float(0x00400000u);
}

// 2^(byte - 127) for bytes 0..254 (0 the subnormal 2^-127), without a test for E8M0's NaN
// (255): M_GROUPED_MXFP8_NT_F16_ROWS's rescale multiplies every accumulator by two of these, and
// a branch per accumulator cost several thousand cycles a tile. The one home of the
// byte -> 2^(byte - 127) rule; the two forms below add the NaN.
__device__ __forceinline__ float exponent_value(uint32_t byte) {
  return __uint_as_float(byte != 0u ? byte << 23 : 0x00400000u);
}

// 2^(byte - 127) as an fp32, the value of an E8M0 scale byte (255 is E8M0's NaN).
__device__ __forceinline__ float scale_value(uint32_t byte) {
  return byte == 255u ? __uint_as_float(0x7fc00000u) : exponent_value(byte);
}

// scale_value(byte) as bf16 in both halves of a word, without a branch: bf16 holds every E8M0
// value (the top half of exponent_value's fp32, 2^-127 a bf16 subnormal), and 255's quiet bit
// makes the NaN.
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t byte) {
  const uint32_t bits =
      (__float_as_uint(exponent_value(byte)) >> 16) | (byte == 255u ? 0x40u : 0u);
  return bits * 0x10001u;
}

// The low / high bf16 of a packed pair as fp32 (exact: bf16 is the top half of an fp32).
__device__ __forceinline__ float bf16_lo(uint32_t word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t word) {
  return __uint_as_float(word & 0xffff0000u);
}

// Two fp32 values to two E4M3 bytes (first value in the low byte), RNE, saturating to +-448.
__device__ __forceinline__ uint32_t to_e4m3x2(float first, float second) {
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3));
}

// Four fp32 values to four E4M3 bytes packed little-endian in one word.
__device__ __forceinline__ uint32_t to_e4m3x4(float a, float b, float c, float d) {
  return to_e4m3x2(a, b) | (to_e4m3x2(c, d) << 16);
}

}  // namespace mok::mxfp8
