// MXFP8 quantize: bf16 [E, M, N] -> E4M3 data + swizzled E8M0 scales, normal and/or transposed,
// and/or the values a GEMM reads for the normal layout (bf16, "rounded"); and the same fused
// after a SwiGLU (gate, up -> hidden), which also quantizes gate and up on the way.
//
// One kernel template serves all of them: a source policy produces each thread's row chunks of
// the tile (loaded from x, gathered from peers' rows by a schedule, or computed from gate and
// up), the template writes the layouts asked for. See common/mxfp8_tile.cuh for the tile and
// thread layout. Fusing saves whole passes over the routed rows: the rounded values replace a
// quantize + dequantize round trip through memory, the gathering form is the dispatch's pull
// and the rounding in one pass, and the SwiGLU form reads gate and up once for four outputs.
#include "common/mxfp8_tile.cuh"
#include "common/swiglu_math.cuh"
#include "mxfp8.h"

#include <cstdint>
#include <type_traits>

namespace mok::mxfp8 {
// A named namespace, not an anonymous one: nvcc derives anonymous-namespace symbol names from the
// source file's absolute path, which would make the binary depend on where it was built.
namespace detail {

using namespace tile;

// The outputs a launch writes, as bits of the kernel's kLayouts.
enum Layout : int {
  kNormal = 1,       // E4M3 data + scales, blocks along the row
  kRounded = 2,      // bf16 values of the normal layout
  kTransposed = 4,   // E4M3 data + scales of the transpose, blocks along the column
  kRoundedRows = 8,  // bf16 values of the transposed layout, in x's layout
  kRebased = 16,     // with kRounded (GatherSource): f16 rebased per row, and row exponents
};

struct Params {
  const uint16_t* x;     // LoadSource: bf16 [experts, rows, cols]
  const uint16_t* gate;  // SwigluSource: bf16 [rows, cols] each
  const uint16_t* up;
  const int32_t* num_tokens;  // SwigluSource: rows at or past it have hidden = 0
  bool has_limit;
  float limit;
  Pair normal;        // the result's normal layout
  uint16_t* rounded;       // bf16 values of the normal layout (kRebased: f16 rebased)
  uint8_t* row_exponents;  // kRebased: each row's exponent byte R (0 on padding rows)
  uint16_t* rounded_rows;  // bf16 values of the transposed layout, [experts, rows, cols]
  Pair transposed;
  Pair gate_q;  // SwigluSource: gate and up, normal layout
  Pair up_q;
  const int32_t* used_rows;  // non-null: tiles at or past *used_rows are skipped
  GatherArgs gather;         // GatherSource: where row i of the input comes from
  int64_t rows;
  int64_t cols;
  int tiles_m;
  int tiles_n;
  int64_t tiles;  // experts * tiles_m * tiles_n; a CTA takes tiles blockIdx.x + k * gridDim.x
};

// Element offset of (row, chunk) of tile t in an [experts, rows, cols] tensor.
__device__ __forceinline__ int64_t chunk_offset(const Params& p, const Tile& t, int row,
                                                int chunk) {
  return (t.expert * p.rows + t.m0 + row) * p.cols + t.n0 + chunk * kChunk;
}

// Scale tile index of tile t in the normal layout of an [experts, rows, cols] tensor.
__device__ __forceinline__ int64_t normal_scale_tile(const Params& p, const Tile& t) {
  return (t.expert * p.tiles_m + t.m_tile) * p.tiles_n + t.n_tile;
}

// A source whose constructor loads all of the thread's row chunks of the tile into registers
// (every load issued before any is used: 8 x 16 B in flight per thread).
struct RegisterRows {
  struct Shared {};
  uint32_t w[kPasses][kWordsPerChunk];

  __device__ void chunk(const Params&, const Tile&, int pass, int, int,
                        uint32_t (&out)[kWordsPerChunk], Shared&) {
#pragma unroll
    for (int i = 0; i < kWordsPerChunk; ++i) out[i] = w[pass][i];
  }

  __device__ void store_scales(const Params&, const Tile&, const Shared&, int, int) {}
};

// The tile's rows as they are in x.
struct LoadSource : RegisterRows {
  static constexpr bool kInTurns = false;

  __device__ LoadSource(const Params& p, const Tile& t, int row0, int chunk) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      load_chunk(p.x + chunk_offset(p, t, pass * kRowsPerPass + row0, chunk), w[pass]);
    }
  }
};

// The tile's rows gathered as the dispatch pulls them: row i is rank peer_rank[i]'s source row
// peer_token_idx[i] / divisor (a peer's symmetric buffer through its mapped address), zero on
// padding rows and on entries outside the group or the source. Loads as LoadSource's, through
// the coherent path: the rows were written by other GPUs before the barrier that precedes this
// kernel.
struct GatherSource : RegisterRows {
  static constexpr bool kInTurns = true;
  uint32_t exponent[kPasses];  // kRebased: each pass's row's exponent byte (0: padding)

