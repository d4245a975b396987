// MXFP8 quantize: bf16 [E, M, N] -> E4M3 data + swizzled E8M0 scales, normal and/or transposed,
// and/or the values a GEMM reads for the normal layout (bf16, "rounded"); and the same fused
// after a SwiGLU (gate, up -> hidden), which also quantizes gate and up on the way.
//
// One kernel template serves all of them: a source policy (quantize_sources.cuh) produces each
// thread's row chunks of the tile (loaded from x, gathered from peers' rows by a schedule, or
// computed from gate and up), the template writes the layouts asked for. See
// quantize_tile.cuh for the tile and thread layout. Fusing saves whole passes over the
// routed rows: the rounded values replace a quantize + dequantize round trip through memory,
// the gathering form is the dispatch's pull and the rounding in one pass, and the SwiGLU form
// reads gate and up once for four outputs.
#include "mxfp8/mxfp8.h"
#include "mxfp8/quantize_sources.cuh"
#include "mxfp8/quantize_tile.cuh"

#include <cstdint>
#include <type_traits>

namespace mok::mxfp8 {
// A named namespace, not an anonymous one: nvcc derives anonymous-namespace symbol names from the
// source file's absolute path, which would make the binary depend on where it was built.
namespace detail {

using namespace tile;

// Tile t from `source`'s row chunks.
template <class Source, int kLayouts>
__device__ __forceinline__ void quantize_tile(const Params& p, const Tile& t, Source& source) {
  constexpr bool kNormalOut = kLayouts & kNormal;
  constexpr bool kRoundedOut = kLayouts & kRounded;
  constexpr bool kTransposedOut = kLayouts & kTransposed;
  constexpr bool kRoundedRowsOut = kLayouts & kRoundedRows;
  constexpr bool kRebasedOut = kLayouts & kRebased;
  static_assert(!kRebasedOut || (kRoundedOut && std::is_same_v<Source, GatherSource>),
                "rebased rows are the gathering source's rounded values");
  constexpr bool kColumns = kTransposedOut || kRoundedRowsOut;  // needs the column blocks
  static_assert(!kRoundedRowsOut || std::is_base_of_v<RegisterRows, Source>,
                "rounded rows re-read the source's chunks: a source that keeps them");
  __shared__ uint32_t s_tile[kColumns ? kTile * kPitch : 1];
  __shared__ alignas(16) uint8_t s_scale[kTileScaleBytes];
  __shared__ alignas(16) uint8_t s_scale_t[kTileScaleBytes];
  // The column blocks' fast_floor_bits, [4 row blocks][128 columns], for the rounded rows.
  __shared__ alignas(16) uint32_t s_floor[kRoundedRowsOut ? kTile / kBlock * kTile : 1];
  __shared__ typename Source::Shared s_source;

  const int chunk = threadIdx.x % kChunksPerRow;
  const int row0 = threadIdx.x / kChunksPerRow;

#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = pass * kRowsPerPass + row0;
    uint32_t w[kWordsPerChunk];
    source.chunk(p, t, pass, row, chunk, w, s_source);
    if constexpr (kColumns) {
      uint32_t* staged = s_tile + row * kPitch + chunk * kWordsPerChunk;
      uint32_t c[kWordsPerChunk];
#pragma unroll
      for (int i = 0; i < kWordsPerChunk; ++i) c[i] = w[i];
      if constexpr (Source::kScalesColumns) source.scale_columns(pass, c);
#pragma unroll
      for (int i = 0; i < kWordsPerChunk; ++i) staged[i] = c[i];
    }
    if constexpr (kNormalOut || kRoundedOut) {
      const BlockScale scale = row_chunk_scale(w);
      const int64_t offset = chunk_offset(p, t, row, chunk);
      if constexpr (kNormalOut) store_row_chunk(p.normal, offset, row, chunk, w, scale.e, s_scale);
      if constexpr (kRebasedOut) {
        const uint32_t exponent = source.exponent[pass];
        // 2^(127 - R) with R <= 255 - 14 (row_exponents' largest, for NaN rows): a normal fp32.
        const float rebase = __uint_as_float((254u - exponent) << 23);
        store_rounded_chunk<true>(p.rounded + offset, w, scale, rebase);
        if (chunk == 0) p.row_exponents[t.m0 + row] = static_cast<uint8_t>(exponent);
      } else if constexpr (kRoundedOut) {
        store_rounded_chunk(p.rounded + offset, w, scale);
      }
    }
  }
  __syncthreads();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if constexpr (kColumns) {
    uint8_t* out = nullptr;
    if constexpr (kTransposedOut) {
      out = p.transposed.data + (t.expert * p.cols + t.n0) * p.rows + t.m0;
    }
    // 16 warp tasks per tile: 4 groups of 16 column pairs x 4 blocks of 32 rows.
#pragma unroll
    for (int task = warp; task < 16; task += kThreads / 32) {
      const int pair = (task % 4) * 16 + lane % 16;
      const int c = (task / 4) * 2 + lane / 16;
      quantize_column_chunk(out, p.rows, pair, c, s_tile, s_scale_t,
                            kRoundedRowsOut ? s_floor : nullptr);
    }
    __syncthreads();
  }
  if constexpr (kRoundedRowsOut) {  // the row chunks again, with their column blocks' scales
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = pass * kRowsPerPass + row0;
      uint32_t w[kWordsPerChunk];
      source.chunk(p, t, pass, row, chunk, w, s_source);
      if constexpr (Source::kScalesColumns) source.scale_columns(pass, w);
      store_rounded_rows_chunk(p.rounded_rows + chunk_offset(p, t, row, chunk), w, row, chunk,
                               s_floor, s_scale_t);
    }
  }

