// The expert elementwise kernels: SwiGLU forward and backward, router-weight row scaling.
//
// Each row is handled by one CTA in 16-byte vectors (8 bf16): a CTA past the used rows writes
// zeros and leaves. The backward's row sum (the router-weight gradient) is reduced in a fixed
// order -- each thread's columns in order, then a fixed tree -- so it is bitwise reproducible.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "experts/experts.h"
#include "experts/swiglu_math.cuh"
#include "mxfp8/math.cuh"

namespace mok::experts {
// Named, not anonymous: nvcc names anonymous namespaces after the build path, which would
// make the binary depend on where it was built.
namespace detail {

constexpr int kThreads = 256;
constexpr int kVector = 8;  // bf16 per 16 bytes

struct Bf16x8 {
  uint4 raw;
  __device__ float get(int i) const {
    const auto* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
    return __bfloat162float(h[i]);
  }
  __device__ void set(int i, float v) {
    auto* h = reinterpret_cast<__nv_bfloat16*>(&raw);
    h[i] = __float2bfloat16_rn(v);
  }
};

__device__ Bf16x8 load8(const void* base, int64_t index) {
  return {reinterpret_cast<const uint4*>(base)[index]};
}

// Vector `index` (8 values from element 8 * index of a [rows, cols] matrix) of an MXFP8
// matrix: E4M3 `data` and its swizzled `scales`, one scale for the 8 (8 divides a block), each
// value mxfp8_dequantize's bf16(e4m3 * 2^(scale - 127)).
__device__ Bf16x8 load8_mxfp8(const void* data, const void* scales, int64_t index, int64_t cols) {
  const uint2 packed = reinterpret_cast<const uint2*>(data)[index];
  const int64_t row = index * kVector / cols;
  const int64_t col = index * kVector % cols;
  const auto* bytes = static_cast<const uint8_t*>(scales);
  const float scale = mxfp8::scale_value(bytes[mxfp8::swizzled_scale_index(row, col, cols)]);
  const auto* fp8 = reinterpret_cast<const __nv_fp8_e4m3*>(&packed);
  Bf16x8 out;
  for (int i = 0; i < kVector; ++i) out.set(i, __fmul_rn(static_cast<float>(fp8[i]), scale));
  return out;
}

// Vector `index` of gate or up: bf16, or (kMxfp8) dequantized from its MXFP8 pair.
template <bool kMxfp8>
__device__ Bf16x8 load_input8(const void* data, const void* scales, int64_t index, int64_t cols) {
  if constexpr (kMxfp8) {
    return load8_mxfp8(data, scales, index, cols);
  } else {
    return load8(data, index);
  }
}

__device__ void store8(void* base, int64_t index, const Bf16x8& v) {
  reinterpret_cast<uint4*>(base)[index] = v.raw;
}

__device__ void zero_row(void* base, int64_t row, int64_t vectors) {
  if (base == nullptr) return;  // an output whose unused rows stay untouched
  auto* out = reinterpret_cast<uint4*>(base) + row * vectors;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) out[v] = make_uint4(0, 0, 0, 0);
}

// `output` when its rows past num_tokens are to be zeroed, else null (they stay as they are).
__device__ void* zeroed_rest(void* output, bool zero_rest) { return zero_rest ? output : nullptr; }

// True for this CTA's row past the used rows, after zeroing the row in every non-null output.
template <class... Outputs>
__device__ bool past_used_rows(const int32_t* num_tokens, int64_t vectors, Outputs*... outputs) {
  const int64_t row = blockIdx.x;
  if (row < *num_tokens) return false;
  (zero_row(outputs, row, vectors), ...);
  return true;
}

// torch's sigmoid(x) = 1 / (1 + exp(-x)), in fp32.
__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// kLimit: whether args.has_limit is set, as a template argument, so that the common unclamped
// form carries no per-element clamp or flag test. (The backward keeps the run-time flag: as a
// template argument it took 62 registers against 48, and held to 48 it spilled.)
template <bool kLimit>
__global__ void swiglu_kernel(SwigluArgs args) {
  const int64_t row = blockIdx.x;
  const int64_t vectors = args.inter / kVector;
  if (past_used_rows(args.num_tokens, vectors, zeroed_rest(args.hidden, args.zero_rest))) return;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const int64_t index = row * vectors + v;
    const Bf16x8 gate = load8(args.gate, index);
    const Bf16x8 up = load8(args.up, index);
    Bf16x8 hidden;
    for (int i = 0; i < kVector; ++i) {
      hidden.set(i, swiglu_value(gate.get(i), up.get(i), kLimit, args.limit));
    }
    store8(args.hidden, index, hidden);
  }
}

// Fixed-order block sum: shared-memory tree over kThreads partial sums.
__device__ float block_sum(float value, float* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) scratch[threadIdx.x] += scratch[threadIdx.x + width];
    __syncthreads();
  }
  return scratch[0];
}

