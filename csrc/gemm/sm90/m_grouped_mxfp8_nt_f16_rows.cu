// f16 [rows, K] rebased per row @ W[e]^T with W an MXFP8 weight (E4M3 [E, N, K] + scale
// tiles), rebased per weight row in the conversion -> bf16 (grouped_gemm.h's kLinearMxWeightF16).
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(kLinearMxWeightF16, cutlass::layout::RowMajor,
                        cutlass::layout::ColumnMajor, cutlass::bfloat16_t,
                        cutlass::layout::ColumnMajor)
#endif