  if (kNormalOut && warp == 0) {
    store_scales(p.normal.scale + normal_scale_tile(p, t) * kTileScaleBytes, s_scale, lane);
  }
  if (kTransposedOut && warp == 1) {
    const int64_t tile = (t.expert * p.tiles_n + t.n_tile) * p.tiles_m + t.m_tile;
    store_scales(p.transposed.scale + tile * kTileScaleBytes, s_scale_t, lane);
  }
  source.store_scales(p, t, s_source, warp, lane);
}

template <class Source, int kLayouts>
__device__ __forceinline__ void quantize_tile_at(const Params& p, int64_t id) {
  const Tile t = locate_tile(id, p.tiles_m, p.tiles_n);
  if (p.used_rows != nullptr && t.m0 >= *p.used_rows) return;  // the same for the whole CTA
  Source source(p, t, threadIdx.x / kChunksPerRow, threadIdx.x % kChunksPerRow);
  quantize_tile<Source, kLayouts>(p, t, source);
}

// Tile `id` of a gathering launch's [tiles_n, tiles_m] tiles (one expert), row tiles fastest:
// every row tile of a 128-column block before the next block. A source row is read by up to
// `divisor` routed rows spread over the whole schedule, and with the columns outermost the CTAs
// resident at once share one block's columns of the source (a few MB, held in L2 between its
// reads) instead of whole rows (all of x, which the pass's stores evict from L2 before their next
// reads; docs/exchanges.md, pulls). 32-bit arithmetic: the binding keeps the tiles below 2^31.
__device__ __forceinline__ Tile gather_tile(uint32_t id, uint32_t tiles_m) {
  Tile t;
  t.m_tile = static_cast<int>(id % tiles_m);
  t.n_tile = static_cast<int>(id / tiles_m);
  t.expert = 0;
  t.m0 = static_cast<int64_t>(t.m_tile) * kTile;
  t.n0 = static_cast<int64_t>(t.n_tile) * kTile;
  return t;
}

