// Host entry point of the MXFP8 quantize kernel (defined in mxfp8.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/mxfp8_format.hpp"

namespace mok::mxfp8 {

// Raw device pointers of one quantize call. x is bf16 [experts, rows, cols] (contiguous).
// Normal outputs: out fp8 [experts, rows, cols], scale uint8 [experts*rows/128, cols/128, 32, 16].
// Transposed outputs: out_t fp8 [experts, cols, rows],
//                     scale_t uint8 [experts*cols/128, rows/128, 32, 16].
// A null out/scale pair skips that layout.
struct QuantizeArgs {
  const void* x = nullptr;
  void* out = nullptr;
  void* scale = nullptr;
  void* out_t = nullptr;
  void* scale_t = nullptr;
  int64_t experts = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Enqueues the kernel on `stream`; returns the launch status (never synchronises).
cudaError_t launch_quantize(const QuantizeArgs& args, cudaStream_t stream);

// out (bf16 [rows, cols]) = bf16(e4m3 data * 2^(scale byte - 127)), the fp32 product rounded to
// nearest even: what a bf16 GEMM reads for MXFP8 operands (exact wherever bf16 can hold it).
// Blocks of 32 run along cols; scales are swizzled [rows/128, cols/128, 32, 16]; a scale byte of
// 255 gives NaN. rows and cols are multiples of 128. With `transposed`, data [experts, R, cols]
// (rows = experts * R) is written as out [experts, cols, R]: the row-major operand a GEMM wants
// from a layout quantized along rows, without a separate transposing copy.
struct DequantizeArgs {
  const void* data = nullptr;
  const void* scale = nullptr;
  void* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  bool transposed = false;
  int64_t experts = 1;  // transposed only: rows / experts rows per expert, a multiple of 128
};

cudaError_t launch_dequantize(const DequantizeArgs& args, cudaStream_t stream);

}  // namespace mok::mxfp8
