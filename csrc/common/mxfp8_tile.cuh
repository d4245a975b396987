// The pieces of an MXFP8 tile quantizer: one CTA of 256 threads owns one 128x128 tile of one
// expert, so every scale block and every 128x128 swizzled scale tile is produced by exactly one
// CTA and the result does not depend on scheduling.
//
// Thread layout: 8 threads cover a tile row in 16-element chunks (2 threads per 32-block), 32
// rows per pass, 4 passes. Memory traffic is 16-byte vectors throughout. The transposed layout
// goes through shared memory padded to an odd word pitch, which makes the column reads bank
// conflict free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/mxfp8_format.hpp"
#include "common/mxfp8_math.cuh"

namespace mok::mxfp8::tile {

constexpr int kThreads = 256;
constexpr int kChunk = 16;                              // elements per thread per row
constexpr int kChunksPerRow = kTile / kChunk;           // 8 threads cover one tile row
constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // 32
constexpr int kPasses = kTile / kRowsPerPass;           // 4
constexpr int kWordsPerChunk = kChunk / 2;              // packed bf16 pairs
constexpr int kPitch = kTile / 2 + 1;                   // smem words per tile row; odd

// One MXFP8 layout of an output: E4M3 bytes and swizzled scale bytes (data null: not wanted).
struct Pair {
  uint8_t* data = nullptr;
  uint8_t* scale = nullptr;
};

struct Tile {
  int64_t expert;
  int64_t m0;  // first row of the tile
  int64_t n0;  // first column of the tile
  int m_tile;
  int n_tile;
};

__device__ __forceinline__ Tile locate_tile(int tiles_m, int tiles_n) {
  const int64_t id = blockIdx.x;
  Tile t;
  t.n_tile = static_cast<int>(id % tiles_n);
  t.m_tile = static_cast<int>((id / tiles_n) % tiles_m);
  t.expert = id / (static_cast<int64_t>(tiles_n) * tiles_m);
  t.m0 = static_cast<int64_t>(t.m_tile) * kTile;
  t.n0 = static_cast<int64_t>(t.n_tile) * kTile;
  return t;
}

__device__ __forceinline__ uint4 load16(const void* ptr) {
  return __ldg(reinterpret_cast<const uint4*>(ptr));
}

__device__ __forceinline__ void store16(void* ptr, uint4 value) {
  *reinterpret_cast<uint4*>(ptr) = value;
}

// The 16 bf16 of a row chunk as 8 packed words, loaded as two 16-byte vectors.
__device__ __forceinline__ void load_chunk(const uint16_t* src, uint32_t (&w)[kWordsPerChunk]) {
  const uint4 a = load16(src);
  const uint4 b = load16(src + 8);
  const uint32_t v[kWordsPerChunk] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < kWordsPerChunk; ++i) w[i] = v[i];
}

// Quantizes 16 values, element(i) for i < 16, with inverse scale `inv` into 16 E4M3 bytes.
template <typename Element>
__device__ __forceinline__ uint4 quantize16(Element element, float inv) {
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    packed[i] = to_e4m3x4(element(4 * i) * inv, element(4 * i + 1) * inv,
                          element(4 * i + 2) * inv, element(4 * i + 3) * inv);
  }
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

// Element i of a row chunk held as 8 packed words (the normal layout).
struct RowElement {
  const uint32_t (&w)[kWordsPerChunk];
  __device__ float operator()(int i) const {
    return (i & 1) ? bf16_hi(w[i / 2]) : bf16_lo(w[i / 2]);
  }
};

// Element i of one column of 16 words read down a column pair (hi: the odd column).
struct ColumnElement {
  const uint32_t (&w)[kChunk];
  bool hi;
  __device__ float operator()(int i) const { return hi ? bf16_hi(w[i]) : bf16_lo(w[i]); }
};

// The scale exponent of the 32-block holding a 16-element row chunk; the block's amax is shared
// with the partner thread (lane ^ 1) holding its other half, so every thread of a warp must call
// this. Clears the sign of NaN elements in `w` (see scan_pair).
__device__ __forceinline__ int row_chunk_exponent(uint32_t (&w)[kWordsPerChunk]) {
  uint32_t amax2 = 0;
#pragma unroll
  for (int i = 0; i < kWordsPerChunk; ++i) w[i] = scan_pair(w[i], amax2);
  amax2 = __vmaxu2(amax2, __shfl_xor_sync(0xffffffffu, amax2, 1));
  return scale_exponent(max(amax2 & 0xffffu, amax2 >> 16));
}

// Stores a row chunk quantized with exponent e at element `offset` of `pair` and stages its
// scale byte (one thread per block) at the chunk's swizzled place in the tile's scales.
__device__ __forceinline__ void store_row_chunk(const Pair& pair, int64_t offset, int row,
                                                int chunk, const uint32_t (&w)[kWordsPerChunk],
                                                int e, uint8_t* s_scale) {
  store16(pair.data + offset, quantize16(RowElement{w}, inverse_scale(e)));
  if ((chunk & 1) == 0) s_scale[swizzled_scale_offset(row, chunk / 2)] = e + kMaxExponent;
}

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

