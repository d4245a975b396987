// bf16 [rows, K] @ W[e] + bf16 [rows, K] @ W2[e] with W, W2 [E, K, N] -> bf16, one accumulation:
// the backward's d_x = d_gate @ W_gate + d_up @ W_up.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_BF16_NN_PAIR, cutlass::layout::RowMajor,
                        cutlass::layout::RowMajor, cutlass::bfloat16_t)
#endif
