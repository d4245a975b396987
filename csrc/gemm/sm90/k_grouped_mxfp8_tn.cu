// Per-expert d_W[e] = d_out[seg]^T @ x[seg] -> bf16 with x given as its transposed MXFP8 pair
// (E4M3 [N, total_rows] + scale tiles, blocks of 32 rows), read as stored: the MXFP8 backward's
// weight gradients, computed transposed (D^T = x_t[:, seg] @ d_out[seg], column-major D).
#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(K_GROUPED_MXFP8_TN, cutlass::layout::RowMajor, cutlass::layout::RowMajor,
                        cutlass::bfloat16_t, cutlass::layout::ColumnMajor)
#endif
