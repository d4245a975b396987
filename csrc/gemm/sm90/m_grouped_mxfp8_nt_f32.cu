// bf16 [rows, K] @ W[e]^T with W an MXFP8 weight (E4M3 [E, N, K] + scale tiles) -> fp32: the
// MXFP8 backward's d_h from W_down's transposed pair, computed transposed as kLinearMxWeight.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(kLinearMxWeightFloat, cutlass::layout::RowMajor,
                        cutlass::layout::ColumnMajor, float, cutlass::layout::ColumnMajor)
#endif
