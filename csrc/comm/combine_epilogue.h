// Host entry point of the combine epilogues (defined in combine_epilogue.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mok::comm {

// out[t] = bf16(shared[t] + sum_j w[t, j] * routed[t * topk + j]) over j = 0..topk-1 in order,
// accumulated in fp32 with one rounding per multiply and per add (no fused multiply-add), so the
// result equals mok.ops.fwd_epilogue's PyTorch arithmetic bit for bit. Without `weights` the
// terms are the routed rows themselves (the backward epilogue); without `shared` the sum starts
// at +0.0 as the reference's torch.zeros does. With `route_rows` the routed rows are read in
// place: route t * topk + j is row route_rows[t * topk + j] of `routed` ([routed_rows, hidden]),
// or a zero row where that is -1 (or out of range), as a combine buffer holds for a route nobody
// pushed; the sums are the same bits.
struct EpilogueArgs {
  const void* shared = nullptr;   // bf16 [tokens, hidden] or null
  const void* routed = nullptr;   // bf16 [tokens * topk, hidden]
  const float* weights = nullptr; // fp32 [tokens, topk] or null
  void* out = nullptr;            // bf16 [tokens, hidden]
  int64_t tokens = 0;
  int64_t hidden = 0;             // a multiple of 8; tokens * hidden / 8 < 2^31
  int topk = 1;
  const int32_t* route_rows = nullptr;  // int32 [tokens * topk] or null
  int64_t routed_rows = 0;              // rows of `routed` when route_rows is given
};

// Enqueues the kernel on `stream`; returns the launch status (never synchronises).
cudaError_t launch_epilogue(const EpilogueArgs& args, cudaStream_t stream);

}  // namespace mok::comm
