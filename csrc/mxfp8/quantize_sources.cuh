// The source policies of quantize.cu's kernel: where each thread's row chunks of a tile
// come from (loaded from x, gathered from peers' rows by a schedule, or computed from gate and
// up), with the kernel's parameters and the layouts it can write. Included by quantize.cu only.
#pragma once

#include <cstdint>

#include "common/fast_divide.cuh"
#include "experts/swiglu_math.cuh"
#include "mxfp8/mxfp8.h"
#include "mxfp8/quantize_tile.cuh"

namespace mok::mxfp8::detail {

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
  const float* row_scale;  // ScaledLoadSource, ScaledGatherSource: fp32 [experts * rows]
  Pair transposed;
  Pair gate_q;  // SwigluSource: gate and up, normal layout
  Pair up_q;
  const int32_t* used_rows;  // non-null: tiles at or past *used_rows are skipped
  GatherArgs gather;         // GatherSource: where row i of the input comes from
  FastDivisor divisor;       // GatherSource: gather.divisor's
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

// Row `row` of tile t's weight in Params::row_scale.
__device__ __forceinline__ float row_weight(const Params& p, const Tile& t, int row) {
  return p.row_scale[t.expert * p.rows + t.m0 + row];
}

// w = bf16(weight * w), element by element: scale_rows's product.
__device__ __forceinline__ void scale_words(float weight, uint32_t (&w)[kWordsPerChunk]) {
#pragma unroll
  for (int i = 0; i < kWordsPerChunk; ++i) {
    w[i] = pack_bf16x2(__fmul_rn(weight, bf16_lo(w[i])), __fmul_rn(weight, bf16_hi(w[i])));
  }
}

// A source whose constructor loads all of the thread's row chunks of the tile into registers
// (every load issued before any is used: 8 x 16 B in flight per thread).
struct RegisterRows {
  // CTAs per SM the kernel of a form (kLayouts) is held to, 0 for none (quantize.cu's launch).
  template <int kLayouts>
  static constexpr int kMinCtas = 0;
  // Whether the column blocks (kTransposed, kRoundedRows) see the chunks times their rows'
  // weights (`scale_columns(pass, words)`) while the row blocks see them as they are.
  static constexpr bool kScalesColumns = false;
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
  // The rows-rounding form held to 4 (64 registers, as before its packed path took it to 71).
  template <int kLayouts>
  static constexpr int kMinCtas = kLayouts == kRoundedRows ? 4 : 0;

  __device__ LoadSource(const Params& p, const Tile& t, int row0, int chunk) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      load_chunk(p.x + chunk_offset(p, t, pass * kRowsPerPass + row0, chunk), w[pass]);
    }
  }
};

// The tile's rows as scale_rows writes them, bf16(row_scale[r] * x[r]): the MXFP8 backward's
// d_out rows times their router weights, rounded in blocks of 32 rows without the scaled rows
// making a round trip through memory.
struct ScaledLoadSource : LoadSource {
  __device__ ScaledLoadSource(const Params& p, const Tile& t, int row0, int chunk)
      : LoadSource(p, t, row0, chunk) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      scale_words(row_weight(p, t, pass * kRowsPerPass + row0), w[pass]);
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
  // The rebased gather: 4 (64 registers); left alone it took 80 and ran markedly slower. The
  // plain one: 5 (48 registers, no spills since its packed rounding; 63 and 4 CTAs left alone,
  // which was slower).
  template <int kLayouts>
  static constexpr int kMinCtas = (kLayouts & kRebased) != 0 ? 4 : 5;
  uint32_t exponent[kPasses];  // kRebased: each pass's row's exponent byte (0: padding)
  int row0;
  int chunk_index;

  __device__ GatherSource(int row0_, int chunk) : row0(row0_), chunk_index(chunk) {}

