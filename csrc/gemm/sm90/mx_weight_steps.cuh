// The MXFP8 weight mainloop's consumer steps (mx_weight_mainloop.cuh's mma): per k tile, wgmma
// batches on the converted register fragment, the wait that keeps two k tiles queued, and the
// next k tile's conversion into the fragment that wait freed.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace mok::gemm::detail {

// wgmma batches (k tiles) left queued while the consumer converts the next tile: two (with a
// fifth stage) kept the tensor pipe busier than one.
constexpr int kQueuedBatches = 2;

template <class MainloopPipeline, class PipelineState>
struct MxWeightSteps {
  // Tile t's wgmmas on `current` (converted), one batch.
  template <class TiledMmaT, class TensorB, class Fragment, class FrgTensorC>
  CUTLASS_DEVICE static void issue(TiledMmaT& tiled_mma, TensorB const& tCrB, Fragment& current,
                                   FrgTensorC& accum, int stage) {
    using namespace cute;
    warpgroup_fence_operand(current);
    warpgroup_fence_operand(accum);
    warpgroup_arrive();
    CUTLASS_PRAGMA_UNROLL
    for (int kb = 0; kb < size<2>(current); ++kb) {
      cute::gemm(tiled_mma, current(_, _, kb), tCrB(_, _, kb, stage), accum);
      tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
  }

  // A work tile's first k tile, one batch per 16-wide k block, each issued as soon as its block
  // is converted, in place of a whole conversion before the loop. Meant to start the tensor
  // cores sooner; measured, the kernels gained in their steady loop instead (the short-K down
  // GEMM's cycles did not move). ptxas serializes every wgmma (C7513) unless a block's registers
  // are written after a wait, so each block follows a wait that lets all the earlier blocks'
  // batches stay queued; it also does if any batch is in flight when the loop is entered, which
  // is why this runs inside the loop's first step.
  template <class TiledMmaT, class TensorB, class Fragment, class FrgTensorC, class Convert>
  CUTLASS_DEVICE static void issue_converting(TiledMmaT& tiled_mma, TensorB const& tCrB,
                                              Fragment& first, FrgTensorC& accum,
                                              Convert const& convert, int stage) {
    using namespace cute;
    for_each(make_int_sequence<size<2>(Fragment{})>{}, [&](auto kb) {
      constexpr int kBlock = decltype(kb)::value;
      warpgroup_wait<kBlock>();  // waits for nothing: the previous tile ended with wait<0>
      convert.template blocks<kBlock, kBlock + 1>(stage, 0, first);
      auto block = first(_, _, kb);
      warpgroup_fence_operand(block);
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      cute::gemm(tiled_mma, block, tCrB(_, _, kb, stage), accum);
      tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      warpgroup_commit_batch();
    });
  }

  // After the wait for tile t - 2's batch (then its stage and `next`, its registers, are free),
  // releases that stage and converts tile t + 1 into `next`. Two k tiles stay queued, so the
  // tensor cores do not wait for the conversions.
  template <class Fragment, class FrgTensorC, class Convert>
  CUTLASS_DEVICE static void advance(MainloopPipeline& pipeline, PipelineState& state,
                                     PipelineState& release, int t, int k_tile_count,
                                     Fragment& next, FrgTensorC& accum, Convert const& convert) {
    using namespace cute;
    warpgroup_fence_operand(accum);
    warpgroup_fence_operand(next);
    if (t >= kQueuedBatches) {
      pipeline.consumer_release(release);
      ++release;
    }
    ++state;
    if (t + 1 < k_tile_count) {
      pipeline.consumer_wait(state);
      convert(state.index(), t + 1, next);
    }
  }

  // Tile t's step: its wgmmas, the wait for tile t - 2's and tile t + 1's conversion. kMayStart:
  // t may be the work tile's first k tile, which issue_converting converts and issues; one test
  // picks both its issue and its wait (its four batches may stay queued). At t = 1 the usual
  // wait then lets tile 0's last block and tile 1 run while tile 2 is converted.
  template <bool kMayStart = false, class TiledMmaT, class TensorB, class Fragment,
            class FrgTensorC, class Convert>
  CUTLASS_DEVICE static void step(MainloopPipeline& pipeline, PipelineState& state,
                                  PipelineState& release, int t, int k_tile_count,
                                  TiledMmaT& tiled_mma, TensorB const& tCrB, Fragment& current,
                                  Fragment& next, FrgTensorC& accum, Convert const& convert) {
    if (kMayStart && t == 0) {
      issue_converting(tiled_mma, tCrB, current, accum, convert, state.index());
      cute::warpgroup_wait<cute::size<2>(Fragment{})>();
    } else {
      issue(tiled_mma, tCrB, current, accum, state.index());
      cute::warpgroup_wait<kQueuedBatches>();
    }
    advance(pipeline, state, release, t, k_tile_count, next, accum, convert);
  }
};

}  // namespace mok::gemm::detail
