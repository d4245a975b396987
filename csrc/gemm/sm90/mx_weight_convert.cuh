// The consumer side of mx_weight_mainloop.cuh's conversion: one stage's E4M3 weight tile into
// the registers of wgmma's A operand, bf16 (the MXFP8 kinds) or f16 rebased per row
// (M_GROUPED_MXFP8_NT_F16_ROWS).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "mxfp8/math.cuh"

namespace mok::gemm::detail {

// Converts the consumer thread's fragment of one stage's E4M3 tile into registers. Its
// shared-memory offsets are the same for every stage, so they are computed once: by
// ALayout_64x16 the thread holds rows r and r + 8 and, per 16-wide k block kb, the pairs at
// 16 kb + k0 and 16 kb + k0 + 8; SmemLayoutW's 64-byte swizzle (Swizzle<2,4,3> on bytes) XORs
// the 16-byte chunk index kb with (r / 2) % 4, which r + 8 shares. (Address arithmetic per
// pair took a third of the conversion's instructions.) Storage holds smem_W (kTileBytes a
// stage) and smem_scale (kScaleBytes a stage: E8M0 bytes, or kF16's f16 factors).
template <class Storage, int kTileBytes, int kScaleBytes, bool kF16>
struct MxWeightConverter {
  Storage& storage;
  int pair_base;   // 64 r + k0: the pair (r, k0) within its chunk row
  int chunk[4];    // per k block: its swizzled chunk's byte offset
  int scale_base;  // row r's entry of K block 0 in the scale tile

  template <class Coords>
  CUTLASS_DEVICE static MxWeightConverter make(Storage& storage, Coords const& coords) {
    const int row = cute::get<0>(coords(0, 0, 0));
    const int k0 = cute::get<1>(coords(0, 0, 0));
    MxWeightConverter converter{storage, 64 * row + k0, {}, (row % 32) * 16 + (row / 32) * 4};
    CUTLASS_PRAGMA_UNROLL
    for (int kb = 0; kb < 4; ++kb) converter.chunk[kb] = (kb ^ (row / 2 % 4)) * 16;
    return converter;
  }

  template <class Fragment>
  CUTLASS_DEVICE void operator()(int stage, int k_tile, Fragment& frag) const {
    blocks<0, 4>(stage, k_tile, frag);
  }

  // Converts the fragment's 16-wide k blocks [kBegin, kEnd) only, decoding only their scales
  // (a tile's first k tile is converted a block at a time, each wgmma issued after its block).
  template <int kBegin, int kEnd, class Fragment>
  CUTLASS_DEVICE void blocks(int stage, int k_tile, Fragment& frag) const {
    using namespace cute;
    static_assert(size<0>(Fragment{}) == 8 && size<2>(Fragment{}) == 4, "64 x 64 per thread");
    const uint8_t* tile = storage.smem_W.data() + stage * kTileBytes + pair_base;
    // Rows r and r + 8 are 128 entries apart in a scale tile (r % 32 < 24); K blocks 1.
    const int entry = scale_base + 2 * (k_tile % 2);
    const uint8_t* scale_tile = storage.smem_scale.data() + stage * kScaleBytes;
    auto words = recast<uint32_t>(frag);  // word j: fragment values 2 j and 2 j + 1
    if constexpr (kF16) {
      // E4M3 pairs -> f16x2, times the block's factor (cuda_rebased.weight_factor_tiles).
      const __half* factor_tile = reinterpret_cast<const __half*>(scale_tile) + entry;
      __half2 factors[2][2];  // [row r or r + 8][32-value block of the k tile]
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        if (!uses_block<kBegin, kEnd>(i % 2)) continue;
        factors[i / 2][i % 2] = __half2half2(factor_tile[at(i)]);
      }
      for_each_pair<kBegin, kEnd>(tile, words, [&](__nv_fp8x2_storage_t pair, int row8, int block) {
        const __half2 scaled = __hmul2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)),
                                       factors[row8][block]);
        return *reinterpret_cast<const uint32_t*>(&scaled);
      });
    } else {
      // E4M3 pairs -> f16 -> fp32 -> bf16 (exact: E4M3 values have 4 significant bits), times
      // the block's scale as a bf16 pair, the product rounded once: five instructions a pair
      // where two fp32 multiplies before the packing took six.
      __nv_bfloat162 scales[2][2];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        if (!uses_block<kBegin, kEnd>(i % 2)) continue;
        const uint32_t pair = mxfp8::scale_bf16x2(scale_tile[entry + at(i)]);
        scales[i / 2][i % 2] = *reinterpret_cast<const __nv_bfloat162*>(&pair);
      }
      for_each_pair<kBegin, kEnd>(tile, words, [&](__nv_fp8x2_storage_t pair, int row8, int block) {
        const float2 values = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
        const __nv_bfloat162 scaled =
            __hmul2(__floats2bfloat162_rn(values.x, values.y), scales[row8][block]);
        return *reinterpret_cast<const uint32_t*>(&scaled);
      });
    }
  }

  // Entry i = 2 r8 + b of the thread's 2 x 2 scales: row r (+ 8 if r8), 32-value block b of
  // the k tile.
  CUTLASS_DEVICE static constexpr int at(int i) { return 128 * (i / 2) + i % 2; }

  // Whether k blocks [kBegin, kEnd) read the k tile's 32-value scale block `block`.
  template <int kBegin, int kEnd>
  CUTLASS_DEVICE static constexpr bool uses_block(int block) {
    return kBegin / 2 <= block && block <= (kEnd - 1) / 2;
  }

  // words(4 kb + j) = convert(pair, row8, block) for the thread's value pairs (r, k),
  // (r + 8, k), (r, k + 8), (r + 8, k + 8) of each k block kb; row8 is 1 for row r + 8, block the
  // 32-value scale block of the k tile. Only k blocks [kBegin, kEnd) are converted.
  template <int kBegin, int kEnd, class Words, class Convert>
  CUTLASS_DEVICE void for_each_pair(const uint8_t* tile, Words& words, Convert convert) const {
    CUTLASS_PRAGMA_UNROLL
    for (int kb = kBegin; kb < kEnd; ++kb) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        const int row8 = j % 2;
        const auto pair = *reinterpret_cast<const __nv_fp8x2_storage_t*>(
            tile + chunk[kb] + 512 * row8 + 8 * (j / 2));
        words(4 * kb + j) = convert(pair, row8, kb / 2);
      }
    }
  }
};

}  // namespace mok::gemm::detail
