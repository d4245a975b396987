// One CUTLASS 3 grouped GEMM per Kind: Hopper TMA loads, wgmma in two consumer warpgroups, a
// persistent group tile scheduler (KernelPtrArrayTmaWarpSpecializedCooperative), 128x256x64
// tiles in 2x1 clusters -- the configuration torch._grouped_mm picks for large problems.
//
// The per-group problem shapes, operand addresses and strides are written by `fill_tables`
// on the stream from the device-resident segment sizes, so the host never reads them. Each
// output tile is computed by one CTA with a fixed K order: results do not depend on which CTA
// ran it, so repeated launches are bitwise identical.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "common/shared_memory.hpp"
#include "gemm/grouped_gemm.h"
#include "gemm/sm90/arrival_mainloop.cuh"
#include "gemm/sm90/gate_up_mainloop.cuh"
#include "gemm/sm90/mx_weight_mainloop.cuh"
#include "gemm/sm90/on_demand_scheduler.cuh"
#include "gemm/sm90/paired_mainloop.cuh"
#include "gemm/sm90/swiglu_epilogue.cuh"
#include "gemm/sm90/tables.cuh"

namespace mok::gemm::detail {

// LayoutA/LayoutB in CUTLASS's terms: A is M x K (RowMajor = K contiguous), B is K x N
// (ColumnMajor = K contiguous); LayoutD ColumnMajor for the kinds computed transposed. No kind
// reads a source term (C).
template <Kind kKind, class LayoutA, class LayoutB, class ElementD,
          class LayoutD = cutlass::layout::RowMajor>
struct GroupedGemm {
  static constexpr Kind kind = kKind;
  static constexpr bool kPaired = pairs_along_k(kKind);
  static constexpr bool kMxWeightF16 = kKind == Kind::M_GROUPED_MXFP8_NT_F16_ROWS;
  static constexpr bool kMxWeight = reads_mx_weight(kKind);
  static constexpr bool kSwiglu = kKind == Kind::M_GROUPED_BF16_NT_SWIGLU;
  static constexpr bool kWaits = waits_for_rows(kKind);
  // The kinds that wait for rows hand out tiles on demand (on_demand_scheduler.cuh).
  using ProblemShape =
      std::conditional_t<kWaits, OnDemandGroupShape<cute::Shape<int, int, int>>,
                         cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>>;
  using Element = std::conditional_t<kMxWeightF16, cutlass::half_t, cutlass::bfloat16_t>;
  using ElementC = void;
  using Accumulator = float;
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::Int<kTileK>>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  static constexpr int kAlignment = 16 / sizeof(Element);
  static constexpr int kAlignmentD = 16 / sizeof(ElementD);

  // The MXFP8 kinds' five mainloop stages leave the epilogue ~23 KB of shared memory: room for
  // the auto epilogue tile's bf16 stages (18 KB) but not its fp32 ones (34 KB). So fp32 D
  // (M_GROUPED_MXFP8_NT_F32) is stored straight from the accumulator registers, whole 32-byte
  // sectors per warp store, which was faster than through 128 x 16 TMA tiles; the bf16 kinds'
  // 2-byte direct stores were slower than their TMA tiles, so they keep them.
  static constexpr bool kDirectStore = kMxWeight && sizeof(ElementD) == 4;
  using EpilogueSchedule =
      std::conditional_t<kDirectStore, cutlass::epilogue::PtrArrayNoSmemWarpSpecialized,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
  using BuiltEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator, ElementC,
      LayoutD*, kAlignmentD, ElementD, LayoutD*, kAlignmentD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, Accumulator, ElementC,
                                                   Accumulator>>::CollectiveOp;
  using Epilogue =
      std::conditional_t<kSwiglu, SwigluCollectiveEpilogue<typename BuiltEpilogue::StrideD>,
                         BuiltEpilogue>;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment,
      Element, LayoutB*, kAlignment, Accumulator, TileShape, ClusterShape,
      std::conditional_t<kMxWeight, cutlass::gemm::collective::StageCount<kMxWeightStages>,
                         cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
                             sizeof(typename Epilogue::SharedStorage))>>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using PairedMainloop = PairedKMainloop<BuiltMainloop>;
  using Mainloop = std::conditional_t<
      kMxWeight,
      MxWeightMainloop<std::conditional_t<kPaired, PairedMainloop, BuiltMainloop>, kMxWeightF16,
                       kPaired, kKind == Kind::K_GROUPED_MXFP8_TN>,
      std::conditional_t<
          kPaired, PairedMainloop,
          std::conditional_t<kSwiglu, GateUpMainloop<BuiltMainloop>,
                             std::conditional_t<kWaits, WaitsForArrivals<BuiltMainloop>,
                                                BuiltMainloop>>>>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  static_assert(kHandsOutOnDemand<typename Kernel::TileScheduler> == kWaits,
                "the kinds that wait for rows, and only they, take tiles on demand");
  static_assert(sizeof(typename Kernel::SharedStorage) <= 227 * 1024,
                "sm_90's opt-in limit of shared memory per block");
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Tables = GroupTables<typename ProblemShape::UnderlyingProblemShape, Element, ElementD,
                             typename Kernel::InternalStrideA, typename Kernel::InternalStrideB,
                             typename Kernel::InternalStrideC, typename Kernel::InternalStrideD>;

