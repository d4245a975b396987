// A CUTLASS SM90 ptr-array mainloop whose A operand is an MXFP8 weight read as it is stored
// (E4M3 bytes, one E8M0 scale per 32 along K in mok's swizzled 128 x 128 scale tiles), so the
// MXFP8 forward needs no bf16 copy of its weights: dequantizing them is a whole pass over every
// weight at the memory floor (docs/grouped-gemm.md, MXFP8 conversion in the mainloop).
//
// The GEMM is computed transposed, D^T = W[e] @ X^T, so the weight is wgmma's A operand, which
// Hopper can take from registers: each consumer thread loads its fragment's E4M3 pairs from
// shared memory and converts them exactly to bf16 (E4M3 -> f16 -> fp32 -> bf16, times the
// block's scale as bf16, rounded once: mok.mxfp8.dequantize's values) while the previous k
// tiles' wgmmas run. X (bf16) stays the shared-memory B operand, loaded and multicast as Base
// does. The conversion costs M_GROUPED_MXFP8_NT a few percent more cycles than
// M_GROUPED_BF16_NT on the dequantized weights, less than the dequantized copy it saves
// (above).
//
// Base is the bf16 mainloop CUTLASS's CollectiveBuilder makes for this transposed problem;
// its pipeline, B tiles and per-group B descriptor are used as they are. Redefined: the shared
// tiles (E4M3 A stages and their scale tiles instead of bf16 A), the producer's loads (A
// through one fixed TMA descriptor per weight with the expert as a tensor mode, so groups need
// no A descriptor update; scales by bulk copy), and the consumer's loop.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "gemm/sm90/mx_weight_convert.cuh"
#include "gemm/sm90/mx_weight_steps.cuh"
#include "gemm/sm90/producer_loads.cuh"
#include "gemm/sm90/tables.cuh"
#include "mxfp8/math.cuh"

namespace mok::gemm::detail {

constexpr int kMxWeightSets = 2;         // gate and up share a launch
constexpr int kScaleTileBytes = 512;     // 128 rows x 4 K blocks, quantize_tile.cuh's layout
constexpr int kScaleTileK = 128;         // K values one scale tile covers
// Pipeline stages: an E4M3 weight tile, its scale tile and a bf16 X tile take 40.5 KB, so five
// fit where the builder's count for bf16 operands gives four. The consumers hold
// kQueuedBatches + 1 of them, so the producer keeps two loads in flight.
constexpr int kMxWeightStages = 5;

// kF16 (M_GROUPED_MXFP8_NT_F16_ROWS, grouped_gemm.h): f16 operands rebased per row, so the
// conversion is E4M3 -> f16 and one f16x2 multiply by the block's f16 factor 2^(E - R_b), read
// from factor tiles made once per weight (the scale tiles' layout, 2 bytes an entry), and the
// sums are rescaled before the epilogue by the two rows' exponents, copied with the last k tile.
// kPairedK (M_GROUPED_MXFP8_NT_PAIR, Base a PairedKMainloop): a group's reduction is two
// (weight, rows) pairs of one shape back to back, the first half of its k tiles from set 0's
// weight and Base's first X descriptor, the second half from set 1's and the second descriptor.
// Each pair's k tiles are a whole number of scale tiles (K % 128 == 0), so the consumers' scale
// lookup, which takes the k tile's parity, holds across the seam.
// kRowsK (K_GROUPED_MXFP8_TN): the MXFP8 operand is an activation's transposed pair, one E4M3
// tensor [n, total_rows] whose K is the routed rows: a group's k tiles start at its segment's
// first row (a multiple of 128, fill_tables' check: whole scale tiles with the k tiles' parity),
// and the other operand (the gradient rows, N contiguous) is wgmma's MN-major B.
template <class Base, bool kF16 = false, bool kPairedK = false, bool kRowsK = false>
struct MxWeightMainloop : CarriesGroup<Base> {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::TileShape;
  using Element = std::conditional_t<kF16, cutlass::half_t, cutlass::bfloat16_t>;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  // Bytes of one scale tile in shared memory: E8M0 bytes, or (kF16) f16 factors.
  static constexpr int kScaleBytes = kF16 ? 2 * kScaleTileBytes : kScaleTileBytes;
  // Per stage (kF16): the tile's kTileM weight-row exponents; the group's 16-byte record (its
  // first A row mod 16); the 16-byte aligned window of A-row exponents that holds the tile's
  // kTileN (a group may start at any row, and bulk copies move aligned 16-byte units).
  static constexpr int kRecordAt = kTileM;
  static constexpr int kWindowAt = kTileM + 16;
  static constexpr int kWindowBytes = kTileN + 16;
  static constexpr int kExponentBytes = kF16 ? kWindowAt + kWindowBytes : 0;
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static constexpr int kStages = Base::DispatchPolicy::Stages;
  static_assert(kTileM == 128 && kTileK == 64, "scale tiles are 128 rows; two k tiles each");
  static_assert(kStages >= kQueuedBatches + 3, "two loads in flight beside the consumers'");

