// The MXFP8 linear kinds' partly used last tiles in a second launch (grouped.h's splits_tail).
//
// Their tiles cover 256 routed rows (wgmma's N) and cost a whole tile's work however few of
// those rows are routed: on Qwen3.5's gate GEMM 2049 rows an expert took 624 us against 518 us
// at 2048 (benchmarks/NOTES.md v37). One kernel cannot also hold narrower wgmmas (ptxas then
// serializes them, C7512), so a segment's last <= 128 routed rows go to a second instantiation
// with 128-row tiles. It runs concurrently on the caller's stream while the main launch runs on
// a side stream of the device's highest priority: the main launch's CTAs are placed first,
// and the tail's take the SMs the main launch's last wave leaves idle. Each output element is
// still computed by one tile in a fixed K order, so results are bitwise repeatable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <type_traits>

#include "gemm/grouped.h"
#include "gemm/tables.cuh"

namespace mok::gemm::detail {

// A device's side stream (of the device's highest priority) and the events that fork it from
// and join it to a caller's stream, made on first use and kept for the process; `lock` holds
// one fork-join at a time (grouped.cu).
struct SideStream {
  std::mutex lock;
  bool made = false;
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t join = nullptr;
};

// The current device's SideStream, locked while the lease lives.
class SideStreamLease {
 public:
  explicit SideStreamLease(int device);
  ~SideStreamLease() { side_->lock.unlock(); }
  SideStreamLease(const SideStreamLease&) = delete;
  SideStreamLease& operator=(const SideStreamLease&) = delete;
  // cudaSuccess once the stream and its events exist.
  cudaError_t status() const { return status_; }
  const SideStream& side() const { return *side_; }

 private:
  SideStream* side_;
  cudaError_t status_ = cudaSuccess;
};

// The device and the persistent CTAs of a launch (GroupedArgs.sm_count, or every SM).
inline cudaError_t device_and_sms(const GroupedArgs& args, int* device, int* sm_count) {
  cudaError_t status = cudaGetDevice(device);
  if (status != cudaSuccess) return status;
  *sm_count = args.sm_count;
  if (*sm_count > 0) return cudaSuccess;
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, *device);
}

// Main: a GroupedGemm of a splits_tail kind. Scratch: Main's tables and workspace, then the
// tail's.
template <class Main>
struct TailSplitGemm {
  using Tail = typename Main::template WithTileN<kTailTileRows>;
  using Tables = typename Main::Tables;
  static_assert(std::is_same_v<Tables, typename Tail::Tables>, "one table layout for both");

  static size_t scratch_bytes(int groups, int sm_count) {
    return Main::scratch_bytes(groups, sm_count) + Tail::scratch_bytes(groups, sm_count);
  }

  static cudaError_t launch(const GroupedArgs& args, cudaStream_t stream) {
    if (!args.split_tail) return Main::launch(args, stream);
    const int groups = Main::groups_of(args);
    int device = 0;
    int sm_count = 0;
    cudaError_t status = device_and_sms(args, &device, &sm_count);
    if (status != cudaSuccess) return status;
    if (scratch_bytes(groups, sm_count) > args.scratch_bytes) return cudaErrorInvalidValue;
    char* scratch = static_cast<char*>(args.scratch);
    char* tail_scratch = scratch + Main::scratch_bytes(groups, sm_count);
    const Tables tables = Tables::carve(scratch, groups);
    const Tables tail_tables = Tables::carve(tail_scratch, groups);
    status = fill_tables<Main::kind>(args, tables, groups, stream, &tail_tables);
    if (status != cudaSuccess) return status;
    const SideStreamLease lease(device);
    if (lease.status() != cudaSuccess) return lease.status();
    const SideStream& side = lease.side();
    status = cudaEventRecord(side.fork, stream);
    if (status == cudaSuccess) status = cudaStreamWaitEvent(side.stream, side.fork, 0);
    if (status != cudaSuccess) return status;
    // Main first, so its CTAs are queued before the tail's; the side stream joins back even if
    // a launch failed, so the caller's stream is never left forked.
    status = Main::run(args, tables, scratch + Tables::bytes(groups), groups, device, sm_count,
                       side.stream);
    if (status == cudaSuccess) {
      status = Tail::run(args, tail_tables, tail_scratch + Tables::bytes(groups), groups, device,
                         sm_count, stream);
    }
    cudaError_t joined = cudaEventRecord(side.join, side.stream);
    if (joined == cudaSuccess) joined = cudaStreamWaitEvent(stream, side.join, 0);
    return status != cudaSuccess ? status : joined;
  }
};

// A kind's launch: the tail split where the kind has one.
template <class Gemm>
cudaError_t launch_gemm(const GroupedArgs& args, cudaStream_t stream) {
  if constexpr (splits_tail(Gemm::kind)) {
    return TailSplitGemm<Gemm>::launch(args, stream);
  } else {
    return Gemm::launch(args, stream);
  }
}

template <class Gemm>
size_t gemm_scratch_bytes(int groups, int sm_count) {
  if constexpr (splits_tail(Gemm::kind)) {
    return TailSplitGemm<Gemm>::scratch_bytes(groups, sm_count);
  } else {
    return Gemm::scratch_bytes(groups, sm_count);
  }
}

}  // namespace mok::gemm::detail
