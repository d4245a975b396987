// Combine epilogues: out[t] = bf16(shared[t] + sum_j w[t, j] * routed[t * topk + j]).
//
// Each thread owns 8 consecutive elements (one 16-byte vector) of one output row and walks the
// row's topk routed rows in slot order, so every element sees exactly the reference's sequence
// of fp32 operations. __fmul_rn/__fadd_rn keep nvcc from contracting w * x + acc into an FMA,
// which would round once where the reference (two PyTorch kernels) rounds twice.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "comm/combine_epilogue.h"

namespace mok::comm {
// Named, not anonymous: anonymous-namespace symbols embed the source's absolute path.
namespace detail {

constexpr int kEpilogueThreads = 256;
constexpr int kMaxEpilogueCtas = 2048;  // grid-stride beyond this; a few waves of 132 SMs
constexpr int kElems = 8;               // bf16 elements per 16-byte vector
constexpr int kBatch = 4;               // routed rows loaded before they are summed

// bf16 -> fp32 is exact: the bf16 bits are the high half of the fp32 bits.
__device__ __forceinline__ void unpack(const uint4& v, float (&f)[kElems]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Round to nearest even, as PyTorch's float -> bfloat16 conversion on CUDA (__float2bfloat16).
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  const uint32_t l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

// acc += w * x (or acc += x) elementwise, each operation rounded on its own like the reference.
template <bool kWeighted>
__device__ __forceinline__ void accumulate(float (&acc)[kElems], const uint4& row, float w) {
  float x[kElems];
  unpack(row, x);
#pragma unroll
  for (int i = 0; i < kElems; ++i) acc[i] = __fadd_rn(acc[i], kWeighted ? __fmul_rn(w, x[i]) : x[i]);
}

// Vector `column` of route `route`'s row: row route (a combine buffer), or, read in place, row
// route_rows[route] of the routed rows, zeros where the route has none.
__device__ __forceinline__ uint4 routed_vector(const EpilogueArgs& a, const uint4* routed,
                                               int64_t route, uint32_t per_row, uint32_t column) {
  int64_t row = route;
  if (a.route_rows != nullptr) {
    row = a.route_rows[route];
    if (row < 0 || row >= a.routed_rows) return make_uint4(0, 0, 0, 0);  // bf16 +0.0
  }
  return routed[row * per_row + column];
}

template <bool kWeighted>
__global__ void __launch_bounds__(kEpilogueThreads) epilogue_kernel(EpilogueArgs a) {
  const uint32_t per_row = static_cast<uint32_t>(a.hidden / kElems);
  const uint32_t total = static_cast<uint32_t>(a.tokens) * per_row;
  const uint4* shared = static_cast<const uint4*>(a.shared);
  const uint4* routed = static_cast<const uint4*>(a.routed);
  uint4* out = static_cast<uint4*>(a.out);
  const uint32_t step = gridDim.x * blockDim.x;
  for (uint32_t v = blockIdx.x * blockDim.x + threadIdx.x; v < total; v += step) {
    const uint32_t token = v / per_row;
    const uint32_t column = v - token * per_row;
    float acc[kElems];
    if (shared != nullptr) {
      unpack(shared[v], acc);
    } else {
#pragma unroll
      for (int i = 0; i < kElems; ++i) acc[i] = 0.0f;  // +0.0, as torch.zeros
    }
    const int64_t first = static_cast<int64_t>(token) * a.topk;
    int j = 0;
    // Groups of kBatch slots: their loads are all in flight before the in-order accumulation.
    for (; j + kBatch <= a.topk; j += kBatch) {
      uint4 r[kBatch];
      float w[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        r[u] = routed_vector(a, routed, first + j + u, per_row, column);
        w[u] = kWeighted ? a.weights[first + j + u] : 1.0f;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) accumulate<kWeighted>(acc, r[u], w[u]);
    }
    for (; j < a.topk; ++j) {
      const float w = kWeighted ? a.weights[first + j] : 1.0f;
      accumulate<kWeighted>(acc, routed_vector(a, routed, first + j, per_row, column), w);
    }
    out[v] = make_uint4(pack_pair(acc[0], acc[1]), pack_pair(acc[2], acc[3]),
                        pack_pair(acc[4], acc[5]), pack_pair(acc[6], acc[7]));
  }
}

}  // namespace detail

cudaError_t launch_epilogue(const EpilogueArgs& args, cudaStream_t stream) {
  const int64_t total = args.tokens * (args.hidden / detail::kElems);
  if (total == 0) return cudaSuccess;
  const int64_t ctas = std::min<int64_t>(
      (total + detail::kEpilogueThreads - 1) / detail::kEpilogueThreads, detail::kMaxEpilogueCtas);
  const dim3 grid(static_cast<unsigned>(ctas));
  if (args.weights != nullptr) {
    detail::epilogue_kernel<true><<<grid, detail::kEpilogueThreads, 0, stream>>>(args);
  } else {
    detail::epilogue_kernel<false><<<grid, detail::kEpilogueThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace mok::comm
