// bf16 [rows, K] @ W[e]^T with W an MXFP8 weight (E4M3 [E, N, K] + scale tiles) -> fp32: the
// MXFP8 backward's d_h from W_down's transposed pair, computed transposed as M_GROUPED_MXFP8_NT.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_MXFP8_NT_F32, cutlass::layout::RowMajor,
                        cutlass::layout::ColumnMajor, float, cutlass::layout::ColumnMajor)
#endif
