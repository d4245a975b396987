// kLinear with ping-pong consumers (128 x 128 tiles, one per warpgroup).
#if defined(MOK_ARCH_sm_90a)
#include "gemm/grouped_kernel.cuh"
MOK_DEFINE_GROUPED_KIND(kLinearPingpong, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                        cutlass::bfloat16_t)
#endif
