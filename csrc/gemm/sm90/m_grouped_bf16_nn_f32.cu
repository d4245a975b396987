// bf16 [rows, K] @ W[e] with W [E, K, N] -> fp32: the backward d_h = d_out @ W_down and the first
// term of d_x.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_BF16_NN_F32, cutlass::layout::RowMajor, cutlass::layout::RowMajor,
                        float)
#endif