  // wgmma with A from registers: one 64-row slice of the tile per consumer warpgroup.
  static constexpr cute::GMMA::Major kMajorB =
      kRowsK ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TileShape, cute::GMMA::Major::K,
                                 kMajorB>(),
      cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  static_assert(std::is_same_v<typename TiledMma::Atom::Traits::ALayout,
                               cute::SM90::GMMA::ALayout_64x16>,
                "the conversion assumes each thread's rows r, r + 8 and k pairs of GMMA's A");

  // E4M3 tiles as TMA writes them: K-major, 64-byte rows, 64-byte swizzle.
  using SmemLayoutW = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW64_Atom<uint8_t>{},
      cute::make_shape(cute::Int<kTileM>{}, cute::Int<kTileK>{}, cute::Int<kStages>{})));
  using SmemLayoutWStage = decltype(SmemLayoutW{}(cute::_, cute::_, cute::Int<0>{}));
  using WeightTile = cute::Shape<cute::Int<kTileM>, cute::Int<kTileK>>;
  using TmaW = decltype(expert_weight_tma<uint8_t, cute::SM90_TMA_LOAD, SmemLayoutWStage,
                                          WeightTile>(nullptr, 0, 0, 0));

  struct TensorStorage : cute::aligned_struct<128, cute::_0> {
    cute::array_aligned<uint8_t, cute::cosize_v<SmemLayoutW>> smem_W;
    cute::array_aligned<Element, cute::cosize_v<typename Base::SmemLayoutB>> smem_B;
    cute::array_aligned<uint8_t, kScaleBytes * kStages> smem_scale;
    cute::array_aligned<uint8_t, kF16 ? kExponentBytes * kStages : 16> smem_exponent;
  };

  using Converter = MxWeightConverter<TensorStorage, kTileM * kTileK, kScaleBytes, kF16>;
  using Steps = MxWeightSteps<MainloopPipeline, PipelineState>;

  // {base (ptr_A: any addresses, ptr_B: X per group), weights, scales, n, k, experts}.
  struct Arguments : Base::Arguments {
    const void* weights[kMxWeightSets];  // E4M3 [experts, n, k] (kRowsK: [n, k = total rows])
    const void* scales[kMxWeightSets];   // mxfp8_quantize's scale tiles (kF16: factor tiles)
    int n;
    int k;
    int experts;
    const void* b_exponents[kMxWeightSets];  // kF16: uint8 per weight row [experts * n]
    const void* a_exponents[kMxWeightSets];  // kF16: uint8 per row of A, + kWindowBytes
    const int64_t* row0;                     // kF16, kRowsK: each group's first row (GroupTables)
    const int32_t* a_shift;                  // kF16: 4 words per group, row0 % 16 first
  };

  struct Params : Base::Params {
    TmaW tma_w[kMxWeightSets];
    const uint8_t* scales[kMxWeightSets];
    int experts;
    int sets;         // weights per launch (groups: experts x sets, tables.cuh's group_index)
    int row_tiles;    // n / 128: scale tile rows per expert
    int scale_tiles;  // k / 128: scale tiles per tile row
    const uint8_t* b_exponents[kMxWeightSets];
    const uint8_t* a_exponents[kMxWeightSets];
    const int64_t* row0;
    const int32_t* a_shift;
  };

  static constexpr uint32_t kTransactionBytes =
      kTileM * kTileK + kScaleBytes +
      cute::size<0>(typename Base::SmemLayoutB{}) * cute::size<1>(typename Base::SmemLayoutB{}) *
          sizeof(Element);

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape problem_shapes, Arguments const& args,
                                        void* workspace) {
    Params params{Base::to_underlying_arguments(problem_shapes, args, workspace), {}, {}, 0, 0,
                  0, 0, {}, {}, args.row0, args.a_shift};
    params.tma_transaction_bytes = kTransactionBytes;
    for (int set = 0; set < kMxWeightSets; ++set) {
      const int from = args.weights[set] != nullptr ? set : 0;  // an unused set repeats the first
      params.tma_w[set] = expert_weight_tma<uint8_t, cute::SM90_TMA_LOAD, SmemLayoutWStage,
                                            WeightTile>(args.weights[from], args.n, args.k,
                                                        kRowsK ? 1 : args.experts);
      params.scales[set] = static_cast<const uint8_t*>(args.scales[from]);
      if constexpr (kF16) {
        params.b_exponents[set] = static_cast<const uint8_t*>(args.b_exponents[from]);
        params.a_exponents[set] = static_cast<const uint8_t*>(args.a_exponents[from]);
      }
    }
    params.experts = args.experts;
    // A group per expert and weight, or per expert when its two weights are one reduction's.
    params.sets = args.weights[1] != nullptr && !kPairedK ? kMxWeightSets : 1;
    params.row_tiles = args.n / kTileM;
    params.scale_tiles = args.k / kScaleTileK;
    return params;
  }

  // The producer warp: per k tile the weight tile, its scale tile and Base's X tile (kPairedK:
  // of the pair that holds the k tile, counted from that pair's start).
  template <class LoadInputs, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline,
                           PipelineState smem_pipe_write, LoadInputs const& load_inputs,
                           TensorMaps const& maps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, TensorStorage& shared_tensors) {
    using namespace cute;
    if (!elect_one_sync()) return;
    const int group = get<2>(load_inputs);
    const GroupIndex index = group_index(group, params.experts * params.sets, params.experts);
    const int expert = index.expert;
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    // Both weights of a launch have one shape, so set 0's descriptor gives every coordinate.
    auto const& tma_w = params.tma_w[0];
    // kRowsK: one tensor, no expert mode.
    const int weight_expert = kRowsK ? 0 : expert;
    Tensor mW = tma_w.get_tma_tensor(make_shape(params.row_tiles * kTileM,
                                                params.scale_tiles * kScaleTileK,
                                                kRowsK ? 1 : params.experts));
    Tensor gW = local_tile(mW(_, _, weight_expert), make_shape(Int<kTileM>{}, Int<kTileK>{}),
                           make_coord(m_coord, _));  // (BLK_M, BLK_K, k)
    Tensor sW = make_tensor(make_smem_ptr(shared_tensors.smem_W.data()), SmemLayoutW{});
    auto tma_w_slice = tma_w.get_slice(0);
    Tensor tWgW = tma_w_slice.partition_S(gW);
    Tensor tWsW = tma_w_slice.partition_D(sW);

    using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
    const uint2 position = cluster_position<ClusterShape>(block_rank_in_cluster);
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
                            typename Base::SmemLayoutB{});
    auto tma_b = params.tma_load_b.get_slice(position.x);
    Tensor tBgB = tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));
    Tensor tBsB = tma_b.partition_D(sB);
    // The CTAs of the cluster along M share each X tile.
    const auto mask_b = multicast_mask<ClusterShape, typename Base::GmemTiledCopyB, 0>(position);
    // A tile past the weight's rows (a cluster's spare CTA) loads zeros through TMA; its scale
    // copy then reads the last valid tile rather than another expert's or past the tensor.
    const int row_tile = weight_expert * params.row_tiles + min(int(m_coord), params.row_tiles - 1);
    // kRowsK: the group's k tiles from its first row on (row0 % 128 == 0).
    const int first_k_tile = kRowsK ? int(params.row0[group] / kTileK) : 0;
    const int64_t scale_row = int64_t(row_tile) * params.scale_tiles * kScaleBytes;
    const int pair_tiles = params.scale_tiles * (kScaleTileK / kTileK);  // k tiles per weight
    // kF16: the window of A-row exponents from the aligned-down first row of this tile.
    const int64_t first_row = kF16 ? params.row0[group] + int64_t(n_coord) * kTileN : 0;
    const int last_k_tile = k_tile_count - 1;
    for_each_k_tile(pipeline, smem_pipe_write, k_tile_iter, k_tile_count,
                    [&](auto& barrier, int stage, int k_tile) {
                      const bool second = kPairedK && k_tile >= pair_tiles;
                      const int set = kPairedK ? int(second) : index.set;
                      const int pair_tile =
                          (second ? k_tile - pair_tiles : k_tile) + first_k_tile;
                      copy(params.tma_w[set].with(barrier), tWgW(_, _, _, pair_tile),
                           tWsW(_, _, _, stage));
                      copy(params.tma_load_b.with(x_map(maps, second), barrier, mask_b),
                           tBgB(_, _, _, pair_tile - first_k_tile), tBsB(_, _, _, stage));
                      SM90_BULK_COPY_G2S::copy(
                          params.scales[set] + scale_row + int64_t(pair_tile / 2) * kScaleBytes,
                          &barrier, shared_tensors.smem_scale.data() + stage * kScaleBytes,
                          kScaleBytes);
                      if (kF16 && k_tile == last_k_tile) {  // read by the rescale
                        cutlass::arch::ClusterTransactionBarrier::expect_transaction(
                            &barrier, kExponentBytes);
                        uint8_t* exponents =
                            shared_tensors.smem_exponent.data() + stage * kExponentBytes;
                        SM90_BULK_COPY_G2S::copy(
                            params.b_exponents[index.set] + int64_t(row_tile) * kTileM, &barrier,
                            exponents, kTileM);
                        SM90_BULK_COPY_G2S::copy(params.a_shift + 4 * group, &barrier,
                                                 exponents + kRecordAt, 16);
                        SM90_BULK_COPY_G2S::copy(
                            params.a_exponents[index.set] + (first_row & ~int64_t{15}), &barrier,
                            exponents + kWindowAt, kWindowBytes);
                      }
                    });
  }

  // Consumer warpgroups: k tiles t - 1's and t's wgmmas run while tile t + 1's weights are
  // converted. Every stage read is released here, so mma_tail has nothing left to do.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    const int warp_group =
        __shfl_sync(0xffffffffu, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    // B's descriptors are the warpgroup's; A's registers are each thread's own.
    auto group_mma = tiled_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
    auto thread_mma = tiled_mma.get_slice(thread_idx);
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
                            typename Base::SmemLayoutB{});
    Tensor tCrB = group_mma.make_fragment_B(group_mma.partition_B(sB));  // (MMA,N,K,PIPE)
    Tensor a_shape = make_tensor(make_smem_ptr(static_cast<Element*>(nullptr)),
                                 make_layout(make_shape(Int<kTileM>{}, Int<kTileK>{})));
    Tensor frag0 = thread_mma.partition_fragment_A(a_shape);  // (MMA, 1, K blocks)
    Tensor frag1 = thread_mma.partition_fragment_A(a_shape);
    Tensor frag2 = thread_mma.partition_fragment_A(a_shape);
    static_assert(kQueuedBatches == 2, "three register buffers rotate below");
    Tensor coords = thread_mma.partition_A(make_identity_tensor(shape(a_shape)));
    const Converter converter = Converter::make(shared_tensors, coords);

    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    PipelineState release = smem_pipe_read;
    pipeline.consumer_wait(smem_pipe_read);
    for (int t = 0; t < k_tile_count; t += 3) {
      Steps::template step<true>(pipeline, smem_pipe_read, release, t, k_tile_count, tiled_mma,
                                 tCrB, frag0, frag1, accum, converter);
      if (t + 1 >= k_tile_count) break;
      Steps::step(pipeline, smem_pipe_read, release, t + 1, k_tile_count, tiled_mma, tCrB, frag1,
                  frag2, accum, converter);
      if (t + 2 >= k_tile_count) break;
      Steps::step(pipeline, smem_pipe_read, release, t + 2, k_tile_count, tiled_mma, tCrB, frag2,
                  frag0, accum, converter);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(accum);
    if constexpr (kF16) {  // the last tile's stage holds the exponents
      PipelineState last = release;
      for (int i = 1; i < min(k_tile_count, kQueuedBatches); ++i) ++last;
      rescale(thread_mma, accum, shared_tensors, last.index());
    }
    // The stages of the last tiles, which no step released.
    for (int left = min(k_tile_count, kQueuedBatches); left > 0; --left) {
      pipeline.consumer_release(release);
      ++release;
    }
  }

  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}

 private:
  // The X descriptor of a k tile: Base's B, or (kPairedK) its second pair's for the second half.
  template <class TensorMaps>
  CUTLASS_DEVICE static auto x_map(TensorMaps const& maps, bool second) {
    if constexpr (kPairedK) {
      return second ? cute::get<3>(maps) : cute::get<1>(maps);
    } else {
      return cute::get<1>(maps);
    }
  }

  // kF16: the sums of rebased products times 2^(R_b - 127) * 2^(R_a - 127), from the exponents
  // the last stage still holds (two exact power-of-two multiplies unless a result leaves fp32's
  // normal range).
  template <class ThreadMma, class FrgTensorC>
  CUTLASS_DEVICE static void rescale(ThreadMma const& thread_mma, FrgTensorC& accum,
                                     TensorStorage& storage, int stage) {
    using namespace cute;
    const uint8_t* exponents = storage.smem_exponent.data() + stage * kExponentBytes;
    const uint8_t* a_rows =
        exponents + kWindowAt + *reinterpret_cast<const int32_t*>(exponents + kRecordAt);
    Tensor coords = thread_mma.partition_C(
        make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{})));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); ++i) {
      const int m = get<0>(coords(i));
      const int n = get<1>(coords(i));
      accum(i) = accum(i) * mxfp8::exponent_value(exponents[m]) * mxfp8::exponent_value(a_rows[n]);
    }
  }
};

}  // namespace mok::gemm::detail
