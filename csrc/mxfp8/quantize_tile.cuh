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
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "mxfp8/format.hpp"
#include "mxfp8/math.cuh"
#include "mxfp8/round.cuh"

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

// Tile `id` of [experts, tiles_m, tiles_n] tiles, n fastest.
__device__ __forceinline__ Tile locate_tile(int64_t id, int tiles_m, int tiles_n) {
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

// One 16-byte store instruction. Written as a plain uint4 assignment, nvcc split some of these
// stores into four 4-byte ones (packed bf16 pairs from separate registers), which quartered the
// store width and made the rounding pass bound by L1/L2 store throughput once its arithmetic got
// cheap.
__device__ __forceinline__ void store16(void* ptr, uint4 value) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(value.x), "r"(value.y),
               "r"(value.z), "r"(value.w)
               : "memory");
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

// A 32-block's scale exponent, and fast_floor_bits for it (0: the exact rounding form).
struct BlockScale {
  int e;
  uint32_t floor_bits;
};

// The scale of the 32-block holding a 16-element row chunk; the block's amax is shared with the
// partner thread (lane ^ 1) holding its other half, so every thread of a warp must call this.
// The common case takes two instructions a pair; a block with a NaN is scanned again the exact
// way (NaN left out of the maximum, its sign cleared in `w`; see scan_pair).
__device__ __forceinline__ BlockScale row_chunk_scale(uint32_t (&w)[kWordsPerChunk]) {
  uint32_t amax2 = 0;
#pragma unroll
  for (int i = 0; i < kWordsPerChunk; ++i) amax2 = __vmaxu2(amax2, w[i] & kAbsMask2);
  amax2 = __vmaxu2(amax2, __shfl_xor_sync(0xffffffffu, amax2, 1));
  const bool has_nan = __vcmpgtu2(amax2, kInf2) != 0;  // the same in both threads of the pair
  if (has_nan) {
    const unsigned pair_lanes = 3u << ((threadIdx.x % 32) & ~1u);
    amax2 = 0;
#pragma unroll
    for (int i = 0; i < kWordsPerChunk; ++i) w[i] = scan_pair(w[i], amax2);
    amax2 = __vmaxu2(amax2, __shfl_xor_sync(pair_lanes, amax2, 1));
  }
  const int e = scale_exponent(max(amax2 & 0xffffu, amax2 >> 16));
  return {e, fast_floor_bits(e, has_nan)};
}

// Which side of the SwiGLU limit a stored element must keep (keep_limit_side): none, gate's
// (x > L is clamped) or up's (|x| > L is clamped).
enum LimitSide : int { kNoLimit, kUpperLimit, kBothLimits };