  __device__ GatherSource(const Params& p, const Tile& t, int row0, int chunk) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t source = source_index(p, t.m0 + pass * kRowsPerPass + row0);
      const bool rebased = p.gather.src_exponents != nullptr;
      exponent[pass] = rebased && source >= 0 ? p.gather.src_exponents[source] : 0u;
      const uint16_t* row = source_row(p, t.m0 + pass * kRowsPerPass + row0, source);
      if (row == nullptr) {
#pragma unroll
        for (int i = 0; i < kWordsPerChunk; ++i) w[pass][i] = 0u;
        continue;
      }
      const uint4* src = reinterpret_cast<const uint4*>(row + t.n0 + chunk * kChunk);
      const uint4 a = src[0];
      const uint4 b = src[1];
      const uint32_t v[kWordsPerChunk] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < kWordsPerChunk; ++i) w[pass][i] = v[i];
    }
  }

 private:
  // Routed row `row`'s source row on its rank, -1 for none.
  __device__ static int64_t source_index(const Params& p, int64_t row) {
    const GatherArgs& g = p.gather;
    const int rank = g.peer_rank[row];
    const int32_t index = g.peer_token_idx[row];
    if (rank < 0 || rank >= g.ep || index < 0 || index / g.divisor >= g.src_rows) return -1;
    return index / g.divisor;
  }

  __device__ static const uint16_t* source_row(const Params& p, int64_t row, int64_t source) {
    if (source < 0) return nullptr;
    const uint64_t base = p.gather.src_table[p.gather.peer_rank[row]];
    return reinterpret_cast<const uint16_t*>(base) + source * p.cols;
  }
};

// hidden = bf16(silu(min(gate, L)) * clamp(up, -L, L)), as the SwiGLU kernel rounds it, with
// gate and up quantized (normal layout) from the same registers. The loads go in a ring of two
// passes: a pass's 4 x 16 B are issued as soon as the pass two before it is consumed, so loads
// stay in flight during the SwiGLU math (loading all 4 passes up front took 109 registers, 2
// CTAs per SM, and 0.370 ms on 1x H200 for 27648 x 3072, against 80 registers and 0.325 ms).
struct SwigluSource {
  static constexpr bool kInTurns = false;
  static constexpr int kSlots = 2;
  struct Shared {
    alignas(16) uint8_t gate_scale[kTileScaleBytes];
    alignas(16) uint8_t up_scale[kTileScaleBytes];
  };
  uint32_t g[kSlots][kWordsPerChunk];
  uint32_t u[kSlots][kWordsPerChunk];
  int row0;
  int chunk_index;

  __device__ SwigluSource(const Params& p, const Tile& t, int row0_, int chunk)
      : row0(row0_), chunk_index(chunk) {
#pragma unroll
    for (int pass = 0; pass < kSlots; ++pass) load(p, t, pass);
  }

  __device__ void chunk(const Params& p, const Tile& t, int pass, int row, int chunk,
                        uint32_t (&out)[kWordsPerChunk], Shared& s) {
    uint32_t(&gate)[kWordsPerChunk] = g[pass % kSlots];
    uint32_t(&up)[kWordsPerChunk] = u[pass % kSlots];
    const bool used = t.m0 + row < *p.num_tokens;
#pragma unroll
    for (int i = 0; i < kWordsPerChunk; ++i) {
      const float lo = swiglu_value(bf16_lo(gate[i]), bf16_lo(up[i]), p);
      const float hi = swiglu_value(bf16_hi(gate[i]), bf16_hi(up[i]), p);
      out[i] = used ? pack_bf16x2(lo, hi) : 0u;
    }
    const int64_t offset = chunk_offset(p, t, row, chunk);
    const int e_gate = row_chunk_scale(gate).e;
    store_row_chunk(p.gate_q, offset, row, chunk, gate, e_gate, s.gate_scale);
    const int e_up = row_chunk_scale(up).e;
    store_row_chunk(p.up_q, offset, row, chunk, up, e_up, s.up_scale);
    if (pass + kSlots < kPasses) load(p, t, pass + kSlots);
  }

  // After the block's barrier: warps 2 and 3 write gate's and up's scale tiles.
  __device__ void store_scales(const Params& p, const Tile& t, const Shared& s, int warp,
                               int lane) {
    const int64_t tile = normal_scale_tile(p, t) * kTileScaleBytes;
    if (warp == 2) tile::store_scales(p.gate_q.scale + tile, s.gate_scale, lane);
    if (warp == 3) tile::store_scales(p.up_q.scale + tile, s.up_scale, lane);
  }

 private:
  __device__ void load(const Params& p, const Tile& t, int pass) {
    const int64_t offset = chunk_offset(p, t, pass * kRowsPerPass + row0, chunk_index);
    load_chunk(p.gate + offset, g[pass % kSlots]);
    load_chunk(p.up + offset, u[pass % kSlots]);
  }