  static typename Device::Arguments arguments(const GroupedArgs& args, const Tables& tables,
                                              int groups, int device, int sm_count) {
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = device;
    hw_info.sm_count = sm_count;
    ProblemShape shapes;
    shapes.num_groups = groups;
    shapes.problem_shapes = tables.shapes;
    typename Device::Arguments gemm_args{cutlass::gemm::GemmUniversalMode::kGrouped, shapes,
                                         mainloop_arguments(args, tables),
                                         epilogue_arguments(args, tables), hw_info};
    if constexpr (kWaits) {
      // Beside a pull the GEMM is launched on every SM and takes its tiles on demand.
      gemm_args.scheduler.on_demand = args.arrivals.counts != nullptr;
      gemm_args.scheduler.status = args.arrivals.status;
      gemm_args.scheduler.timeout_ns = args.arrivals.timeout_ns;
    }
    return gemm_args;
  }

  static typename Epilogue::Arguments epilogue_arguments(const GroupedArgs& args,
                                                         const Tables& tables) {
    if constexpr (kSwiglu) {
      using D = typename Epilogue::ElementD;
      return {tables.d, static_cast<D*>(args.sets[0].d), static_cast<D*>(args.sets[1].d),
              static_cast<D*>(args.hidden), args.n, args.has_limit, args.limit};
    } else {
      typename Epilogue::Arguments epilogue{{}, nullptr, tables.stride_c, tables.d,
                                            tables.stride_d};
      if constexpr (!kDirectStore) {  // the direct store's thread op defaults to 1 * acc
        auto& fusion = epilogue.thread;
        fusion.alpha = 1.0f;
        fusion.beta = 0.0f;
        fusion.alpha_ptr = nullptr;
        fusion.beta_ptr = nullptr;
        fusion.alpha_ptr_array = nullptr;
        fusion.beta_ptr_array = nullptr;
        fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
        fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
      }
      return epilogue;
    }
  }

  // The arguments of Base's operands (A and B of each pair).
  template <class Base>
  static typename Base::Arguments operand_arguments(const Tables& tables) {
    if constexpr (kPaired) {
      return {{tables.a, tables.stride_a, tables.b, tables.stride_b}, tables.a2, tables.b2};
    } else {
      return {tables.a, tables.stride_a, tables.b, tables.stride_b};
    }
  }

  static typename Mainloop::Arguments mainloop_arguments(const GroupedArgs& args,
                                                         const Tables& tables) {
    if constexpr (kMxWeight) {
      using OperandBase = std::conditional_t<kPaired, PairedMainloop, BuiltMainloop>;
      return {operand_arguments<OperandBase>(tables),
              {args.sets[0].b, args.sets[1].b},
              {args.sets[0].b_scale, args.sets[1].b_scale},
              static_cast<int>(args.n),
              // K_GROUPED_MXFP8_TN: the MXFP8 operand's K is the routed buffer's rows.
              static_cast<int>(kKind == Kind::K_GROUPED_MXFP8_TN ? args.total_rows : args.k),
              args.experts,
              {args.sets[0].b_exponent, args.sets[1].b_exponent},
              {args.sets[0].a_exponent, args.sets[1].a_exponent},
              tables.row0,
              tables.a_shift};
    } else if constexpr (kPaired) {
      return operand_arguments<PairedMainloop>(tables);
    } else if constexpr (kSwiglu) {
      return {operand_arguments<BuiltMainloop>(tables),
              {args.sets[0].b, args.sets[1].b},
              static_cast<int>(args.n),
              static_cast<int>(args.k),
              args.experts};
    } else if constexpr (kWaits) {
      return {operand_arguments<BuiltMainloop>(tables), args.arrivals, tables.row0};
    } else {
      return operand_arguments<BuiltMainloop>(tables);
    }
  }

