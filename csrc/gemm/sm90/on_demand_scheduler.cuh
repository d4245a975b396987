// CUTLASS's SM90 group tile scheduler with tiles handed out on demand, for the GEMMs that run
// beside a dispatch pull (docs/overlap.md).
//
// The base scheduler strides statically: cluster s of G takes tiles s, s + G, s + 2G, ... That
// suits a GEMM alone on the device, but beside a pull the GEMM is launched on every SM and the
// clusters on the pull's SMs start only when the pull's CTAs exit: with static strides they
// would end late by the pull's length. Here each cluster takes its first tile statically (cluster
// s, tile s) and every later one from a ticket counter in the kernel's workspace (tile G + ticket),
// so a late cluster only takes what is left. A tile is still computed whole by one cluster in a
// fixed K order, so which cluster takes it changes no bit.
//
// The CTAs of a cluster must work on the same tile (they share the B tile by multicast), so only
// the cluster's leader (its first CTA) takes tickets and posts each to the other CTAs through
// mailboxes in the workspace: a ring of kSlots tickets each, tagged with the request's number,
// and a count of the requests the CTA has read, so the leader never overwrites an unread ticket.
// Waits are bounded like a barrier's (common/flags.cuh): one that gives up ORs kStatusTimeout
// into the status word and ends the CTA's work.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/flags.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace mok::gemm::detail {

// The group problem shape of the GEMMs that wait for rows, under its own name so that CUTLASS's
// kernel picks the on-demand scheduler for them (the selector below).
template <class Underlying>
struct OnDemandGroupShape : cutlass::gemm::GroupProblemShape<Underlying> {};