// mok.mxfp8.keep_limit_side on the 16 E4M3 bytes of a row chunk quantized with exponent e:
// where rounding to nearest carried an element across the limit, it takes the neighbouring
// code on its value's side (codes of one sign are ordered by magnitude), so the backward's
// clamp decision, read from the saved MXFP8 gate and up, is the forward's. Rounding moves a
// value by at most half E4M3's spacing, below max(|x| / 8, 2^(e-9)) / 2, so only elements that
// near the limit are decoded.
template <bool kBothSigns>
__device__ __forceinline__ uint4 keep_limit_side(uint4 bytes, const uint32_t (&w)[kWordsPerChunk],
                                                 int e, float limit) {
  const float scale = exponent_value(static_cast<uint32_t>(e + kMaxExponent));
  const float window = fmaxf(limit * 0.125f, scale * 0.001953125f);
  uint32_t word[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float element = RowElement{w}(i);
    const float value = kBothSigns ? fabsf(element) : element;
    if (!(fabsf(value - limit) <= window)) continue;
    const int shift = 8 * (i % 4);
    const uint32_t code = (word[i / 4] >> shift) & 0xffu;
    const __half_raw raw =
        __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
    const float decoded = __fmul_rn(__half2float(__half(raw)), scale);
    const float stored = kBothSigns ? fabsf(decoded) : decoded;
    const uint32_t magnitude = code & 0x7fu;
    const bool up = value > limit && stored <= limit && magnitude < 0x7eu;
    const bool down = value <= limit && stored > limit && magnitude > 0u;
    const uint32_t next = code + (up ? 1u : 0u) - (down ? 1u : 0u);
    word[i / 4] = (word[i / 4] & ~(0xffu << shift)) | (next << shift);
  }
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// Stores a row chunk quantized with exponent e at element `offset` of `pair` and stages its
// scale byte (one thread per block) at the chunk's swizzled place in the tile's scales; kSide:
// the elements keep their side of `limit` (keep_limit_side).
template <LimitSide kSide = kNoLimit>
__device__ __forceinline__ void store_row_chunk(const Pair& pair, int64_t offset, int row,
                                                int chunk, const uint32_t (&w)[kWordsPerChunk],
                                                int e, uint8_t* s_scale, float limit = 0.0f) {
  uint4 bytes = quantize16(RowElement{w}, inverse_scale(e));
  if constexpr (kSide != kNoLimit) {
    bytes = keep_limit_side<kSide == kBothLimits>(bytes, w, e, limit);
  }
  store16(pair.data + offset, bytes);
  if ((chunk & 1) == 0) s_scale[swizzled_scale_offset(row, chunk / 2)] = e + kMaxExponent;
}

// The smallest magnitude's bits among the 16 bf16 of a row chunk.
__device__ __forceinline__ uint32_t smallest_magnitude(const uint32_t (&w)[kWordsPerChunk]) {
  uint32_t amin2 = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < kWordsPerChunk; ++i) amin2 = __vminu2(amin2, w[i] & kAbsMask2);
  return min(amin2 & 0xffffu, amin2 >> 16);
}

// Stores 8 packed bf16 pairs (16 values) at `dst` as two 16-byte vectors.
__device__ __forceinline__ void store_packed16(uint16_t* dst,
                                               const uint32_t (&packed)[kWordsPerChunk]) {
  store16(dst, make_uint4(packed[0], packed[1], packed[2], packed[3]));
  store16(dst + 8, make_uint4(packed[4], packed[5], packed[6], packed[7]));
}

// Stores the values a GEMM reads for a row chunk quantized (along the row) with `scale`: bf16,
// or (kF16) f16 times `rebase` = 2^(127 - R) for the row's exponent byte R, the f16-rows GEMM's
// operand (exact while the value stays within f16's range: R puts the row's largest under 2^16).
template <bool kF16 = false>
__device__ __forceinline__ void store_rounded_chunk(uint16_t* dst,
                                                    const uint32_t (&w)[kWordsPerChunk],
                                                    BlockScale scale, float rebase = 1.0f) {
  const auto pack = [rebase](float first, float second, bool exact_bf16) {
    if constexpr (kF16) {
      const __half2 pair = __floats2half2_rn(first * rebase, second * rebase);
      return *reinterpret_cast<const uint32_t*>(&pair);
    }
    return exact_bf16 ? pack_exact_bf16x2(first, second) : pack_bf16x2(first, second);
  };
  uint32_t packed[kWordsPerChunk];
  // Chunks with a zero or an element below the floor (rare in a block the fast form covers:
  // |x| under ~2^-14 of the block's largest) take the per-element fast form.
  if (!kF16 && scale.floor_bits != 0 && smallest_magnitude(w) >= (scale.floor_bits >> 16)) {
#pragma unroll
    for (int j = 0; j < kWordsPerChunk; ++j) packed[j] = rounded_pair_packed(w[j]);
  } else if (scale.floor_bits != 0) {
#pragma unroll
    for (int j = 0; j < kWordsPerChunk; ++j) {
      packed[j] = pack(rounded_value_fast(bf16_lo(w[j]), scale.floor_bits),
                       rounded_value_fast(bf16_hi(w[j]), scale.floor_bits), true);
    }
  } else {
    const float inv = inverse_scale(scale.e);
    const float value = scale_value(static_cast<uint32_t>(scale.e + kMaxExponent));
    // Pair by pair: computing all 16 values before packing them took 7 more registers and made
    // this pass about 1.5x slower.
#pragma unroll
    for (int j = 0; j < kWordsPerChunk; ++j) {
      packed[j] = pack(rounded_value(bf16_lo(w[j]), inv, value),
                       rounded_value(bf16_hi(w[j]), inv, value), false);
    }
  }
  store_packed16(dst, packed);
}

