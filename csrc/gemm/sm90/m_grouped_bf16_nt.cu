// bf16 [rows, K] @ W[e]^T with W [E, N, K] -> bf16: the forward gate, up and down GEMMs.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_BF16_NT, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                        cutlass::bfloat16_t)
#endif