// A gathering source's tiles: blockIdx.x + k * gridDim.x (one per CTA on a grid of every tile),
// those at or past *used_rows skipped. The tile's position is computed while *used_rows loads:
// walking the used tiles only, it waited for the load and made the pass slower.
template <class Source, int kLayouts>
__device__ __forceinline__ void quantize_tiles_in_turn(const Params& p) {
  const int64_t used = p.used_rows != nullptr ? *p.used_rows : p.rows;
  Source source(threadIdx.x / kChunksPerRow, threadIdx.x % kChunksPerRow);
  for (uint32_t id = blockIdx.x; id < static_cast<uint32_t>(p.tiles); id += gridDim.x) {
    const Tile t = gather_tile(id, static_cast<uint32_t>(p.tiles_m));
    if (t.m0 >= used) continue;  // the same for the whole CTA
    source.load_rows(p, t);
    quantize_tile<Source, kLayouts>(p, t, source);
    __syncthreads();  // the next tile reuses the shared buffers
  }
}

// One tile per CTA, or, for a source that takes turns (Source::kInTurns, the gathering ones),
// tiles in turn (quantize_tiles_in_turn). Only the gathering sources loop: the loop cost the
// other forms registers (the rows-rounding one went from 64 to 152).
template <class Source, int kLayouts>
__device__ __forceinline__ void quantize_tiles(const Params& p) {
  if constexpr (!Source::kInTurns) {
    quantize_tile_at<Source, kLayouts>(p, blockIdx.x);
  } else {
    quantize_tiles_in_turn<Source, kLayouts>(p);
  }
}

template <class Source, int kLayouts>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const Params p) {
  quantize_tiles<Source, kLayouts>(p);
}

// A kernel with an explicit minimum of CTAs per SM (Source::kMinCtas), for the forms that
// ptxas would otherwise give more registers than that occupancy allows. A separate kernel
// because an explicit minimum of 1 is not the same as none: it let ptxas give the other forms
// 92-96 registers (2 CTAs per SM).
template <class Source, int kLayouts, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) quantize_kernel_bounded(const Params p) {
  quantize_tiles<Source, kLayouts>(p);
}

