// Host entry point of the routed-row schedule (defined in schedule.cu), and the plan it follows.
//
// The schedule of destination `rank` is the order of mok.backends.reference.schedule: rows grouped
// by local expert in 256-row padded segments; inside a segment the sources take turns (the j-th
// route of every source before the (j+1)-th of any), each source's routes in token*topk+slot order;
// padding rows -1. tests/cpu/test_schedule_algorithm.py emulates these kernels step by step and
// reads the constants below from this file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mok::schedule {

constexpr int kLanes = 32;
// 32-route steps per warp: a warp owns 512 consecutive routes of its block's chunk and keeps them
// in registers between the place kernel's two passes.
constexpr int kSteps = 16;
constexpr int kMaxWarps = 8;
// int32 counters in the place kernel's shared memory, one row of E per warp: warps * E <= this
// keeps it at 32 KiB, under the 48 KiB every launch gets without an opt-in.
constexpr int kCounters = 8192;
// Where ep * experts <= kSegmentThreads, one block of kSegmentThreads scans the columns and lays
// out the segments: a launch fewer.
constexpr int kSegmentThreads = 1024;
constexpr int kColumnThreads = 256;
constexpr int kRowsPerSegment = 256;
// The bits mok/status.py calls INVALID_EXPERT_ID and CAPACITY_OVERFLOW (a CPU test keeps them
// equal).
constexpr int32_t kInvalidExpertId = 1;
constexpr int32_t kCapacityOverflow = 2;
constexpr int kRoutingThreads = 256;

// How the routes of one source are cut into blocks. A function of (routes, experts) only, so the
// decomposition, and with it every scan, is the same on every run.
struct Plan {
  int warps = 1;       // warps per block of the count and place kernels
  int64_t chunk = 0;   // routes per block: warps * kSteps * kLanes
  int64_t chunks = 0;  // blocks per source
};

constexpr int64_t kMaxLocalExperts = kCounters;

inline Plan make_plan(int64_t routes, int64_t experts) {
  Plan plan;
  const int64_t fit = kCounters / experts;
  plan.warps = static_cast<int>(fit < kMaxWarps ? fit : kMaxWarps);
  plan.chunk = static_cast<int64_t>(plan.warps) * kSteps * kLanes;
  plan.chunks = (routes + plan.chunk - 1) / plan.chunk;
  return plan;
}

// Scratch layout (bytes from the start, which must be 8-byte aligned):
//   seg_start int64 [E]                 first row of each local expert's segment
//   count     int32 [E, EP]             routes from each source to each local expert
//   hist      int32 [EP, chunks, E]     per-chunk counts, then their exclusive scan over chunks
struct Layout {
  size_t seg_start = 0;
  size_t count = 0;
  size_t hist = 0;
  size_t bytes = 0;
};

inline Layout make_layout(int64_t ep, int64_t routes, int64_t experts) {
  const Plan plan = make_plan(routes, experts);
  Layout layout;
  layout.count = static_cast<size_t>(experts) * sizeof(int64_t);
  layout.hist = layout.count + static_cast<size_t>(experts * ep) * sizeof(int32_t);
  layout.bytes = layout.hist + static_cast<size_t>(ep * plan.chunks * experts) * sizeof(int32_t);
  return layout;
}

// Raw device pointers and sizes of one schedule call (all int32 unless said otherwise).
struct Args {
  const int32_t* topk_all = nullptr;  // [ep, routes] global expert ids, any value
  int32_t* peer_rank = nullptr;       // [capacity] out
  int32_t* peer_token_idx = nullptr;  // [capacity] out
  int32_t* num_tokens = nullptr;      // [1] out
  int32_t* tokens_per_expert = nullptr;  // [experts] out
  int32_t* status = nullptr;          // [1] kCapacityOverflow is OR-ed in on overflow
  void* workspace = nullptr;          // make_layout(...).bytes of scratch, 8-byte aligned
  int64_t ep = 0;
  int64_t routes = 0;  // tokens * topk per source
  int64_t experts = 0;
  int64_t capacity = 0;
  int64_t rank = 0;
  // [routes] out, or null: the row of each of `rank`'s own routes that this schedule places
  // (-1 for the others): at EP 1 every route's, so the combine reads the rows in place.
  int32_t* route_rows = nullptr;
  // [routes] int64 global expert ids, or null. Given (EP 1 only), the count kernel reads them,
  // writes the routing `launch_routing` would write into topk_all (which is then an output) and
  // ORs kInvalidExpertId into status: the routing takes no launch of its own.
  const int64_t* ids = nullptr;
};

// Enqueues the memsets and kernels on `stream`; returns the first failing status (never
// synchronises, so the call can be captured in a CUDA graph).
cudaError_t launch(const Args& args, cudaStream_t stream);

// The routing build_schedule all-gathers: ids[i] as int32, or -1 where ids[i] is outside
// [0, num_experts), and kInvalidExpertId OR-ed into `status` if any is. One kernel in place of
// the half-dozen elementwise ops the same check takes in torch (each a launch on the host's
// critical path before the first GEMM). Enqueues nothing for routes == 0.
cudaError_t launch_routing(const int64_t* ids, int32_t* routing, int64_t routes,
                           int64_t num_experts, int32_t* status, cudaStream_t stream);

}  // namespace mok::schedule
