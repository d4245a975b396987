// fp32 C + bf16 [rows, K] @ W[e] with W [E, K, N] -> bf16: d_x = d_gate @ W_gate + d_up @ W_up.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(kLinearTransposedAccumulate, cutlass::layout::RowMajor,
                        cutlass::layout::RowMajor, float, cutlass::bfloat16_t)
#endif
