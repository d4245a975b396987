// bf16 [rows, K] @ W[e]^T + bf16 [rows, K] @ W2[e]^T with W, W2 MXFP8 weights (E4M3 [E, N, K] +
// scale tiles) -> bf16, one accumulation: the MXFP8 backward's d_x = q(d_gate) @ W_gate +
// q(d_up) @ W_up from the weights' transposed pairs, computed transposed as M_GROUPED_MXFP8_NT.
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(M_GROUPED_MXFP8_NT_PAIR, cutlass::layout::RowMajor,
                        cutlass::layout::ColumnMajor, cutlass::bfloat16_t,
                        cutlass::layout::ColumnMajor)
#endif
