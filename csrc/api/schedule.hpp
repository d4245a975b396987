// Python binding of the schedule family: argument checks, then the schedule's launches.
//
// Arguments are raw device addresses (Python ints) and a cudaStream_t as an int, so the module has
// no torch dependency; mok/backends/cuda/schedule.py allocates the outputs and the scratch and
// passes their data_ptr().
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>

#include "api/checks.hpp"
#include "common/cuda_check.hpp"
#include "schedule/schedule.h"

namespace mok::api {
// Helpers of this family only (other families have their own), hence the nested namespace.
namespace schedule_checks {

namespace py = pybind11;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// The grid's y dimension is the source rank.
constexpr int64_t kMaxEp = 65535;

using checks::require;

inline void check_range(const char* name, int64_t value, int64_t low, int64_t high) {
  checks::in_range(name, value, low, high);
}

inline void check_address(const char* name, uintptr_t address, uintptr_t alignment) {
  checks::address(name, address, alignment);
}

// The sizes every entry point accepts; the launch relies on them (int32 route indices and
// counts, grid limits, the place kernel's shared counters).
inline void check_sizes(int64_t ep, int64_t routes, int64_t experts) {
  check_range("ep", ep, 1, kMaxEp);
  check_range("routes", routes, 0, kInt32Max);
  check_range("experts", experts, 1, schedule::kMaxLocalExperts);
}

}  // namespace schedule_checks

inline int64_t schedule_workspace_bytes(int64_t ep, int64_t routes, int64_t experts) {
  schedule_checks::check_sizes(ep, routes, experts);
  return static_cast<int64_t>(schedule::make_layout(ep, routes, experts).bytes);
}

inline void schedule(uintptr_t topk_all, uintptr_t peer_rank, uintptr_t peer_token_idx,
                     uintptr_t num_tokens, uintptr_t tokens_per_expert, uintptr_t status,
                     uintptr_t workspace, int64_t ep, int64_t routes, int64_t experts,
                     int64_t capacity, int64_t rank, uintptr_t stream, uintptr_t route_rows,
                     uintptr_t ids) {
  namespace checks = schedule_checks;
  checks::check_sizes(ep, routes, experts);
  checks::check_range("rank", rank, 0, ep - 1);
  checks::check_range("capacity", capacity, schedule::kRowsPerSegment,
                       checks::kInt32Max);
  checks::require(capacity % schedule::kRowsPerSegment == 0,
                  "`capacity` must be a multiple of 256, got " + std::to_string(capacity));
  if (routes > 0) checks::check_address("topk_all", topk_all, alignof(int32_t));
  checks::check_address("peer_rank", peer_rank, alignof(int32_t));
  checks::check_address("peer_token_idx", peer_token_idx, alignof(int32_t));
  checks::check_address("num_tokens", num_tokens, alignof(int32_t));
  checks::check_address("tokens_per_expert", tokens_per_expert, alignof(int32_t));
  checks::check_address("status", status, alignof(int32_t));
  checks::check_address("workspace", workspace, alignof(int64_t));
  if (route_rows != 0 && routes > 0) {
    checks::check_address("route_rows", route_rows, alignof(int32_t));
  }
  if (ids != 0) {
    checks::require(ep == 1, "`ids` is for a one-rank schedule (ep 1), got ep " +
                                 std::to_string(ep));
    if (routes > 0) checks::check_address("ids", ids, alignof(int64_t));
  }

  schedule::Args args;
  args.topk_all = reinterpret_cast<const int32_t*>(topk_all);
  args.peer_rank = reinterpret_cast<int32_t*>(peer_rank);
  args.peer_token_idx = reinterpret_cast<int32_t*>(peer_token_idx);
  args.num_tokens = reinterpret_cast<int32_t*>(num_tokens);
  args.tokens_per_expert = reinterpret_cast<int32_t*>(tokens_per_expert);
  args.status = reinterpret_cast<int32_t*>(status);
  args.workspace = reinterpret_cast<void*>(workspace);
  args.ep = ep;
  args.routes = routes;
  args.experts = experts;
  args.capacity = capacity;
  args.rank = rank;
  args.route_rows = reinterpret_cast<int32_t*>(route_rows);
  args.ids = reinterpret_cast<const int64_t*>(ids);
  check_cuda(schedule::launch(args, reinterpret_cast<cudaStream_t>(stream)), "schedule launch");
}

inline void routing(uintptr_t ids, uintptr_t routing, uintptr_t status, int64_t routes,
                    int64_t num_experts, uintptr_t stream) {
  namespace checks = schedule_checks;
  checks::check_range("routes", routes, 0, checks::kInt32Max);
  checks::check_range("num_experts", num_experts, 1, checks::kInt32Max);
  if (routes > 0) {
    checks::check_address("ids", ids, alignof(int64_t));
    checks::check_address("routing", routing, alignof(int32_t));
  }
  checks::check_address("status", status, alignof(int32_t));
  check_cuda(schedule::launch_routing(reinterpret_cast<const int64_t*>(ids),
                                      reinterpret_cast<int32_t*>(routing), routes, num_experts,
                                      reinterpret_cast<int32_t*>(status),
                                      reinterpret_cast<cudaStream_t>(stream)),
             "routing launch");
}

inline void bind_schedule(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("schedule_workspace_bytes", &schedule_workspace_bytes, py::arg("ep"), py::arg("routes"),
        py::arg("experts"),
        "Bytes of device scratch `schedule` needs (8-byte aligned) for these sizes.");
  m.def("schedule", &schedule, py::arg("topk_all"), py::arg("peer_rank"),
        py::arg("peer_token_idx"), py::arg("num_tokens"), py::arg("tokens_per_expert"),
        py::arg("status"), py::arg("workspace"), py::arg("ep"), py::arg("routes"),
        py::arg("experts"), py::arg("capacity"), py::arg("rank"), py::arg("stream"),
        py::arg("route_rows") = 0, py::arg("ids") = 0,
        R"doc(The routed-row schedule of destination `rank` on `stream` (asynchronous, no sync).

All buffers are contiguous device addresses:
  topk_all           int32 [ep, routes]  global expert ids (routes = T * topk), any value
  peer_rank          int32 [capacity]    out: source rank of each row, -1 on padding
  peer_token_idx     int32 [capacity]    out: token * topk + slot on the source, -1 on padding
  num_tokens         int32 [1]           out: rows in use (a multiple of 256, <= capacity)
  tokens_per_expert  int32 [experts]     out: each local expert's padded rows (cut at capacity)
  status             int32 [1]           in/out: 2 (CAPACITY_OVERFLOW) is OR-ed in on overflow
  workspace          schedule_workspace_bytes(ep, routes, experts) bytes, 8-byte aligned
  route_rows         int32 [routes]      optional out (0: none): the row of each route of source
                                         `rank` itself, -1 for a route placed nowhere here
  ids                int64 [routes]      optional (0: none; ep 1 only): global expert ids, read in
                                         place of topk_all, which becomes an out: the routing
                                         `routing` writes (1, INVALID_EXPERT_ID, OR-ed into status
                                         if an id is outside [0, experts))
The order is mok.backends.reference.schedule's, bit for bit. Raises ValueError for bad
arguments and RuntimeError for a CUDA error.)doc");
  m.def("routing", &routing, py::arg("ids"), py::arg("routing"), py::arg("status"),
        py::arg("routes"), py::arg("num_experts"), py::arg("stream"),
        R"doc(The routing build_schedule all-gathers, on `stream` (asynchronous, no sync).

  ids      int64 [routes]  global expert ids, any value
  routing  int32 [routes]  out: the id, or -1 where it is outside [0, num_experts)
  status   int32 [1]       in/out: 1 (INVALID_EXPERT_ID) is OR-ed in if any id was outside
Raises ValueError for bad arguments and RuntimeError for a CUDA error.)doc");
}

}  // namespace mok::api
