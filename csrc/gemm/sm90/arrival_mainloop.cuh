// A CUTLASS SM90 ptr-array mainloop whose producer warp, before it loads a work tile, waits until
// the tile's rows of A have arrived: the dispatch pull that writes them runs beside the GEMM
// (common/arrivals.cuh, docs/overlap.md). Without arrival counters it is Base. A tile's rows are
// [row0[group] + m * kTileM, + kTileM) of the routed buffer; the group comes with the load inputs
// (CarriesGroup). Before the producer warp exits it waits for every minibatch, so the GEMM ends
// only after the whole pull has arrived: later kernels in the stream, which wait for the GEMM
// (not for the pull, its programmatic primary), then see every pulled row, the padding rows
// no tile reads included.
#pragma once

#include <cstdint>

#include "common/arrivals.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "gemm/sm90/producer_loads.cuh"

namespace mok::gemm::detail {

template <class Base>
struct WaitsForArrivals : CarriesGroup<Base> {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  static constexpr int kTileM = cute::size<0>(TileShape{});

  struct Arguments : Base::Arguments {
    comm::Arrivals arrivals;
    const int64_t* row0;  // each group's first row in A (GroupTables::row0)
  };

  struct Params : Base::Params {
    comm::Arrivals arrivals;
    const int64_t* row0;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape problem_shapes, Arguments const& args,
                                        void* workspace) {
    return {Base::to_underlying_arguments(problem_shapes, args, workspace), args.arrivals,
            args.row0};
  }

  // The producer warp's first call: keeps the counters for load_tail, which has no params.
  template <class TensorMapStorage>
  CUTLASS_DEVICE auto tensormaps_init(Params const& params, TensorMapStorage& shared_tensormaps,
                                      int32_t sm_count, int32_t sm_idx) {
    arrivals_ = params.arrivals;
    return Base::tensormaps_init(params, shared_tensormaps, sm_count, sm_idx);
  }

  CUTLASS_DEVICE void load_tail(MainloopPipeline pipeline, PipelineState smem_pipe_write) {
    if (arrivals_.counts != nullptr) {
      if (cute::elect_one_sync()) {
        comm::wait_rows(arrivals_, 0, arrivals_.minibatches * arrivals_.minibatch_rows);
      }
      __syncwarp();
    }
    Base::load_tail(pipeline, smem_pipe_write);
  }

  template <class LoadInputs, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write, LoadInputs const& load_inputs,
                           TensorMaps const& maps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, TensorStorage& shared_tensors) {
    if (params.arrivals.counts != nullptr) {
      if (cute::elect_one_sync()) {
        const int64_t first = params.row0[cute::get<2>(load_inputs)] +
                              static_cast<int64_t>(cute::get<0>(blk_coord)) * kTileM;
        comm::wait_rows(params.arrivals, first, first + kTileM);
      }
      __syncwarp();
    }
    Base::load(params, pipeline, smem_pipe_write,
               cute::make_tuple(cute::get<0>(load_inputs), cute::get<1>(load_inputs)), maps,
               blk_coord, k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster,
               shared_tensors);
  }

 private:
  comm::Arrivals arrivals_;
};

}  // namespace mok::gemm::detail
