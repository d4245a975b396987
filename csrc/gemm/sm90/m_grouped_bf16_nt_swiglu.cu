// The forward's gate and up GEMMs with SwiGLU in the epilogue -> bf16 gate, up and hidden.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_BF16_NT_SWIGLU, cutlass::layout::RowMajor,
                        cutlass::layout::ColumnMajor, cutlass::bfloat16_t)
#endif
