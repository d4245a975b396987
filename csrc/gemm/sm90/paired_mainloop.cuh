// A CUTLASS SM90 ptr-array mainloop over two operand pairs along K: of a group's 2k-deep
// reduction the first k/kTileK tiles read (A, B) and the rest (A2, B2), so
// D = A @ B + A2 @ B2 is one accumulation in registers. The backward's d_x = d_gate @ W_gate +
// d_up @ W_up needs this: as two GEMMs it wrote an fp32 [rows, H] partial and read it back
// (without it the backward's GEMMs were no faster than torch's on stacked operands;
// docs/grouped-gemm.md), and the weights are the caller's two tensors, so they cannot be one
// [2I, H] operand without a copy.
//
// Base is the mainloop CUTLASS's CollectiveBuilder makes for KernelPtrArrayTmaWarpSpecialized*;
// its MMA side (consumer warpgroups, pipeline, shared-memory tiles) is used as it is. What is
// redefined is every member the grouped kernel calls that touches the TMA descriptors: each CTA
// now keeps four per group (A, B, A2, B2) where Base keeps two. Both pairs of a group have the
// same shapes and strides, so the second pair's descriptors are the first's with other
// addresses.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "gemm/sm90/producer_loads.cuh"

namespace mok::gemm::detail {

template <class Base>
struct PairedKMainloop : Base {
  using typename Base::ElementA;
  using typename Base::ElementB;
  using typename Base::InternalElementA;
  using typename Base::InternalElementB;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using Descriptor = cute::TmaDescriptor;

  // Base's two descriptors for each pair; the kernel only ever passes this storage back to us.
  struct TensorMapStorage : cute::aligned_struct<128, cute::_0> {
    typename Base::TensorMapStorage first;
    typename Base::TensorMapStorage second;
  };

  // Aggregates: {{ptr_A, dA, ptr_B, dB}, ptr_A2, ptr_B2}. The second pair uses the first's strides.
  struct Arguments : Base::Arguments {
    ElementA const** ptr_A2;
    ElementB const** ptr_B2;
  };

  struct Params : Base::Params {
    InternalElementA const** ptr_A2;
    InternalElementB const** ptr_B2;
  };

  // Global descriptor slots per SM: Base's A and B copies, then A2's and B2's.
  static constexpr int kDescriptorsPerSm = 4;

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape problem_shapes, Arguments const& args,
                                        void* workspace) {
    return {Base::to_underlying_arguments(problem_shapes, args, workspace),
            reinterpret_cast<InternalElementA const**>(args.ptr_A2),
            reinterpret_cast<InternalElementB const**>(args.ptr_B2)};
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int sm_count) {
    return kDescriptorsPerSm * sizeof(Descriptor) * static_cast<size_t>(sm_count);
  }

  CUTLASS_DEVICE auto tensormaps_init(Params const& params, TensorMapStorage& shared,
                                      int32_t sm_count, int32_t sm_idx) {
    auto first = Base::tensormaps_init(params, shared.first, sm_count, sm_idx);
    if (cute::elect_one_sync()) shared.second = shared.first;
    __syncwarp();
    Descriptor* second = reinterpret_cast<Descriptor*>(params.tensormaps) + 2 * sm_count;
    return cute::make_tuple(cute::get<0>(first), cute::get<1>(first), &second[sm_idx],
                            &second[sm_idx + sm_count]);
  }

  // The kernel's problem shape holds the whole reduction (2k); each pair's tensors are k deep.
  template <class TensorMaps, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& shared, Params const& params,
                                                TensorMaps const&, ProblemShape_MNKL problem,
                                                int32_t group) {
    if (!cute::elect_one_sync()) return;
    const auto pair_problem = cute::make_shape(cute::get<0>(problem), cute::get<1>(problem),
                                               cute::get<2>(problem) / 2, cute::get<3>(problem));
    Base::tensormaps_replace_global_address(shared.first, params, group);
    cute::tma_descriptor_replace_addr_in_shared_mem(shared.second.smem_tensormap_A,
                                                    params.ptr_A2[group]);
    cute::tma_descriptor_replace_addr_in_shared_mem(shared.second.smem_tensormap_B,
                                                    params.ptr_B2[group]);
    if constexpr (Base::IsGroupedGemmKernel) {
      Base::tensormaps_replace_global_tensor_properties(shared.first, params, group, pair_problem);
      Base::tensormaps_replace_global_tensor_properties(shared.second, params, group,
                                                        pair_problem);
    }
  }

  template <class TensorMaps>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& shared,
                                                  TensorMaps const& maps) {
    if (cute::elect_one_sync()) {
      cute::tma_desc_commit_group();
      cute::tma_desc_wait_group();
    }
    // The whole warp, aligned.
    cute::tma_descriptor_cp_fence_release(cute::get<0>(maps), shared.first.smem_tensormap_A);
    cute::tma_descriptor_cp_fence_release(cute::get<1>(maps), shared.first.smem_tensormap_B);
    cute::tma_descriptor_cp_fence_release(cute::get<2>(maps), shared.second.smem_tensormap_A);
    cute::tma_descriptor_cp_fence_release(cute::get<3>(maps), shared.second.smem_tensormap_B);
  }

  template <class TensorMaps>
  CUTLASS_DEVICE void tensormaps_fence_acquire(TensorMaps const& maps) {
    cute::tma_descriptor_fence_acquire(cute::get<0>(maps));
    cute::tma_descriptor_fence_acquire(cute::get<1>(maps));
    cute::tma_descriptor_fence_acquire(cute::get<2>(maps));
    cute::tma_descriptor_fence_acquire(cute::get<3>(maps));
  }

  // The producer warp: Base's loop, with each K tile's loads on the pair that holds it.
  template <class TensorA, class TensorB, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           TensorMaps const& maps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, TensorStorage& shared_tensors) {
    using namespace cute;
    if (!elect_one_sync()) return;
    using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
    const uint2 position = cluster_position<ClusterShape>(block_rank_in_cluster);
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Base::SmemLayoutB{});
    auto tma_a = params.tma_load_a.get_slice(position.y);
    auto tma_b = params.tma_load_b.get_slice(position.x);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));
    Tensor tBsB = tma_b.partition_D(sB);
    const auto mask_a = multicast_mask<ClusterShape, typename Base::GmemTiledCopyA, 1>(position);
    const auto mask_b = multicast_mask<ClusterShape, typename Base::GmemTiledCopyB, 0>(position);
    // The coordinate tensors span the whole reduction; the second pair's tiles start at 0 again.
    const int pair_tiles = static_cast<int>(size<3>(tAgA)) / 2;
    for_each_k_tile(pipeline, smem_pipe_write, k_tile_iter, k_tile_count,
                    [&](auto& barrier, int stage, int k_tile) {
                      const bool second = k_tile >= pair_tiles;
                      const int pair_tile = second ? k_tile - pair_tiles : k_tile;
                      auto* map_a = second ? get<2>(maps) : get<0>(maps);
                      auto* map_b = second ? get<3>(maps) : get<1>(maps);
                      copy(params.tma_load_a.with(map_a, barrier, mask_a),
                           tAgA(_, _, _, pair_tile), tAsA(_, _, _, stage));
                      copy(params.tma_load_b.with(map_b, barrier, mask_b),
                           tBgB(_, _, _, pair_tile), tBsB(_, _, _, stage));
                    });
  }
};

}  // namespace mok::gemm::detail