// Whether a row chunk takes rounded_pair_packed: every column block covered by the fast form
// (floor bits not 0) and every magnitude at least its block's floor. Read from the staged floor
// bits four at a time, so the chunk's 16 floors are not held in registers for the other forms
// (holding them took the kernel from 64 to 75 registers, 3 CTAs per SM instead of 4).
__device__ __forceinline__ bool packed_rows_chunk(const uint32_t (&w)[kWordsPerChunk],
                                                  const uint4* staged) {
  bool packed = true;
#pragma unroll
  for (int i = 0; i < kChunk / 4; ++i) {
    const uint4 v = staged[i];
    const uint32_t lowest = min(min(v.x, v.y), min(v.z, v.w));
    const uint32_t floor01 = __byte_perm(v.x, v.y, 0x7632);  // as bf16 bits, two per word
    const uint32_t floor23 = __byte_perm(v.z, v.w, 0x7632);
    const uint32_t m01 = w[2 * i] & kAbsMask2;
    const uint32_t m23 = w[2 * i + 1] & kAbsMask2;
    packed = packed && lowest != 0 && __vmaxu2(m01, floor01) == m01 &&
             __vmaxu2(m23, floor23) == m23;
  }
  return packed;
}

// The rows-rounded values of a row chunk that packed_rows_chunk turns down: the fast form where
// all 16 column blocks are covered, else the exact form from the staged scale bytes.
__device__ __forceinline__ void rounded_rows_by_element(uint32_t (&packed)[kWordsPerChunk],
                                                        const uint32_t (&w)[kWordsPerChunk],
                                                        int row, int chunk, const uint4* staged,
                                                        const uint8_t* s_scale_t) {
  uint32_t floor[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk / 4; ++i) {
    const uint4 v = staged[i];
    floor[4 * i] = v.x;
    floor[4 * i + 1] = v.y;
    floor[4 * i + 2] = v.z;
    floor[4 * i + 3] = v.w;
  }
  uint32_t covered = floor[0];
#pragma unroll
  for (int i = 1; i < kChunk; ++i) covered = min(covered, floor[i]);
  if (covered != 0) {
#pragma unroll
    for (int j = 0; j < kWordsPerChunk; ++j) {
      packed[j] = pack_exact_bf16x2(rounded_value_fast(bf16_lo(w[j]), floor[2 * j]),
                                    rounded_value_fast(bf16_hi(w[j]), floor[2 * j + 1]));
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kWordsPerChunk; ++j) {
    float pair[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = chunk * kChunk + 2 * j + h;
      const uint32_t byte = s_scale_t[swizzled_scale_offset(col, row / kBlock)];
      pair[h] = rounded_value(h ? bf16_hi(w[j]) : bf16_lo(w[j]),
                              inverse_scale(static_cast<int>(byte) - kMaxExponent),
                              scale_value(byte));
    }
    packed[j] = pack_bf16x2(pair[0], pair[1]);
  }
}

// Stores the values a GEMM reads for a row chunk (tile row `row`, columns from 16 * chunk)
// quantized along the columns, i.e. in blocks of 32 rows: each column block's scale is the one
// the transposed quantization staged, its floor bits in s_floor ([4 row blocks][128 columns])
// and its scale byte in s_scale_t.
__device__ __forceinline__ void store_rounded_rows_chunk(uint16_t* dst,
                                                         const uint32_t (&w)[kWordsPerChunk],
                                                         int row, int chunk,
                                                         const uint32_t* s_floor,
                                                         const uint8_t* s_scale_t) {
  const uint4* staged = reinterpret_cast<const uint4*>(s_floor + (row / kBlock) * kTile) +
                        chunk * (kChunk / 4);
  uint32_t packed[kWordsPerChunk];
  if (packed_rows_chunk(w, staged)) {
#pragma unroll
    for (int j = 0; j < kWordsPerChunk; ++j) packed[j] = rounded_pair_packed(w[j]);
  } else {
    rounded_rows_by_element(packed, w, row, chunk, staged, s_scale_t);
  }
  store_packed16(dst, packed);
}

// Transposed layout: lane owns column pair `pair` (output rows 2*pair, 2*pair+1) and rows
// [16*c, 16*c + 16) of the tile; its partner lane (lane ^ 16) holds the other half of the block.
// `out` points at the tile's first output element: (expert * cols + n0) * rows + m0, or is null
// when only the scales are wanted: the scale bytes are staged in s_scale_t either way, and the
// blocks' fast_floor_bits in s_floor ([4 row blocks][128 columns]) unless it is null.
__device__ __forceinline__ void quantize_column_chunk(uint8_t* out, int64_t rows, int pair, int c,
                                                      const uint32_t* s_tile, uint8_t* s_scale_t,
                                                      uint32_t* s_floor) {
  uint32_t w[kChunk];
  uint32_t with_nan2 = 0;  // the maximum with NaN taking part: above kInf2 where a NaN is
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    w[i] = s_tile[(c * kChunk + i) * kPitch + pair];
    with_nan2 = __vmaxu2(with_nan2, w[i] & kAbsMask2);
  }
  // Without a NaN in the lane's 16 rows that is the maximum; with one, they are scanned the
  // exact way (scan_pair), as row_chunk_scale does: 2 instructions a word on the common path.
  uint32_t amax2 = with_nan2;
  if (__vcmpgtu2(with_nan2, kInf2) != 0) {
    amax2 = 0;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) w[i] = scan_pair(w[i], amax2);
  }
  amax2 = __vmaxu2(amax2, __shfl_xor_sync(0xffffffffu, amax2, 16));
  const int e_lo = scale_exponent(amax2 & 0xffffu);
  const int e_hi = scale_exponent(amax2 >> 16);
  if (out != nullptr) {
    uint8_t* base = out + 2 * pair * rows + c * kChunk;
    store16(base, quantize16(ColumnElement{w, false}, inverse_scale(e_lo)));
    store16(base + rows, quantize16(ColumnElement{w, true}, inverse_scale(e_hi)));
  }
  with_nan2 = __vmaxu2(with_nan2, __shfl_xor_sync(0xffffffffu, with_nan2, 16));
  if ((c & 1) != 0) return;
  s_scale_t[swizzled_scale_offset(2 * pair, c / 2)] = e_lo + kMaxExponent;
  s_scale_t[swizzled_scale_offset(2 * pair + 1, c / 2)] = e_hi + kMaxExponent;
  if (s_floor != nullptr) {
    uint32_t* floor = s_floor + (c / 2) * kTile + 2 * pair;
    floor[0] = fast_floor_bits(e_lo, (with_nan2 & 0xffffu) > (kInf2 & 0xffffu));
    floor[1] = fast_floor_bits(e_hi, (with_nan2 >> 16) > (kInf2 >> 16));
  }
}

// Writes one tile's 512 staged scale bytes with 32 x 16-byte stores (one warp).
__device__ __forceinline__ void store_scales(uint8_t* dst, const uint8_t* s_scale, int lane) {
  store16(dst + lane * 16, *reinterpret_cast<const uint4*>(s_scale + lane * 16));
}

}  // namespace mok::mxfp8::tile