template <class GroupShape, uint32_t kStages, int kClusterSize>
class OnDemandTileScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupShape, kStages> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupShape, kStages>;

 public:
  using typename Base::SchedulerResponse;
  using typename Base::WorkTileInfo;

  static constexpr int kSlots = 16;  // tickets a leader may post ahead of a CTA reading them
  static constexpr int kPeers = kClusterSize - 1;

  struct Mailbox {
    uint32_t ticket[kSlots];
    uint32_t posted[kSlots];  // the number + 1 of the request whose ticket is in the slot
    uint32_t taken;           // requests the CTA has read
    uint32_t unused[31];      // a line of its own for the count the leader polls
  };

  struct Arguments : Base::Arguments {
    bool on_demand = false;  // false: the base's static strides, no workspace touched
    int* status = nullptr;
    uint64_t timeout_ns = 0;
  };

  struct Tickets {
    uint32_t* counter = nullptr;  // null: static strides
    Mailbox* mailboxes = nullptr;
    uint64_t mailbox_clusters = 0;
    int* status = nullptr;
    uint64_t timeout_ns = 0;
  };

  struct Params : Base::Params {
    Tickets tickets;
  };

  static constexpr size_t kCounterBytes = 128;

  // Clusters with a mailbox: every cluster a grid of `sm_count` CTAs can hold.
  static uint64_t mailbox_clusters(int sm_count) {
    return static_cast<uint64_t>(sm_count > 0 ? sm_count : 0) / kClusterSize + 1;
  }

  static size_t workspace_bytes(int sm_count) {
    return kCounterBytes + mailbox_clusters(sm_count) * kPeers * sizeof(Mailbox);
  }

  template <class TileShape, class ClusterShape>
  static Params to_underlying_arguments(GroupShape problem_shapes, TileShape tile_shape,
                                        ClusterShape cluster_shape,
                                        cutlass::KernelHardwareInfo const& hw_info,
                                        Arguments const& arguments, void* workspace = nullptr,
                                        const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    static_assert(cute::size(ClusterShape{}) == kClusterSize);
    Params params;
    static_cast<typename Base::Params&>(params) = Base::to_underlying_arguments(
        problem_shapes, tile_shape, cluster_shape, hw_info, arguments, workspace, epilogue_subtile,
        ktile_start_alignment_count);
    Tickets& tickets = params.tickets;
    if (arguments.on_demand && workspace != nullptr) {
      tickets.counter = static_cast<uint32_t*>(workspace);
      tickets.mailboxes = reinterpret_cast<Mailbox*>(static_cast<char*>(workspace) + kCounterBytes);
      tickets.mailbox_clusters = mailbox_clusters(hw_info.sm_count);
    }
    tickets.status = arguments.status;
    tickets.timeout_ns = arguments.timeout_ns;
    return params;
  }

  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const&, ProblemShape,
                                   cutlass::KernelHardwareInfo const& hw_info, uint32_t,
                                   const uint32_t = 1, uint32_t = 1) {
    return workspace_bytes(hw_info.sm_count);
  }

  // The counter and the mailboxes start at zero on every launch (stream-ordered, so a CUDA
  // graph captures it).
  template <class ProblemShape, class ElementAccumulator>
  static cutlass::Status initialize_workspace(Arguments const& arguments, void* workspace,
                                              cudaStream_t stream, ProblemShape,
                                              cutlass::KernelHardwareInfo const& hw_info,
                                              uint32_t, const uint32_t = 1, uint32_t = 1,
                                              cutlass::CudaHostAdapter* = nullptr) {
    if (!arguments.on_demand) return cutlass::Status::kSuccess;
    if (workspace == nullptr) return cutlass::Status::kErrorWorkspaceNull;
    const cudaError_t status =
        cudaMemsetAsync(workspace, 0, workspace_bytes(hw_info.sm_count), stream);
    return status == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
  }

  OnDemandTileScheduler() = default;

  CUTLASS_DEVICE OnDemandTileScheduler(Params const& params, SchedulerResponse* response)
      : Base(params, response), tickets_(params.tickets) {
#if defined(__CUDA_ARCH__)
    // The base's first linear index: the CTAs of a cluster are consecutive in it.
    const uint64_t linear = params.raster_order_ == Base::RasterOrder::AlongN
                                ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * gridDim.x
                                : uint64_t(blockIdx.x) * gridDim.y + uint64_t(blockIdx.y);
    cluster_ = linear / kClusterSize;
    rank_ = static_cast<int>(linear % kClusterSize);
    clusters_ = uint64_t(gridDim.x) * gridDim.y * gridDim.z / kClusterSize;
#endif
  }

  // The scheduler warp's step: as the base's, but the next tile comes from a ticket.
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto advance_to_next_work(Pipeline& pipeline, PipelineState producer_state,
                                           uint32_t advance_count = 1) {
    if (tickets_.counter == nullptr) {
      return Base::advance_to_next_work(pipeline, producer_state, advance_count);
    }
    // Take the ticket once the pipeline has room for its tile: a cluster holds no more tiles
    // than the pipeline's stages ahead of its consumers.
    pipeline.producer_acquire(producer_state);
    uint32_t ticket = 0;
    bool valid = false;
    if (cutlass::canonical_lane_idx() == 0) valid = next_ticket(ticket);
    valid = __shfl_sync(0xffffffff, valid, 0);
    ticket = __shfl_sync(0xffffffff, ticket, 0);
    // Every lane walks the groups (a warp-wide search), so the whole warp computes the tile.
    const WorkTileInfo tile =
        valid ? this->get_current_work_for_linear_idx((clusters_ + ticket) * kClusterSize + rank_)
              : WorkTileInfo::invalid_work_tile();
    if (cute::elect_one_sync()) {
      this->response_ptr_[producer_state.index()] = tile;
      cutlass::arch::fence_view_async_shared();
      pipeline.producer_commit(producer_state);
    }
    return cute::make_tuple(tile, true);
  }

 private:
  // One thread. The leader takes a ticket and posts it to the cluster's other CTAs; they read
  // theirs. False if a wait gave up, or for a cluster beyond the mailboxes (none is: they are
  // sized for the SMs), which then ends after its first tile: the tickets cover every later one.
  CUTLASS_DEVICE bool next_ticket(uint32_t& ticket) {
    const uint32_t request = requests_++;
    if (cluster_ >= tickets_.mailbox_clusters) return false;
    Mailbox* boxes = tickets_.mailboxes + cluster_ * kPeers;
    const int slot = static_cast<int>(request % kSlots);
    if (rank_ != 0) {
      Mailbox& box = boxes[rank_ - 1];
      if (!comm::wait_flag(&box.posted[slot], request + 1, tickets_.timeout_ns, tickets_.status)) {
        return false;
      }
      ticket = box.ticket[slot];
      comm::signal_flag(&box.taken, request + 1);
      return true;
    }
    ticket = atomicAdd(tickets_.counter, 1u);
    for (int peer = 0; peer < kPeers; ++peer) {
      Mailbox& box = boxes[peer];
      if (request >= kSlots && !comm::wait_flag(&box.taken, request + 1 - kSlots,
                                                tickets_.timeout_ns, tickets_.status)) {
        return false;
      }
      box.ticket[slot] = ticket;
      comm::signal_flag(&box.posted[slot], request + 1);
    }
    return true;
  }

  Tickets tickets_;
  uint64_t cluster_ = 0;
  uint64_t clusters_ = 0;
  int rank_ = 0;
  uint32_t requests_ = 0;
};

template <class Scheduler>
inline constexpr bool kHandsOutOnDemand = false;
template <class GroupShape, uint32_t kStages, int kClusterSize>
inline constexpr bool
    kHandsOutOnDemand<OnDemandTileScheduler<GroupShape, kStages, kClusterSize>> = true;

}  // namespace mok::gemm::detail

namespace cutlass::gemm::kernel::detail {

// CUTLASS's ptr-array cooperative kernel takes its group scheduler from this selector: for the
// on-demand shape, the on-demand scheduler.
template <class TileShape, class ClusterShape, uint32_t kStages, class Underlying>
struct TileSchedulerSelector<GroupScheduler, arch::Sm90, TileShape, ClusterShape, kStages,
                             mok::gemm::detail::OnDemandGroupShape<Underlying>> {
  using Scheduler = mok::gemm::detail::OnDemandTileScheduler<
      mok::gemm::detail::OnDemandGroupShape<Underlying>, kStages,
      static_cast<int>(cute::size(ClusterShape{}))>;
};

}  // namespace cutlass::gemm::kernel::detail
