// MXFP8 -> bf16 for the GEMMs: one thread per 16 E4M3 values (half a scale block). The
// transposed form stages a 64 x 128 tile in shared memory so both its reads and its writes are
// 16-byte coalesced.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "mxfp8/format.hpp"
#include "mxfp8/math.cuh"
#include "mxfp8/mxfp8.h"

namespace mok::mxfp8 {
// Named, not anonymous: nvcc names anonymous namespaces after the build path, which would
// make the binary depend on where it was built.
namespace dequantize_detail {

constexpr int kPerThread = 16;

// The scale of element (row, col).
__device__ __forceinline__ float scale_at(const DequantizeArgs& args, int64_t row, int64_t col) {
  const auto* scales = static_cast<const uint8_t*>(args.scale);
  return scale_value(scales[swizzled_scale_index(row, col, args.cols)]);
}

// The 16 values of the chunk of `data` starting at element (row, col), as bf16.
__device__ __forceinline__ void dequantize16(const DequantizeArgs& args, int64_t row, int64_t col,
                                             __nv_bfloat16 (&out)[kPerThread]) {
  const float scale = scale_at(args, row, col);
  const uint4 packed = reinterpret_cast<const uint4*>(args.data)[(row * args.cols + col) / 16];
  const auto* fp8 = reinterpret_cast<const __nv_fp8_e4m3*>(&packed);
  for (int i = 0; i < kPerThread; ++i) {
    out[i] = __float2bfloat16_rn(__fmul_rn(static_cast<float>(fp8[i]), scale));
  }
}

__global__ void dequantize_kernel(DequantizeArgs args) {
  const int64_t chunks_per_row = args.cols / kPerThread;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= args.rows * chunks_per_row) return;
  alignas(16) __nv_bfloat16 values[kPerThread];
  dequantize16(args, chunk / chunks_per_row, (chunk % chunks_per_row) * kPerThread, values);
  const auto* packed = reinterpret_cast<const uint4*>(values);
  auto* dst = reinterpret_cast<uint4*>(args.out) + 2 * chunk;
  dst[0] = packed[0];
  dst[1] = packed[1];
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
  __nv_bfloat16 even[kPerThread], odd[kPerThread];
  dequantize16(args, row0 + r, col0 + k * kPerThread, even);
  dequantize16(args, row0 + r + 1, col0 + k * kPerThread, odd);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const __nv_bfloat162 pair(even[i], odd[i]);
    staged[staged_word(k * kPerThread + i, r)] = *reinterpret_cast<const uint32_t*>(&pair);
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
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((chunks + kThreads - 1) / kThreads);
  dequantize_kernel<<<blocks, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace mok::mxfp8
