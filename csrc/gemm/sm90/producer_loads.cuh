// What mok's SM90 mainloops (PairedKMainloop, MxWeightMainloop, GateUpMainloop) share in their
// producer warp: the cluster position, the multicast masks, the loop over a work tile's k tiles
// and, for those that read weights through one fixed descriptor, the group index.
#pragma once

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace mok::gemm::detail {

// The CTA's (x, y) = (M, N) position in its cluster.
template <class ClusterShape>
CUTLASS_DEVICE uint2 cluster_position(uint32_t block_rank_in_cluster) {
  constexpr uint32_t cluster_x = cute::size<0>(ClusterShape{});
  return {block_rank_in_cluster % cluster_x, block_rank_in_cluster / cluster_x};
}

// The CTAs of the cluster that share a tile loaded with multicast: along N for A (kAlongMode
// 1), along M for B (0); zero for plain TMA loads.
template <class ClusterShape, class Copy, int kAlongMode>
CUTLASS_DEVICE uint16_t multicast_mask(uint2 position) {
  uint16_t mask = 0;
  if constexpr (cute::is_same_v<Copy, cute::SM90_TMA_LOAD_MULTICAST>) {
    auto layout = cute::Layout<ClusterShape>{};  // (m, n) -> block id
    for (int i = 0; i < cute::size<kAlongMode>(layout); ++i) {
      const int block = kAlongMode == 1 ? layout(position.x, i, cute::Int<0>{})
                                        : layout(i, position.y, cute::Int<0>{});
      mask |= static_cast<uint16_t>(1u << block);
    }
  }
  return mask;
}

// The producer warp's loop over a work tile's k tiles: each stage once it is free, then
// load(barrier, stage, k_tile) issues the copies that complete on that stage's barrier.
template <class Pipeline, class PipelineState, class KTileIterator, class Load>
CUTLASS_DEVICE void for_each_k_tile(Pipeline& pipeline, PipelineState state,
                                    KTileIterator k_tile_iter, int k_tile_count, Load&& load) {
  CUTLASS_PRAGMA_NO_UNROLL
  for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++state) {
    pipeline.producer_acquire(state);
    load(*pipeline.producer_get_barrier(state), state.index(), static_cast<int>(*k_tile_iter));
  }
}

// A TMA copy of experts' weights [experts, n, k] (K contiguous) viewed as (n, k, expert): one
// fixed descriptor serves every group, the expert being a tensor coordinate, so no group needs
// a descriptor update. Tile is the box (rows, k) that one copy loads into SmemLayout.
template <class Element, class CopyOp, class SmemLayout, class Tile>
auto expert_weight_tma(const void* weights, int n, int k, int experts) {
  auto tensor = cute::make_tensor(
      static_cast<Element const*>(weights),
      cute::make_layout(cute::make_shape(n, k, experts),
                        cute::make_stride(int64_t{k}, cute::_1{}, int64_t{n} * k)));
  return cute::make_tma_copy(CopyOp{}, tensor, SmemLayout{}, Tile{}, cute::_1{});
}

// Base with the work tile's group index carried in its load inputs (third element): the
// grouped kernel's block coordinate has no group, but hands each new group to
// tensors_perform_update. Mainloops whose weights are one fixed TMA descriptor with the expert
// as a tensor mode read it there.
template <class Base>
struct CarriesGroup : Base {
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem,
                                typename Base::Params const& params) const {
    auto tiles = Base::load_init(problem, params);
    return cute::make_tuple(cute::get<0>(tiles), cute::get<1>(tiles), int32_t{0});
  }

  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE auto tensors_perform_update(InputTensors const& inputs,
                                             typename Base::Params const&, ProblemShape_MNKL,
                                             int32_t group) {
    return cute::make_tuple(cute::get<0>(inputs), cute::get<1>(inputs), group);
  }
};

}  // namespace mok::gemm::detail