// One CTA per tile, or `ctas` CTAs taking the tiles in turn (an exchange in the background of
// other work keeps to a few SMs).
template <class Source, int kLayouts>
cudaError_t launch(const Params& p, cudaStream_t stream, int64_t ctas = 0) {
  const int64_t grid = ctas > 0 && ctas < p.tiles ? ctas : p.tiles;
  const auto blocks = static_cast<unsigned>(grid);
  constexpr int kMin = Source::template kMinCtas<kLayouts>;
  if constexpr (kMin > 0) {
    quantize_kernel_bounded<Source, kLayouts, kMin><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    quantize_kernel<Source, kLayouts><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// The load-source kernel for the layouts asked for: any set of the first three, or the rounded
// rows alone, of x's rows as they are or scaled by row_scale (what the callers ask for; the
// binding refuses other sets).
cudaError_t launch_layouts(const Params& p, cudaStream_t stream) {
  const int layouts = (p.normal.data ? kNormal : 0) | (p.rounded ? kRounded : 0) |
                      (p.transposed.data ? kTransposed : 0) |
                      (p.rounded_rows ? kRoundedRows : 0);
  if (p.row_scale != nullptr) {
    if (layouts != kRoundedRows) return cudaErrorInvalidValue;
    return launch<ScaledLoadSource, kRoundedRows>(p, stream);
  }
  switch (layouts) {
    case 1: return launch<LoadSource, 1>(p, stream);
    case 2: return launch<LoadSource, 2>(p, stream);
    case 3: return launch<LoadSource, 3>(p, stream);
    case 4: return launch<LoadSource, 4>(p, stream);
    case 5: return launch<LoadSource, 5>(p, stream);
    case 6: return launch<LoadSource, 6>(p, stream);
    case 7: return launch<LoadSource, 7>(p, stream);
    case kRoundedRows: return launch<LoadSource, kRoundedRows>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

Params tiled(int64_t experts, int64_t rows, int64_t cols) {
  Params p{};
  p.rows = rows;
  p.cols = cols;
  p.tiles_m = static_cast<int>(rows / kTile);
  p.tiles_n = static_cast<int>(cols / kTile);
  p.tiles = experts * p.tiles_m * p.tiles_n;
  return p;
}

Pair pair(void* data, void* scale) {
  return {static_cast<uint8_t*>(data), static_cast<uint8_t*>(scale)};
}

}  // namespace detail

cudaError_t launch_quantize(const QuantizeArgs& args, cudaStream_t stream) {
  detail::Params p = detail::tiled(args.experts, args.rows, args.cols);
  p.x = static_cast<const uint16_t*>(args.x);
  p.normal = detail::pair(args.out, args.scale);
  p.rounded = static_cast<uint16_t*>(args.rounded);
  p.rounded_rows = static_cast<uint16_t*>(args.rounded_rows);
  p.row_scale = args.row_scale;
  p.transposed = detail::pair(args.out_t, args.scale_t);
  p.used_rows = args.used_rows;
  if (p.tiles == 0) return cudaSuccess;
  return detail::launch_layouts(p, stream);
}

cudaError_t launch_gather_round(const QuantizeArgs& args, const GatherArgs& gather, int ctas,
                                cudaStream_t stream) {
  detail::Params p = detail::tiled(1, args.rows, args.cols);
  p.gather = gather;
  p.divisor = FastDivisor(gather.divisor);
  p.rounded = static_cast<uint16_t*>(args.rounded);
  p.row_exponents = static_cast<uint8_t*>(args.row_exponents);
  p.transposed = detail::pair(args.out_t, args.scale_t);
  p.used_rows = args.used_rows;
  if (p.tiles == 0) return cudaSuccess;
  using detail::GatherSource, detail::kRebased, detail::kRounded, detail::kTransposed;
  if (args.rounded_rows != nullptr) {
    if (args.row_scale == nullptr || args.out_t != nullptr || gather.src_exponents != nullptr) {
      return cudaErrorInvalidValue;
    }
    p.rounded_rows = static_cast<uint16_t*>(args.rounded_rows);
    p.row_scale = args.row_scale;
    using detail::ScaledGatherSource, detail::kRoundedRows;
    return detail::launch<ScaledGatherSource, kRounded | kRoundedRows>(p, stream, ctas);
  }
  if (gather.src_exponents != nullptr) {
    return detail::launch<GatherSource, kRounded | kRebased | kTransposed>(p, stream, ctas);
  }
  return detail::launch<GatherSource, kRounded | kTransposed>(p, stream, ctas);
}

cudaError_t launch_swiglu_quantize(const SwigluQuantizeArgs& args, cudaStream_t stream) {
  detail::Params p = detail::tiled(1, args.rows, args.inter);
  p.gate = static_cast<const uint16_t*>(args.gate);
  p.up = static_cast<const uint16_t*>(args.up);
  p.num_tokens = args.num_tokens;
  p.has_limit = args.has_limit;
  p.limit = args.limit;
  p.rounded = static_cast<uint16_t*>(args.hidden_rounded);
  p.transposed = detail::pair(args.hidden_t, args.hidden_scale_t);
  p.gate_q = detail::pair(args.gate_q, args.gate_scale);
  p.up_q = detail::pair(args.up_q, args.up_scale);
  p.used_rows = args.used_rows;
  if (p.tiles == 0) return cudaSuccess;
  using detail::SwigluSource, detail::kRounded, detail::kTransposed;
  constexpr int kLayouts = kRounded | kTransposed;
  return p.has_limit ? detail::launch<SwigluSource<true>, kLayouts>(p, stream)
                     : detail::launch<SwigluSource<false>, kLayouts>(p, stream);
}

}  // namespace mok::mxfp8
