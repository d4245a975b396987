// Dispatch from a runtime Kind to the GEMM compiled for it (sm_90a modules only).
#include "gemm/grouped_gemm.h"

#if defined(MOK_ARCH_sm_90a)
#include "gemm/sm90/grouped_kernel.cuh"
#endif

namespace mok::gemm {

#if defined(MOK_ARCH_sm_90a)

bool available() { return true; }

// Named, not anonymous: nvcc names anonymous namespaces after the build path, which would
// make the binary depend on where it was built.
namespace dispatch {

struct KindEntry {
  cudaError_t (*launch)(const GroupedArgs&, cudaStream_t);
  size_t (*scratch)(int, int);
};

template <Kind kKind>
constexpr KindEntry entry() {
  return {&detail::launch_kind<kKind>, &detail::scratch_kind<kKind>};
}

// Indexed by Kind; the binding has checked the value.
constexpr KindEntry kEntries[kKinds] = {
    entry<Kind::M_GROUPED_BF16_NT>(),
    entry<Kind::M_GROUPED_BF16_NN_F32>(),
    entry<Kind::M_GROUPED_BF16_NN_PAIR>(),
    entry<Kind::K_GROUPED_BF16_TN>(),
    entry<Kind::M_GROUPED_MXFP8_NT>(),
    entry<Kind::M_GROUPED_BF16_NT_SWIGLU>(),
    entry<Kind::M_GROUPED_MXFP8_NT_F16_ROWS>(),
    entry<Kind::M_GROUPED_MXFP8_NT_F32>(),
    entry<Kind::M_GROUPED_MXFP8_NT_PAIR>(),
    entry<Kind::K_GROUPED_MXFP8_TN>(),
};

}  // namespace dispatch

size_t scratch_bytes(Kind kind, int groups, int sm_count) {
  return dispatch::kEntries[static_cast<int>(kind)].scratch(groups, sm_count);
}

cudaError_t launch_grouped(const GroupedArgs& args, cudaStream_t stream) {
  return dispatch::kEntries[static_cast<int>(args.kind)].launch(args, stream);
}

#else  // Blackwell modules: the TMA + wgmma kernels are Hopper-only; torch serves instead.

bool available() { return false; }

size_t scratch_bytes(Kind, int, int) { return 0; }

cudaError_t launch_grouped(const GroupedArgs&, cudaStream_t) { return cudaErrorNotSupported; }

#endif

}  // namespace mok::gemm
