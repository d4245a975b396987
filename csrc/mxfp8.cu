// MXFP8 quantize: bf16 [E, M, N] -> E4M3 data + swizzled E8M0 scales, normal and/or transposed.
//
// One CTA owns one 128x128 tile of one expert, so every scale block and every 128x128 swizzled
// scale tile is produced by exactly one CTA and the result does not depend on scheduling.
// Memory traffic is 16-byte vectors throughout: each thread reads 2x16 B of a row (16 bf16) and
// writes one 16 B vector of E4M3 bytes per layout. The transposed layout goes through shared
// memory padded to an odd word pitch, which makes the column reads bank-conflict free.
#include "common/mxfp8_math.cuh"
#include "mxfp8.h"

#include <cstdint>

namespace mok::mxfp8 {
// A named namespace, not an anonymous one: nvcc derives anonymous-namespace symbol names from the
// source file's absolute path, which would make the binary depend on where it was built.
namespace detail {

constexpr int kThreads = 256;
constexpr int kChunk = 16;                        // bf16 elements per thread per row
constexpr int kChunksPerRow = kTile / kChunk;     // 8 threads cover one tile row
constexpr int kRowsPerPass = kThreads / kChunksPerRow;  // 32
constexpr int kPasses = kTile / kRowsPerPass;     // 4
constexpr int kWordsPerChunk = kChunk / 2;        // packed bf16 pairs
constexpr int kPitch = kTile / 2 + 1;             // smem words per tile row; odd -> no conflicts

struct Params {
  const uint16_t* x;
  uint8_t* out;
  uint8_t* scale;
  uint8_t* out_t;
  uint8_t* scale_t;
  int64_t rows;
  int64_t cols;
  int tiles_m;
  int tiles_n;
};

struct Tile {
  int64_t expert;
  int64_t m0;  // first row of the tile
  int64_t n0;  // first column of the tile
  int m_tile;
  int n_tile;
};

__device__ __forceinline__ Tile locate_tile(const Params& p) {
  const int64_t id = blockIdx.x;
  Tile t;
  t.n_tile = static_cast<int>(id % p.tiles_n);
  t.m_tile = static_cast<int>((id / p.tiles_n) % p.tiles_m);
  t.expert = id / (static_cast<int64_t>(p.tiles_n) * p.tiles_m);
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

// Quantizes 16 bf16 values, element(i) for i < 16, with inverse scale `inv` into 16 E4M3 bytes.
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

// Normal layout for one 16-element row chunk: block amax over the 2 threads of a 32-block.
__device__ __forceinline__ void quantize_row_chunk(const Params& p, const Tile& t, int row,
                                                   int chunk, uint32_t (&w)[kWordsPerChunk],
                                                   uint8_t* s_scale) {
  uint32_t amax2 = 0;
#pragma unroll
  for (int i = 0; i < kWordsPerChunk; ++i) w[i] = scan_pair(w[i], amax2);
  amax2 = __vmaxu2(amax2, __shfl_xor_sync(0xffffffffu, amax2, 1));
  const uint32_t amax = max(amax2 & 0xffffu, amax2 >> 16);
  const int e = scale_exponent(amax);
  const int64_t offset = (t.expert * p.rows + t.m0 + row) * p.cols + t.n0 + chunk * kChunk;
  store16(p.out + offset, quantize16(RowElement{w}, inverse_scale(e)));
  if ((chunk & 1) == 0) s_scale[swizzled_scale_offset(row, chunk / 2)] = e + kMaxExponent;
}

// Transposed layout: lane owns column pair `pair` (output rows 2*pair, 2*pair+1) and rows
// [16*c, 16*c + 16) of the tile; its partner lane (lane ^ 16) holds the other half of the block.
__device__ __forceinline__ void quantize_column_chunk(const Params& p, const Tile& t, int pair,
                                                      int c, const uint32_t* s_tile,
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
  const int64_t base = (t.expert * p.cols + t.n0 + 2 * pair) * p.rows + t.m0 + c * kChunk;
  store16(p.out_t + base, quantize16(ColumnElement{w, false}, inverse_scale(e_lo)));
  store16(p.out_t + base + p.rows, quantize16(ColumnElement{w, true}, inverse_scale(e_hi)));
  if ((c & 1) == 0) {
    s_scale_t[swizzled_scale_offset(2 * pair, c / 2)] = e_lo + kMaxExponent;
    s_scale_t[swizzled_scale_offset(2 * pair + 1, c / 2)] = e_hi + kMaxExponent;
  }
}

// Writes one tile's 512 staged scale bytes with 32 x 16-byte stores.
__device__ __forceinline__ void store_scales(uint8_t* dst, const uint8_t* s_scale, int lane) {
  store16(dst + lane * 16, *reinterpret_cast<const uint4*>(s_scale + lane * 16));
}

template <bool kNormal, bool kTransposed>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const Params p) {
  __shared__ uint32_t s_tile[kTransposed ? kTile * kPitch : 1];
  __shared__ alignas(16) uint8_t s_scale[kTileScaleBytes];
  __shared__ alignas(16) uint8_t s_scale_t[kTileScaleBytes];

  const Tile t = locate_tile(p);
  const int chunk = threadIdx.x % kChunksPerRow;
  const int row0 = threadIdx.x / kChunksPerRow;

  // Issue every load of the tile before using any of it: 8 x 16 B in flight per thread.
  uint32_t w[kPasses][kWordsPerChunk];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = pass * kRowsPerPass + row0;
    const uint16_t* src = p.x + (t.expert * p.rows + t.m0 + row) * p.cols + t.n0 + chunk * kChunk;
    const uint4 a = load16(src);
    const uint4 b = load16(src + 8);
    const uint32_t v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[pass][i] = v[i];
  }

#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = pass * kRowsPerPass + row0;
    if constexpr (kNormal) quantize_row_chunk(p, t, row, chunk, w[pass], s_scale);
    if constexpr (kTransposed) {
#pragma unroll
      for (int i = 0; i < kWordsPerChunk; ++i) {
        s_tile[row * kPitch + chunk * kWordsPerChunk + i] = w[pass][i];
      }
    }
  }
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if constexpr (kTransposed) {
    // 16 warp tasks per tile: 4 groups of 16 column pairs x 4 blocks of 32 rows.
#pragma unroll
    for (int task = warp; task < 16; task += kThreads / 32) {
      const int pair = (task % 4) * 16 + lane % 16;
      const int c = (task / 4) * 2 + lane / 16;
      quantize_column_chunk(p, t, pair, c, s_tile, s_scale_t);
    }
    __syncthreads();
  }

