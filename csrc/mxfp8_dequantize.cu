// MXFP8 -> bf16 for the GEMMs: one thread per 16 E4M3 values (half a scale block).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/mxfp8_format.hpp"
#include "common/mxfp8_math.cuh"
#include "mxfp8.h"

namespace mok::mxfp8 {
namespace {

constexpr int kPerThread = 16;

// 2^(byte - 127) as an fp32 (byte 0 is the subnormal 2^-127; 255 is E8M0's NaN).
__device__ __forceinline__ float scale_value(uint32_t byte) {
  if (byte == 255u) return __uint_as_float(0x7fc00000u);
  return byte > 0 ? __uint_as_float(byte << 23) : __uint_as_float(0x00400000u);
}

__global__ void dequantize_kernel(DequantizeArgs args) {
  const int64_t chunks_per_row = args.cols / kPerThread;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= args.rows * chunks_per_row) return;
  const int64_t row = chunk / chunks_per_row;
  const int64_t col = (chunk % chunks_per_row) * kPerThread;
  const int64_t block = col / kBlock;  // scale block along the row
  const int64_t tile = (row / kTile) * (args.cols / kTile) + block / (kTile / kBlock);
  const auto* scales = static_cast<const uint8_t*>(args.scale);
  const float scale = scale_value(
      scales[tile * kTileScaleBytes +
             swizzled_scale_offset(static_cast<int>(row % kTile),
                                   static_cast<int>(block % (kTile / kBlock)))]);
  const uint4 packed = reinterpret_cast<const uint4*>(args.data)[chunk];
  const auto* fp8 = reinterpret_cast<const __nv_fp8_e4m3*>(&packed);
  uint4 result[2];
  auto* out = reinterpret_cast<__nv_bfloat16*>(result);
  for (int i = 0; i < kPerThread; ++i) {
    out[i] = __float2bfloat16_rn(__fmul_rn(static_cast<float>(fp8[i]), scale));
  }
  auto* dst = reinterpret_cast<uint4*>(args.out) + 2 * chunk;
  dst[0] = result[0];
  dst[1] = result[1];
}

}  // namespace

cudaError_t launch_dequantize(const DequantizeArgs& args, cudaStream_t stream) {
  const int64_t chunks = args.rows * args.cols / kPerThread;
  if (chunks == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((chunks + kThreads - 1) / kThreads);
  dequantize_kernel<<<blocks, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace mok::mxfp8
