// The SwiGLU forward of one element, shared by every kernel that computes it (the plain SwiGLU
// kernel and the fused SwiGLU + MXFP8 quantizer), so both round the same fp32 value.
//
// Reference: mok.experts.swiglu, torch's F.silu(x) = x / (1 + exp(-x)).
#pragma once

namespace mok::experts {

__device__ __forceinline__ float clamp_gate(float g, bool has_limit, float limit) {
  return has_limit ? fminf(g, limit) : g;
}

__device__ __forceinline__ float clamp_up(float u, bool has_limit, float limit) {
  return has_limit ? fminf(fmaxf(u, -limit), limit) : u;
}

// exp(x) as __expf computes it, ex2 of x * log2(e), with results below 2^-126 flushed to zero:
// __expf's ex2 takes three more instructions an element to return those as subnormals
// (ex2.approx.f32 without .ftz), which 1 + exp(-g) below absorbs anyway (1 + 2^-126 rounds to
// 1), so swiglu_value's bits are __expf's.
__device__ __forceinline__ float exp_subnormals_flushed(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.4426950408889634f)));
  return y;
}

// silu(min(gate, L)) * clamp(up, -L, L) in fp32, before the store's rounding to bf16. exp and
// the division are the hardware's approximations (ex2 and rcp: a few fp32 ulps, far below
// bf16's rounding), not the IEEE-exact forms, which took ~20 instructions an element and kept
// the fused SwiGLU + MXFP8 pass issue-bound. For g below ~-87, where 1 + exp(-g)
// passes 2^126, __fdividef gives 0 for silu's tiny negative value.
__device__ __forceinline__ float swiglu_value(float gate, float up, bool has_limit, float limit) {
  const float g = clamp_gate(gate, has_limit, limit);
  const float u = clamp_up(up, has_limit, limit);
  return __fmul_rn(__fdividef(g, 1.0f + exp_subnormals_flushed(-g)), u);
}

}  // namespace mok::experts
