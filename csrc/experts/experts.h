// Host entry points of the expert elementwise kernels (defined in elementwise.cu): the SwiGLU
// forward, its backward with the router-weight gradient, and the router-weight row scaling.
//
// They run over the schedule's routed rows and read the padded row count (`num_tokens`) on the
// device: rows past it cost no arithmetic and are written as zeros, or left as they are
// (zero_rest false), so a buffer sized for the worst case costs only what the step uses. Every
// value is computed in fp32 and rounded once where it is stored, in the order mok.experts
// spells out.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mok::experts {

struct SwigluArgs {
  const void* gate = nullptr;        // bf16 [rows, inter]
  const void* up = nullptr;          // bf16 [rows, inter]
  void* hidden = nullptr;            // bf16 [rows, inter] out
  const int32_t* num_tokens = nullptr;  // [1] used rows (device)
  int64_t rows = 0;
  int64_t inter = 0;  // a multiple of 8
  bool has_limit = false;
  float limit = 0.0f;  // SwiGLU clamp L: silu(min(g, L)) * clamp(u, -L, L)
  bool zero_rest = true;  // false: rows past num_tokens are left as they are (internal buffers)
};

struct SwigluBackwardArgs {
  const float* d_h = nullptr;        // fp32 [rows, inter]: d_out @ W_down (unscaled)
  const float* router_weight = nullptr;  // fp32 [rows]
  const void* gate = nullptr;        // bf16 [rows, inter], or E4M3 with `gate_scale`
  const void* up = nullptr;          // bf16 [rows, inter], or E4M3 with `up_scale`
  // Optional: gate and up are MXFP8 (the forward's saved pairs) with these swizzled scale
  // tiles, blocks along inter (rows and inter multiples of 128); their values are
  // mxfp8_dequantize's bf16, so the results are those of the dequantized tensors, bit for bit.
  const void* gate_scale = nullptr;
  const void* up_scale = nullptr;
  const void* hidden = nullptr;      // bf16 [rows, inter]
  void* d_gate = nullptr;            // bf16 [rows, inter] out
  void* d_up = nullptr;              // bf16 [rows, inter] out
  void* d_hidden = nullptr;          // bf16 [rows, inter] out: rw * d_h; null skips it
  float* d_router_weight = nullptr;  // fp32 [rows] out: sum_i d_h * hidden
  // Optional bf16 [rows, inter] out: bf16(rw * hidden), the BF16 down weight gradient's rows
  // (what scale_rows of hidden writes), while hidden is loaded anyway; null skips it.
  void* scaled_hidden = nullptr;
  const int32_t* num_tokens = nullptr;
  int64_t rows = 0;
  int64_t inter = 0;
  bool has_limit = false;
  float limit = 0.0f;
  bool zero_rest = true;  // false: the bf16 outputs' rows past num_tokens are left as they are
};

struct ScaleRowsArgs {
  const void* x = nullptr;           // bf16 [rows, cols]
  const float* weight = nullptr;     // fp32 [rows]
  void* out = nullptr;               // bf16 [rows, cols] out: weight[r] * x[r]
  const int32_t* num_tokens = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;  // a multiple of 8
  bool zero_rest = true;  // false: rows past num_tokens are left as they are (internal buffers)
};

// Each enqueues one kernel on `stream` and returns the launch status (never synchronises).
cudaError_t launch_swiglu(const SwigluArgs& args, cudaStream_t stream);
cudaError_t launch_swiglu_backward(const SwigluBackwardArgs& args, cudaStream_t stream);
cudaError_t launch_scale_rows(const ScaleRowsArgs& args, cudaStream_t stream);

}  // namespace mok::experts
