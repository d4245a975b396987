// Host entry points of the MXFP8 kernels: quantize and its gathering and SwiGLU forms
// (quantize.cu), dequantize (dequantize.cu), and the exponent bytes of the f16-rows GEMM's
// rebased operands (rebase.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mxfp8/format.hpp"

namespace mok::mxfp8 {

// Raw device pointers of one quantize call. x is bf16 [experts, rows, cols] (contiguous).
// Normal outputs: out fp8 [experts, rows, cols], scale uint8 [experts*rows/128, cols/128, 32, 16].
// Transposed outputs: out_t fp8 [experts, cols, rows],
//                     scale_t uint8 [experts*cols/128, rows/128, 32, 16].
// Rounded output: rounded bf16 [experts, rows, cols] = the normal layout's values as
// launch_dequantize computes them, without storing that layout; rounded_rows likewise holds the
// transposed layout's values, in x's layout (asked for alone). A null out/scale pair (or
// rounded) skips that output. used_rows (device int32 [1], or null for all rows): 128-row tiles
// at or past *used_rows write nothing (routed rows past the schedule's are never read).
struct QuantizeArgs {
  const void* x = nullptr;
  void* out = nullptr;
  void* scale = nullptr;
  void* out_t = nullptr;
  void* scale_t = nullptr;
  void* rounded = nullptr;
  void* rounded_rows = nullptr;  // bf16 [experts, rows, cols]: the transposed layout's values
  // With rounded_rows (alone, or with rounded in launch_gather_round), or null: fp32
  // [experts * rows], each row of x taken as bf16(row_scale[r] * x[r]) (scale_rows's product)
  // before rounded_rows' rounding.
  const float* row_scale = nullptr;
  void* row_exponents = nullptr;  // launch_gather_round with src_exponents: uint8 [rows]
  const int32_t* used_rows = nullptr;
  int64_t experts = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Enqueues the kernel on `stream`; returns the launch status (never synchronises).
cudaError_t launch_quantize(const QuantizeArgs& args, cudaStream_t stream);

// Where the rows of a gathering quantize come from, as the dispatch pulls them: row i is rank
// peer_rank[i]'s source row peer_token_idx[i] / divisor, zero on padding rows (peer_rank < 0)
// and entries outside the group or the source.
struct GatherArgs {
  const uint64_t* src_table = nullptr;  // [ep] every rank's bf16 source [src_rows, cols], mapped
  // Non-null (ep 1 only): the caller's own source, read instead of src_table[0] (no copy into
  // the workspace buffer first). 16-byte aligned.
  const void* src_direct = nullptr;
  const int32_t* peer_rank = nullptr;  // [rows]
  const int32_t* peer_token_idx = nullptr;
  int64_t src_rows = 0;
  int divisor = 1;
  int ep = 1;
  // Non-null (EP 1: the local source's rows): uint8 [src_rows] exponent bytes R. The rounded
  // values are then written as f16 times 2^(127 - R) of their source row (the f16-rows GEMM's
  // rebased rows) and each row's R in QuantizeArgs::row_exponents (0 on padding rows).
  const uint8_t* src_exponents = nullptr;
};

// The MXFP8 forward's dispatch in one pass: gathers args.rows x args.cols routed rows as
// `gather` says (args.x unused) and writes what the rounding of x writes, args.rounded and the
// transposed pair (args.out_t, args.scale_t); args.used_rows as there (the schedule's
// num_tokens). `ctas` > 0 limits the grid (tiles are taken in turn), 0 gives one CTA per tile.
// With args.rounded_rows and args.row_scale instead of the transposed pair (the MXFP8
// backward's d_out pull): args.rounded as above and args.rounded_rows as launch_quantize writes
// them with row_scale, bit for bit (rebased rows not with it).
cudaError_t launch_gather_round(const QuantizeArgs& args, const GatherArgs& gather, int ctas,
                                cudaStream_t stream);

// The MXFP8 forward's SwiGLU step in one pass over gate and up (bf16 [rows, inter]):
//   hidden = bf16(silu(min(gate, L)) * clamp(up, -L, L)) for rows < *num_tokens, 0 after (as
//   the SwiGLU kernel writes it), stored as its rounded values (normal layout) and its
//   transposed pair [inter, rows]; gate and up quantized in the normal layout. Every output is
//   bit for bit what the SwiGLU kernel followed by launch_quantize would write.
struct SwigluQuantizeArgs {
  const void* gate = nullptr;
  const void* up = nullptr;
  void* hidden_rounded = nullptr;  // bf16 [rows, inter]
  void* hidden_t = nullptr;        // fp8 [inter, rows]
  void* hidden_scale_t = nullptr;  // uint8 [inter/128, rows/128, 32, 16]
  void* gate_q = nullptr;          // fp8 [rows, inter]
  void* gate_scale = nullptr;      // uint8 [rows/128, inter/128, 32, 16]
  void* up_q = nullptr;
  void* up_scale = nullptr;
  const int32_t* num_tokens = nullptr;  // device [1]
  const int32_t* used_rows = nullptr;   // as in QuantizeArgs
  int64_t rows = 0;   // a multiple of 128
  int64_t inter = 0;  // a multiple of 128
  bool has_limit = false;
  float limit = 0.0f;
};

cudaError_t launch_swiglu_quantize(const SwigluQuantizeArgs& args, cudaStream_t stream);

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

// An MXFP8 weight's operands for the f16 GEMM (M_GROUPED_MXFP8_NT_F16_ROWS) from its scale
// tiles `scale` uint8 [rows/128, cols/128, 32, 16]: `row_exponents` uint8 [rows], each row's
// largest scale byte (255, NaN, left out) minus 7, at least 0; `factors` f16 in the scale
// tiles' layout, 2^(E - R) for scale byte E of a row with exponent R (0 below 2^-24, NaN for
// 255). rows and cols are multiples of 128.
struct RebaseWeightArgs {
  const void* scale = nullptr;
  void* factors = nullptr;
  void* row_exponents = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

cudaError_t launch_rebase_weight(const RebaseWeightArgs& args, cudaStream_t stream);

// The exponent byte R of each row of bf16 x [rows, cols] (cols a multiple of 8): the biased
// exponent of the row's largest magnitude minus 14, at least 0, so that x * 2^(127 - R) puts it
// in [2^14, 2^15) and its MXFP8 rounding at most at 2^15 (M_GROUPED_MXFP8_NT_F16_ROWS's rebased
// rows; launch_gather_round's src_exponents).
struct RowExponentsArgs {
  const void* x = nullptr;
  void* out = nullptr;  // uint8 [rows]
  int64_t rows = 0;
  int64_t cols = 0;
};

cudaError_t launch_row_exponents(const RowExponentsArgs& args, cudaStream_t stream);

}  // namespace mok::mxfp8
