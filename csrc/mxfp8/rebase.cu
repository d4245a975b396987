// The exponent bytes of the f16 GEMM's rebased rows (grouped_gemm.h's M_GROUPED_MXFP8_NT_F16_ROWS).
// Weights: each row's exponent byte R (its largest scale byte minus 7, so that 448 * 2^(E - R)
// stays under f16's 65504) and each scale block's f16 factor 2^(E - R), in the scale tiles'
// layout; one CTA per 128-row scale tile. Activations: each bf16 row's R, which puts its
// largest magnitude in [2^14, 2^15): its MXFP8 rounding may round that up to 2^15, still under
// 65504; one warp per row.
#include <cstdint>

#include "mxfp8/format.hpp"
#include "mxfp8/math.cuh"
#include "mxfp8/mxfp8.h"

namespace mok::mxfp8 {
// Named, not anonymous: nvcc names anonymous namespaces after the build path.
namespace rebase_detail {

constexpr uint32_t kNanByte = 255;       // E8M0's NaN
constexpr int kWeightHeadroom = 7;       // 448 * 2^7 < 65504
constexpr uint16_t kHalfNan = 0x7e00;    // torch's f16 NaN
constexpr int kHalfBias = 15;
constexpr int kRowHeadroom = 14;  // 2^(E - 127) * 2^(127 - (E - 14)) = 2^14
constexpr int kRowThreads = 256;
constexpr int kWeightThreads = 256;
constexpr int kTileWords = kTileScaleBytes / 4;  // 128: one per row of the tile
constexpr int kStagedTiles = 16;                 // 8 KB of scale bytes in shared memory

// f16 bits of 2^e: normal from 2^-14, subnormal down to 2^-24, zero below (round to nearest
// even gives 0 for 2^-25, as for anything smaller).
__device__ __forceinline__ uint16_t half_power(int e) {
  if (e >= 1 - kHalfBias) return static_cast<uint16_t>((e + kHalfBias) << 10);
  if (e >= -24) return static_cast<uint16_t>(1u << (e + 24));
  return 0;
}

// Row r's 4 scale bytes of a K tile are the 4-byte word (r % 32) * 4 + r / 32 of its 512 bytes
// (swizzled_scale_offset); the inverse: the row of word w.
__device__ __forceinline__ int row_of_word(int w) { return w / 4 + 32 * (w % 4); }

// The largest scale byte (255, NaN, left out) among a word's 4.
__device__ __forceinline__ int largest_byte(uint32_t word, int largest) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t byte = (word >> (8 * b)) & 0xffu;
    if (byte != kNanByte) largest = max(largest, static_cast<int>(byte));
  }
  return largest;
}

// One CTA per 128-row scale tile row: the K tiles' scale bytes go through shared memory in
// coalesced 16-byte loads, kStagedTiles at a time, while thread r < 128 keeps row r's largest
// byte; then every thread turns words of 4 bytes (one row's) into 4 factors, coalesced. A first
// form, one thread per row walking its 4-byte words 512 bytes apart, was latency-bound.
__global__ void __launch_bounds__(kWeightThreads)
    weight_factors_kernel(const RebaseWeightArgs args) {
  __shared__ uint32_t staged[kStagedTiles * kTileWords];
  __shared__ int row_exponent[kTile];
  const int k_tiles = static_cast<int>(args.cols / kTile);
  const int64_t first_word = int64_t{blockIdx.x} * k_tiles * kTileWords;
  const auto* words = static_cast<const uint32_t*>(args.scale) + first_word;
  int largest = 0;
  for (int t0 = 0; t0 < k_tiles; t0 += kStagedTiles) {
    const int tiles = min(kStagedTiles, k_tiles - t0);
    const auto* chunk = reinterpret_cast<const uint4*>(words + t0 * kTileWords);
    for (int i = threadIdx.x; i < tiles * kTileWords / 4; i += kWeightThreads) {
      reinterpret_cast<uint4*>(staged)[i] = chunk[i];
    }
    __syncthreads();
    if (threadIdx.x < kTile) {
      const int word = (threadIdx.x % 32) * 4 + threadIdx.x / 32;
      for (int t = 0; t < tiles; ++t) {
        largest = largest_byte(staged[t * kTileWords + word], largest);
      }
    }
    __syncthreads();
  }
  if (threadIdx.x < kTile) {
    const int exponent = max(largest - kWeightHeadroom, 0);
    row_exponent[threadIdx.x] = exponent;
    static_cast<uint8_t*>(args.row_exponents)[int64_t{blockIdx.x} * kTile + threadIdx.x] =
        static_cast<uint8_t>(exponent);
  }
  __syncthreads();
  auto* factors = static_cast<uint2*>(args.factors) + first_word;
  for (int w = threadIdx.x; w < k_tiles * kTileWords; w += kWeightThreads) {
    const uint32_t word = words[w];
    const int exponent = row_exponent[row_of_word(w % kTileWords)];
    uint32_t out[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (word >> (8 * b)) & 0xffu;
      out[b] = byte == kNanByte ? kHalfNan : half_power(static_cast<int>(byte) - exponent);
    }
    factors[w] = make_uint2(out[0] | (out[1] << 16), out[2] | (out[3] << 16));
  }
}

// R = the biased exponent of the row's largest |x| minus 14 (clamped to 0: zero and subnormal
// rows), bf16 bit patterns compared as unsigned magnitudes (NaN's above every number).
__global__ void __launch_bounds__(kRowThreads) row_exponents_kernel(const RowExponentsArgs args) {
  const int64_t row = int64_t{blockIdx.x} * (kRowThreads / 32) + threadIdx.x / 32;
  if (row >= args.rows) return;
  const int lane = threadIdx.x % 32;
  const auto* x = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(args.x) +
                                                 row * args.cols);
  uint32_t amax2 = 0;
#pragma unroll 4
  for (int64_t i = lane; i < args.cols / 8; i += 32) {
    const uint4 v = x[i];
    amax2 = __vmaxu2(amax2, __vmaxu2(v.x & kAbsMask2, v.y & kAbsMask2));
    amax2 = __vmaxu2(amax2, __vmaxu2(v.z & kAbsMask2, v.w & kAbsMask2));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    amax2 = __vmaxu2(amax2, __shfl_xor_sync(0xffffffffu, amax2, offset));
  }
  const int biased = static_cast<int>(max(amax2 & 0xffffu, amax2 >> 16) >> 7);
  if (lane == 0) {
    static_cast<uint8_t*>(args.out)[row] = static_cast<uint8_t>(max(biased - kRowHeadroom, 0));
  }
}

}  // namespace rebase_detail

cudaError_t launch_rebase_weight(const RebaseWeightArgs& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  const auto tiles = static_cast<unsigned>(args.rows / kTile);
  rebase_detail::weight_factors_kernel<<<tiles, rebase_detail::kWeightThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_row_exponents(const RowExponentsArgs& args, cudaStream_t stream) {
  using rebase_detail::kRowThreads;
  constexpr int kRowsPerBlock = kRowThreads / 32;
  if (args.rows == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((args.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  rebase_detail::row_exponents_kernel<<<blocks, kRowThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace mok::mxfp8
