// Per-expert d_W[e] = d_out[seg]^T @ a[seg] -> bf16 (fp32 accumulation over the segment's rows in
// order): the three weight gradients.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(K_GROUPED_BF16_TN, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor,
                        cutlass::bfloat16_t)
#endif