  // A launch's groups: one per expert and operand set, or per expert where one tile covers
  // both sets (pairs along K, or gate and up side by side).
  static int groups_of(const GroupedArgs& args) {
    return kPaired || kSwiglu ? args.experts : args.num_sets * args.experts;
  }

  static size_t scratch_bytes(int groups, int sm_count) {
    const size_t table_bytes = Tables::bytes(groups);
    Tables placeholder = Tables::carve(nullptr, groups);
    return table_bytes +
           Device::get_workspace_size(arguments(GroupedArgs{}, placeholder, groups, 0, sm_count));
  }

  // Zeroes the arrival counters and enqueues the pull that counts them, after the tables.
  static cudaError_t start_pull(const GroupedArgs& args, cudaStream_t stream) {
    if (!kWaits || args.launch_pull == nullptr || args.pull == nullptr) {
      return cudaErrorInvalidValue;
    }
    const cudaError_t status = cudaMemsetAsync(
        args.arrivals.counts, 0, static_cast<size_t>(args.arrivals.minibatches) * sizeof(uint32_t),
        stream);
    if (status != cudaSuccess) return status;
    return args.launch_pull(args.pull, stream);
  }

  static cudaError_t launch(const GroupedArgs& args, cudaStream_t stream) {
    const int groups = groups_of(args);
    int device = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    int sm_count = args.sm_count;
    if (sm_count <= 0) {
      status = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
      if (status != cudaSuccess) return status;
    }
    if (scratch_bytes(groups, sm_count) > args.scratch_bytes) return cudaErrorInvalidValue;
    Tables tables = Tables::carve(args.scratch, groups);
    status = fill_tables<kKind>(args, tables, groups, stream);
    if (status != cudaSuccess) return status;
    auto gemm_args = arguments(args, tables, groups, device, sm_count);
    void* workspace = static_cast<char*>(args.scratch) + Tables::bytes(groups);
    if (Device::can_implement(gemm_args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    status = allow_dynamic_shared_memory<Kernel>(cutlass::device_kernel<Kernel>,
                                                 Kernel::SharedStorageSize, device);
    if (status != cudaSuccess) return status;
    // What the adapter's initialize() does but the attribute: the workspace, then the params.
    if (Kernel::initialize_workspace(gemm_args, workspace, stream, nullptr) !=
        cutlass::Status::kSuccess) {
      return cudaErrorInvalidValue;
    }
    auto params = Kernel::to_underlying_arguments(gemm_args, workspace);
    const bool overlapped = args.arrivals.counts != nullptr;
    if (overlapped) {
      status = start_pull(args, stream);
      if (status != cudaSuccess) return status;
    }
    // Overlapped, the GEMM is the pull's programmatic dependent: it launches once every pull
    // CTA has started and never waits for the pull's end (GDC is not compiled in, so CUTLASS's
    // griddepcontrol.wait is a no-op); its producer waits for rows by the counters instead.
    if (Device::run(params, stream, nullptr, overlapped) != cutlass::Status::kSuccess) {
      const cudaError_t error = cudaGetLastError();
      return error == cudaSuccess ? cudaErrorLaunchFailure : error;
    }
    return cudaGetLastError();
  }
};

}  // namespace mok::gemm::detail

namespace mok::gemm::detail {

template <Kind kKind>
cudaError_t launch_kind(const GroupedArgs& args, cudaStream_t stream);
template <Kind kKind>
size_t scratch_kind(int groups, int sm_count);

}  // namespace mok::gemm::detail

// Instantiates one Kind's GEMM in its own translation unit (they compile in parallel).
// The arguments after KIND are GroupedGemm's after its Kind: LayoutA, LayoutB, ElementD and,
// for the kinds computed transposed, LayoutD.
#define MOK_DEFINE_GROUPED_KIND(KIND, ...)                                                       \
  namespace mok::gemm::detail {                                                                  \
  using Gemm##KIND = GroupedGemm<Kind::KIND, __VA_ARGS__>;                                       \
  template <>                                                                                    \
  cudaError_t launch_kind<Kind::KIND>(const GroupedArgs& args, cudaStream_t stream) {            \
    return Gemm##KIND::launch(args, stream);                                                     \
  }                                                                                              \
  template <>                                                                                    \
  size_t scratch_kind<Kind::KIND>(int groups, int sm_count) {                                    \
    return Gemm##KIND::scratch_bytes(groups, sm_count);                                          \
  }                                                                                              \
  }
