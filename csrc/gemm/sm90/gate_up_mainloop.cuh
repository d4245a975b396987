// A CUTLASS SM90 ptr-array mainloop computing a token tile's gate and up columns together, so
// the epilogue holds both and can apply SwiGLU (swiglu_epilogue.cuh): the forward then writes
// hidden from registers instead of reading gate and up back in a separate pass.
//
// A work tile is 128 rows x 256 columns of the problem [rows, 2N]: tile column block j holds
// gate's columns [128 j, 128 j + 128) in its first half and up's same columns in its second.
// The weights are the caller's two tensors (no [2N, K] copy), each read through one fixed TMA
// descriptor over (N, K, experts) with the expert as a tensor mode, as MxWeightMainloop reads
// its weights. In the 2x1 cluster the CTA at x = 0 loads the gate half of each B stage and the
// one at x = 1 the up half, each multicast to both: the same split and bytes as Base's own
// multicast B load. A (the token rows) and the whole consumer side are Base's.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "gemm/sm90/producer_loads.cuh"

namespace mok::gemm::detail {

constexpr int kGateUpWeights = 2;  // gate, up

template <class Base>
struct GateUpMainloop : CarriesGroup<Base> {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using Element = cutlass::bfloat16_t;
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kHalfN = kTileN / 2;
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kStages = Base::DispatchPolicy::Stages;
  static_assert(cute::size<0>(ClusterShape{}) == 2 && cute::size<1>(ClusterShape{}) == 1,
                "each CTA of a 2x1 cluster loads one weight's half of the B tile");
  static_assert(std::is_same_v<typename Base::GmemTiledCopyB, cute::SM90_TMA_LOAD_MULTICAST>);

  // One half of a B stage; Base's stages are these halves back to back (checked below).
  using SmemLayoutHalf = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::make_shape(cute::Int<kHalfN>{}, cute::Int<kTileK>{})));
  static_assert(std::is_same_v<typename Base::SmemLayoutB,
                               decltype(cute::tile_to_shape(
                                   cute::GMMA::Layout_K_SW128_Atom<Element>{},
                                   cute::make_shape(cute::Int<kTileN>{}, cute::Int<kTileK>{},
                                                    cute::Int<kStages>{})))>,
                "B stages must be 128-byte swizzled K-major tiles, halves contiguous");
  static constexpr int kHalfElements = kHalfN * kTileK;

  using HalfTile = cute::Shape<cute::Int<kHalfN>, cute::Int<kTileK>>;
  using TmaW = decltype(expert_weight_tma<Element, cute::SM90_TMA_LOAD_MULTICAST, SmemLayoutHalf,
                                          HalfTile>(nullptr, 0, 0, 0));

  // {base (ptr_A: the rows per group, ptr_B: any addresses), weights, n, k, experts}.
  struct Arguments : Base::Arguments {
    const void* weights[kGateUpWeights];  // bf16 [experts, n, k] each
    int n;
    int k;
    int experts;
  };

  struct Params : Base::Params {
    TmaW tma_w[kGateUpWeights];
    int n;
    int k;
    int experts;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape problem_shapes, Arguments const& args,
                                        void* workspace) {
    Params params{Base::to_underlying_arguments(problem_shapes, args, workspace), {},
                  args.n, args.k, args.experts};
    for (int w = 0; w < kGateUpWeights; ++w) {
      params.tma_w[w] =
          expert_weight_tma<Element, cute::SM90_TMA_LOAD_MULTICAST, SmemLayoutHalf, HalfTile>(
              args.weights[w], args.n, args.k, args.experts);
    }
    return params;
  }

  // The producer warp: per k tile Base's A tile and this CTA's weight half of B.
  template <class LoadInputs, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write, LoadInputs const& load_inputs,
                           TensorMaps const& maps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, TensorStorage& shared_tensors) {
    using namespace cute;
    if (!elect_one_sync()) return;
    const int expert = get<2>(load_inputs);  // one group per expert
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    const uint2 position = cluster_position<ClusterShape>(block_rank_in_cluster);

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()),
                            typename Base::SmemLayoutA{});
    auto tma_a = params.tma_load_a.get_slice(position.y);
    Tensor tAgA = tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));
    Tensor tAsA = tma_a.partition_D(sA);
    const auto mask_a = multicast_mask<ClusterShape, typename Base::GmemTiledCopyA, 1>(position);

    auto const& tma_w = params.tma_w[position.x];
    Tensor mW = tma_w.get_tma_tensor(make_shape(params.n, params.k, params.experts));
    Tensor gW = local_tile(mW(_, _, expert), make_shape(Int<kHalfN>{}, Int<kTileK>{}),
                           make_coord(n_coord, _));  // (HALF_N, BLK_K, k)
    auto tma_w_slice = tma_w.get_slice(0);
    Tensor tWgW = tma_w_slice.partition_S(gW);
    Element* halves = shared_tensors.smem_B.data() + position.x * kHalfElements;
    // The CTAs of the cluster along M share each B tile.
    const auto mask_b = multicast_mask<ClusterShape, typename Base::GmemTiledCopyB, 0>(position);
    for_each_k_tile(pipeline, smem_pipe_write, k_tile_iter, k_tile_count,
                    [&](auto& barrier, int stage, int k_tile) {
                      copy(params.tma_load_a.with(get<0>(maps), barrier, mask_a),
                           tAgA(_, _, _, k_tile), tAsA(_, _, _, stage));
                      Tensor sW = make_tensor(make_smem_ptr(halves + stage * 2 * kHalfElements),
                                              SmemLayoutHalf{});
                      copy(tma_w.with(barrier, mask_b), tWgW(_, _, _, k_tile),
                           tma_w_slice.partition_D(sW));
                    });
  }
};

}  // namespace mok::gemm::detail
