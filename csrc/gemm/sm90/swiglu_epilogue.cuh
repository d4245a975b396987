// The epilogue of the gate/up GEMM (GateUpMainloop): each consumer thread holds a tile's gate
// value and the up value of the same row and column (accumulator columns c and c + 128 of the
// 128 x 256 tile), so it rounds both to bf16, computes hidden = swiglu(gate, up) from those
// rounded values with the SwiGLU kernel's own function, and stores all three straight from
// registers: the bits the GEMM + `swiglu` pair writes, without reading gate and up back.
//
// An operator-style epilogue for CUTLASS's Sm90TmaWarpSpecializedAdapter (no shared memory,
// no TMA stores): each thread stores its column pairs as 4-byte words; a warp's stores of two
// consecutive 8-column chunks fill whole 32-byte sectors. In the cooperative kernel both
// consumer warpgroups run it while the tensor cores wait, which made the launch slower than the
// GEMM + SwiGLU pair, so the forward takes it on request (docs/grouped-gemm.md, the SwiGLU
// epilogue variant).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "experts/swiglu_math.cuh"

namespace mok::gemm::detail {

template <class StrideD_>
class SwigluEpilogue {
 public:
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementD = cutlass::bfloat16_t;
  using ElementOutput = ElementD;
  using ElementC = void;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using StrideC = StrideD_;
  using StrideD = StrideD_;
  using InternalStrideC = cute::remove_pointer_t<StrideC>;
  using InternalStrideD = cute::remove_pointer_t<StrideD>;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  // Named by CUTLASS's device adapter only (as its EpilogueOutputOp); never applied.
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<ElementD, 1, float, float>;

  struct SharedStorage {};
  using TensorMapStorage = SharedStorage;

  struct Arguments {
    ElementD** ptr_D = nullptr;  // per group: gate's first row of the segment
    ElementD* gate = nullptr;    // bases: a group's up and hidden rows sit at its gate offset
    ElementD* up = nullptr;
    ElementD* hidden = nullptr;
    int64_t n = 0;  // columns of each output
    bool has_limit = false;
    float limit = 0.0f;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int) {
    return 0;
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.n % 128 == 0;
  }

  CUTLASS_HOST_DEVICE explicit SwigluEpilogue(Params const& params) : params_(params) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape,
                                 BlockCoordMNKL blk_coord,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    constexpr int kTileM = size<0>(BlockShapeMNK{});
    constexpr int kHalfN = size<1>(BlockShapeMNK{}) / 2;
    // GMMA's accumulator: ((column pair, row pair, 8-column chunk), M atoms, N atoms); the
    // chunks of the tile's second half (up) follow those of its first (gate).
    using Shape = decltype(shape(FrgLayout{}));
    constexpr int kChunks = size<0, 2>(Shape{});
    static_assert(size<0, 0>(Shape{}) == 2 && size<0, 1>(Shape{}) == 2 &&
                      size<2>(Shape{}) == 1 && kChunks % 2 == 0,
                  "GMMA accumulators of one N atom");
    const int rows = get<0>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor coords = thread_mma.partition_C(make_identity_tensor(take<0, 2>(blk_shape)));
    const int64_t segment = params_.ptr_D[l_coord] - params_.gate;
    const int row0 = static_cast<int>(m_coord) * kTileM;
    const int64_t col0 = static_cast<int64_t>(n_coord) * kHalfN;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < size<1>(Shape{}); ++m) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kChunks / 2; ++c) {
          auto index = [&](int pair, int chunk) {
            return make_coord(make_coord(pair, r, chunk), m, 0);
          };
          const auto where = coords(index(0, c));
          const int row = row0 + get<0>(where);
          if (row >= rows) continue;
          const int64_t at = segment + row * params_.n + col0 + get<1>(where);
          const auto gate =
              __floats2bfloat162_rn(accumulators(index(0, c)), accumulators(index(1, c)));
          const int up_chunk = c + kChunks / 2;
          const auto up = __floats2bfloat162_rn(accumulators(index(0, up_chunk)),
                                                accumulators(index(1, up_chunk)));
          store(params_.gate, at, gate);
          store(params_.up, at, up);
          store(params_.hidden, at, swiglu_pair(gate, up));
        }
      }
    }
  }

 private:
  CUTLASS_DEVICE __nv_bfloat162 swiglu_pair(__nv_bfloat162 gate, __nv_bfloat162 up) const {
    const float2 g = __bfloat1622float2(gate);
    const float2 u = __bfloat1622float2(up);
    return __floats2bfloat162_rn(experts::swiglu_value(g.x, u.x, params_.has_limit, params_.limit),
                                 experts::swiglu_value(g.y, u.y, params_.has_limit, params_.limit));
  }

  CUTLASS_DEVICE static void store(ElementD* base, int64_t at, __nv_bfloat162 value) {
    *reinterpret_cast<__nv_bfloat162*>(base + at) = value;
  }

  Params params_;
};

template <class StrideD>
using SwigluCollectiveEpilogue =
    cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<SwigluEpilogue<StrideD>>;

}  // namespace mok::gemm::detail
