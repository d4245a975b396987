// bf16 [rows, K] @ W[e]^T with W an MXFP8 weight (E4M3 [E, N, K] + scale tiles) -> bf16: the
// MXFP8 forward's gate, up and down GEMMs, computed transposed (D^T = W @ X^T, column-major D).
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_MXFP8_NT, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                        cutlass::bfloat16_t, cutlass::layout::ColumnMajor)
#endif