// What a GEMM reads for element x of a block with inverse scale `inv` = 2^-e and scale 2^e:
// bf16(e4m3 * 2^e) as mxfp8_dequantize computes it (an exact fp32 product rounded to bf16).
__device__ __forceinline__ float rounded_value(float x, float inv, float scale) {
  return __fmul_rn(e4m3_value(x * inv), scale);
}

// Stores 8 packed bf16 pairs (16 values) at `dst` as two 16-byte vectors.
__device__ __forceinline__ void store_packed16(uint16_t* dst,
                                               const uint32_t (&packed)[kWordsPerChunk]) {
  store16(dst, make_uint4(packed[0], packed[1], packed[2], packed[3]));
  store16(dst + 8, make_uint4(packed[4], packed[5], packed[6], packed[7]));
}

// Two fp32 values as one packed bf16 pair (round to nearest even), the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float first, float second) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Stores the values a GEMM reads for a row chunk quantized (along the row) with exponent e.
__device__ __forceinline__ void store_rounded_chunk(uint16_t* dst,
                                                    const uint32_t (&w)[kWordsPerChunk], int e) {
  const float inv = inverse_scale(e);
  const float scale = scale_value(static_cast<uint32_t>(e + kMaxExponent));
  // Pair by pair: computing all 16 values before packing them took 7 more registers and made
  // this pass 1.5x slower (1x H200, 27648x7168: 0.364 against 0.237 ms).
  uint32_t packed[kWordsPerChunk];
#pragma unroll
  for (int j = 0; j < kWordsPerChunk; ++j) {
    packed[j] = pack_bf16x2(rounded_value(bf16_lo(w[j]), inv, scale),
                            rounded_value(bf16_hi(w[j]), inv, scale));
  }
  store_packed16(dst, packed);
}

// Stores the values a GEMM reads for a row chunk (tile row `row`, columns from 16 * chunk)
// quantized along the columns, i.e. in blocks of 32 rows: each element's scale byte is the one
// the transposed quantization staged for its (column, row block) in s_scale_t.
__device__ __forceinline__ void store_rounded_rows_chunk(uint16_t* dst,
                                                         const uint32_t (&w)[kWordsPerChunk],
                                                         int row, int chunk,
                                                         const uint8_t* s_scale_t) {
  uint32_t packed[kWordsPerChunk];
#pragma unroll
  for (int j = 0; j < kWordsPerChunk; ++j) {
    float pair[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = chunk * kChunk + 2 * j + h;
      const uint32_t byte = s_scale_t[swizzled_scale_offset(col, row / kBlock)];
      const float x = h ? bf16_hi(w[j]) : bf16_lo(w[j]);
      pair[h] = rounded_value(x, inverse_scale(static_cast<int>(byte) - kMaxExponent),
                              scale_value(byte));
    }
    packed[j] = pack_bf16x2(pair[0], pair[1]);
  }
  store_packed16(dst, packed);
}

// Transposed layout: lane owns column pair `pair` (output rows 2*pair, 2*pair+1) and rows
// [16*c, 16*c + 16) of the tile; its partner lane (lane ^ 16) holds the other half of the block.
// `out` points at the tile's first output element: (expert * cols + n0) * rows + m0, or is null
// when only the scale bytes are wanted (staged in s_scale_t either way).
__device__ __forceinline__ void quantize_column_chunk(uint8_t* out, int64_t rows, int pair, int c,
                                                      const uint32_t* s_tile,
                                                      uint8_t* s_scale_t) {
  uint32_t w[kChunk];
  uint32_t amax2 = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    w[i] = scan_pair(s_tile[(c * kChunk + i) * kPitch + pair], amax2);
  }
  amax2 = __vmaxu2(amax2, __shfl_xor_sync(0xffffffffu, amax2, 16));
  const int e_lo = scale_exponent(amax2 & 0xffffu);
  const int e_hi = scale_exponent(amax2 >> 16);
  if (out != nullptr) {
    uint8_t* base = out + 2 * pair * rows + c * kChunk;
    store16(base, quantize16(ColumnElement{w, false}, inverse_scale(e_lo)));
    store16(base + rows, quantize16(ColumnElement{w, true}, inverse_scale(e_hi)));
  }
  if ((c & 1) == 0) {
    s_scale_t[swizzled_scale_offset(2 * pair, c / 2)] = e_lo + kMaxExponent;
    s_scale_t[swizzled_scale_offset(2 * pair + 1, c / 2)] = e_hi + kMaxExponent;
  }
}

// Writes one tile's 512 staged scale bytes with 32 x 16-byte stores (one warp).
__device__ __forceinline__ void store_scales(uint8_t* dst, const uint8_t* s_scale, int lane) {
  store16(dst + lane * 16, *reinterpret_cast<const uint4*>(s_scale + lane * 16));
}

}  // namespace mok::mxfp8::tile
