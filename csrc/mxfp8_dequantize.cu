// MXFP8 -> bf16 for the GEMMs. The plain form gives each thread one scale block (32 E4M3
// values); the transposed form stages a 64 x 128 tile in shared memory so both its reads and its
// writes are 16-byte coalesced. Every value is the fp32 product of the E4M3 value and its scale,
// rounded once to bf16 (what mok/mxfp8.py's dequantize gives, bit for bit).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/mxfp8_format.hpp"
#include "common/mxfp8_math.cuh"
#include "mxfp8.h"

namespace mok::mxfp8 {
// Named, not anonymous: nvcc names anonymous namespaces after the build path, which would
// make the binary depend on where it was built.
namespace dequantize_detail {

constexpr int kPerThread = 16;  // values per thread and row in the transposed form
constexpr int kWords = kPerThread / 2;

// The scale of element (row, col).
__device__ __forceinline__ float scale_at(const DequantizeArgs& args, int64_t row, int64_t col) {
  const int64_t block = col / kBlock;  // scale block along the row
  const int64_t tile = (row / kTile) * (args.cols / kTile) + block / (kTile / kBlock);
  const auto* scales = static_cast<const uint8_t*>(args.scale);
  return scale_value(scales[tile * kTileScaleBytes +
                            swizzled_scale_offset(static_cast<int>(row % kTile),
                                                  static_cast<int>(block % (kTile / kBlock)))]);
}

// 16 E4M3 values (little-endian in `packed`) times `scale` as 8 words of two bf16 each. Pairs
// convert with one instruction each way (E4M3x2 -> f16x2 is exact, as is f16 -> fp32), which
// keeps the kernel bound by memory rather than by instruction issue.
__device__ __forceinline__ void dequantize16(uint4 packed, float scale, uint32_t (&out)[kWords]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
    const float2 values = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    const __nv_bfloat162 rounded =
        __floats2bfloat162_rn(__fmul_rn(values.x, scale), __fmul_rn(values.y, scale));
    out[i] = *reinterpret_cast<const uint32_t*>(&rounded);
  }
}

// The 16 values of `data` starting at element (row, col).
__device__ __forceinline__ void dequantize_chunk(const DequantizeArgs& args, int64_t row,
                                                 int64_t col, uint32_t (&out)[kWords]) {
  const uint4 packed = reinterpret_cast<const uint4*>(args.data)[(row * args.cols + col) / 16];
  dequantize16(packed, scale_at(args, row, col), out);
}

// Thread b: scale block b of the row-major data (the launch checked that b fits 32 bits).
__global__ void dequantize_kernel(DequantizeArgs args, uint32_t blocks) {
  const uint32_t block = blockIdx.x * blockDim.x + threadIdx.x;
  if (block >= blocks) return;
  const auto blocks_per_row = static_cast<uint32_t>(args.cols / kBlock);
  const float scale = scale_at(args, block / blocks_per_row, (block % blocks_per_row) * kBlock);
  const auto* src = reinterpret_cast<const uint4*>(args.data) + 2 * static_cast<int64_t>(block);
  uint32_t words[2][kWords];
  dequantize16(src[0], scale, words[0]);
  dequantize16(src[1], scale, words[1]);
  auto* dst = reinterpret_cast<uint4*>(args.out) + 4 * static_cast<int64_t>(block);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t* w = &words[i / 2][4 * (i % 2)];
    dst[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

constexpr int kTileRows = 64;   // input rows per CTA = output columns
constexpr int kTileCols = 128;  // input columns per CTA = output rows
constexpr int kTransposeThreads = kTileRows / 2 * kTileCols / kPerThread;  // 256
constexpr int kChunksPerStagedRow = kTileRows / 8;                        // 16-byte chunks

// Word index in the staged tile (output row c holds the tile's 64 values of input column c as
// 8 chunks of 8 bf16) of the word holding input rows (r, r+1), r even. The chunk of row group
// r / 8 is stored at position (r / 8) ^ (c / 16 % 8): the 8 threads of a warp that write the
// same input rows write columns 16 apart, and without the swizzle every one of them would hit
// the same bank (it was the transposing dequantize's bottleneck, 8-way conflicts).
__device__ __forceinline__ int staged_word(int c, int r) {
  const int chunk = (r / 8) ^ (c / 16 % kChunksPerStagedRow);
  return c * (kTileRows / 2) + chunk * 4 + (r % 8) / 2;
}

// Thread t dequantizes input rows (2j, 2j+1), j = t / 8, columns [16k, 16k + 16), k = t % 8, and
// stages each column's pair as one word; then the tile is written out as 16-byte chunks.
__global__ void __launch_bounds__(kTransposeThreads) dequantize_transposed_kernel(
    DequantizeArgs args) {
  __shared__ alignas(16) uint32_t staged[kTileCols * kTileRows / 2];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTileRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  const int k = threadIdx.x % (kTileCols / kPerThread);
  const int r = 2 * (threadIdx.x / (kTileCols / kPerThread));
  uint32_t even[kWords], odd[kWords];
  dequantize_chunk(args, row0 + r, col0 + k * kPerThread, even);
  dequantize_chunk(args, row0 + r + 1, col0 + k * kPerThread, odd);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {  // column i's (row r, row r + 1) pair
    const uint32_t selector = i % 2 == 0 ? 0x5410u : 0x7632u;
    staged[staged_word(k * kPerThread + i, r)] = __byte_perm(even[i / 2], odd[i / 2], selector);
  }
  __syncthreads();
  const int64_t rows_per_expert = args.rows / args.experts;
  const int64_t expert = row0 / rows_per_expert;
  const int64_t r0 = row0 % rows_per_expert;
  for (int j = threadIdx.x; j < kTileCols * kChunksPerStagedRow; j += blockDim.x) {
    const int c = j / kChunksPerStagedRow;
    const int part = j % kChunksPerStagedRow;
    const uint4 chunk = *reinterpret_cast<const uint4*>(&staged[staged_word(c, 8 * part)]);
    const int64_t out_row = expert * args.cols + col0 + c;
    auto* dst = static_cast<__nv_bfloat16*>(args.out) + out_row * rows_per_expert + r0 + part * 8;
    *reinterpret_cast<uint4*>(dst) = chunk;
  }
}

}  // namespace dequantize_detail

cudaError_t launch_dequantize(const DequantizeArgs& args, cudaStream_t stream) {
  using namespace dequantize_detail;
  const int64_t chunks = args.rows * args.cols / kPerThread;
  if (chunks == 0) return cudaSuccess;
  if (args.transposed) {
    const dim3 grid(static_cast<unsigned>(args.cols / kTileCols),
                    static_cast<unsigned>(args.rows / kTileRows));
    dequantize_transposed_kernel<<<grid, kTransposeThreads, 0, stream>>>(args);
    return cudaGetLastError();
  }
  const int64_t blocks = args.rows * args.cols / kBlock;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;  // the binding refuses such sizes first
  constexpr int kThreads = 256;
  const auto ctas = static_cast<unsigned>((blocks + kThreads - 1) / kThreads);
  dequantize_kernel<<<ctas, kThreads, 0, stream>>>(args, static_cast<uint32_t>(blocks));
  return cudaGetLastError();
}

}  // namespace mok::mxfp8