struct SwigluGrad {
  float d_gate, d_up;
};

// The reference's swiglu_backward for one element, given the scaled gradient rw * d_h.
__device__ SwigluGrad swiglu_grad(float d_scaled, float gate, float up, bool has_limit,
                                  float limit) {
  const float g = clamp_gate(gate, has_limit, limit);
  const float u = clamp_up(up, has_limit, limit);
  const float sig = sigmoid(g);
  const float slope = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig))));
  float d_gate = __fmul_rn(__fmul_rn(d_scaled, u), slope);
  float d_up = __fmul_rn(__fmul_rn(d_scaled, g), sig);
  if (has_limit) {
    d_gate = gate <= limit ? d_gate : 0.0f;
    d_up = fabsf(up) <= limit ? d_up : 0.0f;
  }
  return {d_gate, d_up};
}

// kMxfp8: gate and up are MXFP8 pairs (args.gate_scale, args.up_scale).
template <bool kMxfp8>
__global__ void swiglu_backward_kernel(SwigluBackwardArgs args) {
  __shared__ float scratch[kThreads];
  const int64_t row = blockIdx.x;
  const int64_t vectors = args.inter / kVector;
  const bool zero = args.zero_rest;
  if (past_used_rows(args.num_tokens, vectors, zeroed_rest(args.d_gate, zero),
                     zeroed_rest(args.d_up, zero), zeroed_rest(args.d_hidden, zero),
                     zeroed_rest(args.scaled_hidden, zero))) {
    if (threadIdx.x == 0) args.d_router_weight[row] = 0.0f;
    return;
  }
  const float rw = args.router_weight[row];
  float dot = 0.0f;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const int64_t index = row * vectors + v;
    const float4* d_h = reinterpret_cast<const float4*>(args.d_h) + 2 * index;
    const float4 lo = d_h[0], hi = d_h[1];
    const float dh[kVector] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const Bf16x8 gate = load_input8<kMxfp8>(args.gate, args.gate_scale, index, args.inter);
    const Bf16x8 up = load_input8<kMxfp8>(args.up, args.up_scale, index, args.inter);
    const Bf16x8 hidden = load8(args.hidden, index);
    Bf16x8 d_gate, d_up, d_hidden, scaled_hidden;
    for (int i = 0; i < kVector; ++i) {
      dot = __fadd_rn(dot, __fmul_rn(dh[i], hidden.get(i)));
      const float scaled = __fmul_rn(rw, dh[i]);
      const SwigluGrad grad = swiglu_grad(scaled, gate.get(i), up.get(i), args.has_limit,
                                          args.limit);
      d_gate.set(i, grad.d_gate);
      d_up.set(i, grad.d_up);
      d_hidden.set(i, scaled);
      scaled_hidden.set(i, __fmul_rn(rw, hidden.get(i)));  // scale_rows_kernel's product
    }
    store8(args.d_gate, index, d_gate);
    store8(args.d_up, index, d_up);
    if (args.d_hidden != nullptr) store8(args.d_hidden, index, d_hidden);
    if (args.scaled_hidden != nullptr) store8(args.scaled_hidden, index, scaled_hidden);
  }
  const float total = block_sum(dot, scratch);
  if (threadIdx.x == 0) args.d_router_weight[row] = total;
}

__global__ void scale_rows_kernel(ScaleRowsArgs args) {
  const int64_t row = blockIdx.x;
  const int64_t vectors = args.cols / kVector;
  if (past_used_rows(args.num_tokens, vectors, zeroed_rest(args.out, args.zero_rest))) return;
  const float weight = args.weight[row];
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const Bf16x8 x = load8(args.x, row * vectors + v);
    Bf16x8 out;
    for (int i = 0; i < kVector; ++i) out.set(i, __fmul_rn(weight, x.get(i)));
    store8(args.out, row * vectors + v, out);
  }
}

// One CTA per row.
template <class Args>
cudaError_t launch_rows(void (*kernel)(Args), const Args& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  kernel<<<static_cast<unsigned>(args.rows), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace detail

cudaError_t launch_swiglu(const SwigluArgs& args, cudaStream_t stream) {
  return detail::launch_rows(
      args.has_limit ? detail::swiglu_kernel<true> : detail::swiglu_kernel<false>, args, stream);
}

cudaError_t launch_swiglu_backward(const SwigluBackwardArgs& args, cudaStream_t stream) {
  const bool mxfp8 = args.gate_scale != nullptr;
  return detail::launch_rows(mxfp8 ? detail::swiglu_backward_kernel<true>
                                   : detail::swiglu_backward_kernel<false>,
                             args, stream);
}

cudaError_t launch_scale_rows(const ScaleRowsArgs& args, cudaStream_t stream) {
  return detail::launch_rows(detail::scale_rows_kernel, args, stream);
}

}  // namespace mok::experts