  __device__ static float swiglu_value(float gate, float up, const Params& p) {
    return experts::swiglu_value(gate, up, p.has_limit, p.limit);
  }
};

template <class Source, int kLayouts>
__device__ __forceinline__ void quantize_tile(const Params& p, const Tile& t) {
  constexpr bool kNormalOut = kLayouts & kNormal;
  constexpr bool kRoundedOut = kLayouts & kRounded;
  constexpr bool kTransposedOut = kLayouts & kTransposed;
  constexpr bool kRoundedRowsOut = kLayouts & kRoundedRows;
  constexpr bool kRebasedOut = kLayouts & kRebased;
  static_assert(!kRebasedOut || (kRoundedOut && std::is_same_v<Source, GatherSource>),
                "rebased rows are the gathering source's rounded values");
  constexpr bool kColumns = kTransposedOut || kRoundedRowsOut;  // needs the column blocks
  static_assert(!kRoundedRowsOut || std::is_same_v<Source, LoadSource>,
                "rounded rows re-read the source's chunks: LoadSource only");
  __shared__ uint32_t s_tile[kColumns ? kTile * kPitch : 1];
  __shared__ alignas(16) uint8_t s_scale[kTileScaleBytes];
  __shared__ alignas(16) uint8_t s_scale_t[kTileScaleBytes];
  // The column blocks' fast_floor_bits, [4 row blocks][128 columns], for the rounded rows.
  __shared__ alignas(16) uint32_t s_floor[kRoundedRowsOut ? kTile / kBlock * kTile : 1];
  __shared__ typename Source::Shared s_source;

  const int chunk = threadIdx.x % kChunksPerRow;
  const int row0 = threadIdx.x / kChunksPerRow;
  Source source(p, t, row0, chunk);

#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = pass * kRowsPerPass + row0;
    uint32_t w[kWordsPerChunk];
    source.chunk(p, t, pass, row, chunk, w, s_source);
    if constexpr (kColumns) {
      uint32_t* staged = s_tile + row * kPitch + chunk * kWordsPerChunk;
#pragma unroll
      for (int i = 0; i < kWordsPerChunk; ++i) staged[i] = w[i];
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
  quantize_tile<Source, kLayouts>(p, t);
}

// One tile per CTA, or, for a source that takes turns (Source::kInTurns), tiles blockIdx.x +
// k * gridDim.x. Only the gathering source loops: the loop cost the other forms registers (the
// rows-rounding one went from 64 to 152).
template <class Source, int kLayouts>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const Params p) {
  if constexpr (!Source::kInTurns) {
    quantize_tile_at<Source, kLayouts>(p, blockIdx.x);
  } else {
    for (int64_t id = blockIdx.x; id < p.tiles; id += gridDim.x) {
      quantize_tile_at<Source, kLayouts>(p, id);
      __syncthreads();  // the next tile reuses the shared buffers
    }
  }
}

// One CTA per tile, or `ctas` CTAs taking the tiles in turn (an exchange in the background of
// other work keeps to a few SMs).
template <class Source, int kLayouts>
cudaError_t launch(const Params& p, cudaStream_t stream, int64_t ctas = 0) {
  const int64_t grid = ctas > 0 && ctas < p.tiles ? ctas : p.tiles;
  quantize_kernel<Source, kLayouts><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// The load-source kernel for the layouts asked for: any set of the first three, or the rounded
// rows alone (what the callers ask for; the binding refuses other sets).
cudaError_t launch_layouts(const Params& p, cudaStream_t stream) {
  const int layouts = (p.normal.data ? kNormal : 0) | (p.rounded ? kRounded : 0) |
                      (p.transposed.data ? kTransposed : 0) |
                      (p.rounded_rows ? kRoundedRows : 0);
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
  p.transposed = detail::pair(args.out_t, args.scale_t);
  p.used_rows = args.used_rows;
  if (p.tiles == 0) return cudaSuccess;
  return detail::launch_layouts(p, stream);
}

cudaError_t launch_gather_round(const QuantizeArgs& args, const GatherArgs& gather, int ctas,
                                cudaStream_t stream) {
  detail::Params p = detail::tiled(1, args.rows, args.cols);
  p.gather = gather;
  p.rounded = static_cast<uint16_t*>(args.rounded);
  p.row_exponents = static_cast<uint8_t*>(args.row_exponents);
  p.transposed = detail::pair(args.out_t, args.scale_t);
  p.used_rows = args.used_rows;
  if (p.tiles == 0) return cudaSuccess;
  using detail::GatherSource, detail::kRebased, detail::kRounded, detail::kTransposed;
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
  return detail::launch<SwigluSource, kRounded | kTransposed>(p, stream);
}

}  // namespace mok::mxfp8