  if (kNormal && warp == 0) {
    const int64_t tile = (t.expert * p.tiles_m + t.m_tile) * p.tiles_n + t.n_tile;
    store_scales(p.scale + tile * kTileScaleBytes, s_scale, lane);
  }
  if (kTransposed && warp == 1) {
    const int64_t tile = (t.expert * p.tiles_n + t.n_tile) * p.tiles_m + t.m_tile;
    store_scales(p.scale_t + tile * kTileScaleBytes, s_scale_t, lane);
  }
}

template <bool kNormal, bool kTransposed>
cudaError_t launch(const Params& p, int64_t tiles, cudaStream_t stream) {
  quantize_kernel<kNormal, kTransposed>
      <<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace detail

cudaError_t launch_quantize(const QuantizeArgs& args, cudaStream_t stream) {
  detail::Params p;
  p.x = static_cast<const uint16_t*>(args.x);
  p.out = static_cast<uint8_t*>(args.out);
  p.scale = static_cast<uint8_t*>(args.scale);
  p.out_t = static_cast<uint8_t*>(args.out_t);
  p.scale_t = static_cast<uint8_t*>(args.scale_t);
  p.rows = args.rows;
  p.cols = args.cols;
  p.tiles_m = static_cast<int>(args.rows / kTile);
  p.tiles_n = static_cast<int>(args.cols / kTile);
  const int64_t tiles = args.experts * p.tiles_m * p.tiles_n;
  if (tiles == 0) return cudaSuccess;
  const bool normal = args.out != nullptr;
  const bool transposed = args.out_t != nullptr;
  if (normal && transposed) return detail::launch<true, true>(p, tiles, stream);
  if (normal) return detail::launch<true, false>(p, tiles, stream);
  if (transposed) return detail::launch<false, true>(p, tiles, stream);
  return cudaSuccess;
}

}  // namespace mok::mxfp8