  // Loads this thread's row chunks of tile t.
  __device__ void load_rows(const Params& p, const Tile& t) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t row = t.m0 + pass * kRowsPerPass + row0;
      const int rank = p.gather.peer_rank[row];
      const int64_t source = source_index(p, rank, p.gather.peer_token_idx[row]);
      const bool rebased = p.gather.src_exponents != nullptr;
      exponent[pass] = rebased && source >= 0 ? p.gather.src_exponents[source] : 0u;
      if (source < 0) {
#pragma unroll
        for (int i = 0; i < kWordsPerChunk; ++i) w[pass][i] = 0u;
        continue;
      }
      const void* base = p.gather.src_direct != nullptr
                             ? p.gather.src_direct
                             : reinterpret_cast<const void*>(p.gather.src_table[rank]);
      const uint16_t* src_row = static_cast<const uint16_t*>(base) + source * p.cols;
      const uint4* src = reinterpret_cast<const uint4*>(src_row + t.n0 + chunk_index * kChunk);
      const uint4 a = src[0];
      const uint4 b = src[1];
      const uint32_t v[kWordsPerChunk] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < kWordsPerChunk; ++i) w[pass][i] = v[i];
    }
  }

 private:
  // The source row of an entry on its rank, -1 for none.
  __device__ static int64_t source_index(const Params& p, int rank, int32_t index) {
    const GatherArgs& g = p.gather;
    if (rank < 0 || rank >= g.ep || index < 0) return -1;
    const int64_t source = p.divisor.divide(index);
    return source < g.src_rows ? source : -1;
  }
};

// The MXFP8 backward's d_out rows as the dispatch pulls them, for both of its roundings in one
// pass: the row blocks (kRounded, the d_h GEMM's operand) see the rows as they are, the column
// blocks (kRoundedRows, d_W_down's) see bf16(row_scale[r] * row r), as ScaledLoadSource gives
// them (row_scale: the routed rows' router weights).
struct ScaledGatherSource : GatherSource {
  // 3 (80 registers): held to 4 (64) it spilled 20 bytes, with the weights loaded where used
  // instead of kept, 148.
  template <int kLayouts>
  static constexpr int kMinCtas = 3;
  static constexpr bool kScalesColumns = true;
  float weight[kPasses];

  using GatherSource::GatherSource;

  __device__ void load_rows(const Params& p, const Tile& t) {
    GatherSource::load_rows(p, t);
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      weight[pass] = row_weight(p, t, pass * kRowsPerPass + row0);
    }
  }

  __device__ void scale_columns(int pass, uint32_t (&w)[kWordsPerChunk]) const {
    scale_words(weight[pass], w);
  }
};

// hidden = bf16(silu(min(gate, L)) * clamp(up, -L, L)), as the SwiGLU kernel rounds it, with
// gate and up quantized (normal layout) from the same registers. The loads go in a ring of two
// passes: a pass's 4 x 16 B are issued as soon as the pass two before it is consumed, so loads
// stay in flight during the SwiGLU math (loading all 4 passes up front took 109 registers, 2
// CTAs per SM, and was slower than the ring's 80 registers).
// kLimit: whether a limit is set (Params::has_limit), a template argument so that the common
// unclamped form carries no per-element clamp or flag test.
template <bool kLimit>
struct SwigluSource {
  static constexpr bool kInTurns = false;
  static constexpr bool kScalesColumns = false;
  // 3 (80 registers): without the clamp's per-element work (kLimit false) ptxas took 86,
  // which leaves 2 CTAs per SM.
  template <int kLayouts>
  static constexpr int kMinCtas = 3;
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
    // Rows at or past num_tokens are zero: masked rather than skipped, which compiled to a
    // branch around every word's math (three instructions a word).
    const uint32_t keep = t.m0 + row < *p.num_tokens ? ~0u : 0u;
#pragma unroll
    for (int i = 0; i < kWordsPerChunk; ++i) {
      const float lo = swiglu_value(bf16_lo(gate[i]), bf16_lo(up[i]), p);
      const float hi = swiglu_value(bf16_hi(gate[i]), bf16_hi(up[i]), p);
      out[i] = pack_bf16x2(lo, hi) & keep;
    }
    const int64_t offset = chunk_offset(p, t, row, chunk);
    const int e_gate = row_chunk_scale(gate).e;
    // With a limit, the saved gate and up keep their side of it (keep_limit_side).
    constexpr LimitSide kGateSide = kLimit ? kUpperLimit : kNoLimit;
    constexpr LimitSide kUpSide = kLimit ? kBothLimits : kNoLimit;
    store_row_chunk<kGateSide>(p.gate_q, offset, row, chunk, gate, e_gate, s.gate_scale, p.limit);
    const int e_up = row_chunk_scale(up).e;
    store_row_chunk<kUpSide>(p.up_q, offset, row, chunk, up, e_up, s.up_scale, p.limit);
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
    return experts::swiglu_value(gate, up, kLimit, p.limit);
  }
};

}  // namespace mok::mxfp8::detail
