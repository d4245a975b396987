// f16 [rows, K] rebased per row @ W[e]^T with W an MXFP8 weight (E4M3 [E, N, K] + scale
// tiles), rebased per weight row in the conversion -> bf16 (grouped_gemm.h says how).
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_MXFP8_NT_F16_ROWS, cutlass::layout::RowMajor,
                        cutlass::layout::ColumnMajor, cutlass::bfloat16_t,
                        cutlass::layout::ColumnMajor)
#endif
