// Python binding of the communication family: barrier, routing all-gather, pull and push of
// schedule rows, and the combine epilogues. Argument checks, then one launch each.
//
// Arguments are raw device addresses (Python ints), device tables of peer addresses
// (MoKWorkspace.peer_ptr_tables) and a cudaStream_t as an int; mok/backends/cuda/comm.py owns the
// tensors, the barriers around the copies and the workspace bookkeeping.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "comm/combine_epilogue.h"
#include "comm/comm.h"
#include "common/cuda_check.hpp"
#include "mxfp8/mxfp8.h"

namespace mok::api {

namespace comm_checks {

namespace py = pybind11;

using checks::require;

using checks::address;

inline void at_least(const char* name, int64_t value, int64_t low) {
  require(value >= low, std::string("`") + name + "` must be >= " + std::to_string(low) +
                            ", got " + std::to_string(value));
}

inline void group_size(int ep) {
  require(ep >= 1 && ep <= comm::kMaxRanks, "`ep` must be in [1, " +
                                                std::to_string(comm::kMaxRanks) + "], got " +
                                                std::to_string(ep));
}

inline void group(int rank, int ep) {
  group_size(ep);
  require(rank >= 0 && rank < ep, "`rank` must be in [0, " + std::to_string(ep) + "), got " +
                                      std::to_string(rank));
}

inline void row_bytes(int64_t value) {
  require(value > 0 && value % 4 == 0,
          "`row_bytes` must be a positive multiple of 4, got " + std::to_string(value));
}

// A pull's source: every rank's buffer through `src_table`, or (ep 1) the caller's own tensor
// at `src_direct`, read in place.
inline void pull_source(uintptr_t src_table, uintptr_t src_direct, int ep) {
  if (src_direct == 0) {
    address("src_table", src_table, 8);
    return;
  }
  address("src_direct", src_direct, 16);
  require(ep == 1, "`src_direct` reads the local source in place, which needs ep 1, got ep=" +
                       std::to_string(ep));
}

inline comm::ScheduleView schedule(uintptr_t peer_rank, uintptr_t peer_token_idx,
                                   uintptr_t num_tokens, int64_t rows) {
  at_least("rows", rows, 0);
  address("peer_rank", peer_rank, 4);
  address("peer_token_idx", peer_token_idx, 4);
  address("num_tokens", num_tokens, 4);
  comm::ScheduleView view;
  view.peer_rank = reinterpret_cast<const int32_t*>(peer_rank);
  view.peer_token_idx = reinterpret_cast<const int32_t*>(peer_token_idx);
  view.num_tokens = reinterpret_cast<const int32_t*>(num_tokens);
  view.rows = rows;
  return view;
}

inline cudaStream_t stream_of(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

}  // namespace comm_checks

inline void comm_barrier(uintptr_t flag_table, uintptr_t flags, uintptr_t epoch, uintptr_t status,
                         int rank, int ep, uint64_t timeout_ns, uintptr_t stream, uint32_t tag) {
  namespace c = comm_checks;
  c::group(rank, ep);
  c::address("flag_table", flag_table, 8);
  c::address("flags", flags, 4);
  c::address("epoch", epoch, 4);
  c::address("status", status, 4);
  comm::BarrierArgs a;
  a.flag_table = reinterpret_cast<const uint64_t*>(flag_table);
  a.flags = reinterpret_cast<uint32_t*>(flags);
  a.epoch = reinterpret_cast<uint32_t*>(epoch);
  a.status = reinterpret_cast<int*>(status);
  a.rank = rank;
  a.ep = ep;
  a.timeout_ns = timeout_ns;
  a.tag = tag;
  check_cuda(comm::launch_barrier(a, c::stream_of(stream)), "barrier kernel launch");
}

inline void comm_all_gather(uintptr_t src, uintptr_t dst_table, int64_t bytes, int rank, int ep,
                            uintptr_t stream, int64_t chunk_bytes) {
  namespace c = comm_checks;
  c::group(rank, ep);
  c::address("src", src, 4);
  c::address("dst_table", dst_table, 8);
  c::require(bytes >= 0 && bytes % 4 == 0,
             "`bytes` must be a non-negative multiple of 4, got " + std::to_string(bytes));
  c::require(chunk_bytes >= 0 && chunk_bytes % 16 == 0,
             "`chunk_bytes` must be 0 or a positive multiple of 16, got " +
                 std::to_string(chunk_bytes));
  comm::AllGatherArgs a;
  a.src = reinterpret_cast<const void*>(src);
  a.dst_table = reinterpret_cast<const uint64_t*>(dst_table);
  a.bytes = bytes;
  a.rank = rank;
  a.ep = ep;
  a.chunk_bytes = chunk_bytes;
  check_cuda(comm::launch_all_gather(a, c::stream_of(stream)), "all_gather kernel launch");
}

// A pull's arguments but its destination (`out`, checked by whoever sets it).
inline comm::PullArgs pull_args(uintptr_t src_table, uintptr_t peer_rank,
                                uintptr_t peer_token_idx, uintptr_t num_tokens, int64_t rows,
                                int64_t row_bytes, int64_t src_rows, int divisor, int ep, int ctas,
                                bool zero_rest, uintptr_t src_direct) {
  namespace c = comm_checks;
  c::group_size(ep);
  c::pull_source(src_table, src_direct, ep);
  c::row_bytes(row_bytes);
  c::at_least("src_rows", src_rows, 0);
  c::at_least("divisor", divisor, 1);
  c::at_least("ctas", ctas, 1);
  comm::PullArgs a;
  a.schedule = c::schedule(peer_rank, peer_token_idx, num_tokens, rows);
  a.src_table = reinterpret_cast<const uint64_t*>(src_table);
  a.src_direct = reinterpret_cast<const void*>(src_direct);
  a.row_bytes = row_bytes;
  a.src_rows = src_rows;
  a.divisor = divisor;
  a.ep = ep;
  a.ctas = ctas;
  a.zero_rest = zero_rest;
  return a;
}

inline void comm_pull_rows(uintptr_t src_table, uintptr_t out, uintptr_t peer_rank,
                           uintptr_t peer_token_idx, uintptr_t num_tokens, int64_t rows,
                           int64_t row_bytes, int64_t src_rows, int divisor, int ep, int ctas,
                           bool zero_rest, uintptr_t stream, uintptr_t src_direct) {
  namespace c = comm_checks;
  comm::PullArgs a = pull_args(src_table, peer_rank, peer_token_idx, num_tokens, rows, row_bytes,
                               src_rows, divisor, ep, ctas, zero_rest, src_direct);
  c::address("out", out, 4);
  a.out = reinterpret_cast<void*>(out);
  check_cuda(comm::launch_pull(a, c::stream_of(stream)), "pull_rows kernel launch");
}

// A pull that a grouped GEMM launches beside itself (grouped_gemm's `pull`): into the GEMM's
// `a`, counting each minibatch of `minibatch_rows` rows in `arrivals` (uint32, at least
// ceil(rows / minibatch_rows) of them, which the GEMM zeroes first) on `ctas` CTAs, one an SM.
inline comm::PullArgs comm_overlapped_pull(uintptr_t src_table, uintptr_t peer_rank,
                                           uintptr_t peer_token_idx, uintptr_t num_tokens,
                                           int64_t rows, int64_t row_bytes, int64_t src_rows,
                                           int divisor, int ep, int ctas, bool zero_rest,
                                           uintptr_t src_direct, uintptr_t arrivals,
                                           int64_t minibatch_rows, uintptr_t status,
                                           uint64_t timeout_ns) {
  namespace c = comm_checks;
  comm::PullArgs a = pull_args(src_table, peer_rank, peer_token_idx, num_tokens, rows, row_bytes,
                               src_rows, divisor, ep, ctas, zero_rest, src_direct);
  c::address("arrivals", arrivals, 4);
  c::address("status", status, 4);
  c::at_least("minibatch_rows", minibatch_rows, 1);
  c::require(row_bytes % 16 == 0,
             "`row_bytes` must be a multiple of 16 for a pull beside a GEMM (bulk copies), got " +
                 std::to_string(row_bytes));
  a.arrivals.counts = reinterpret_cast<uint32_t*>(arrivals);
  a.arrivals.minibatch_rows = minibatch_rows;
  a.arrivals.minibatches = (rows + minibatch_rows - 1) / minibatch_rows;
  a.arrivals.status = reinterpret_cast<int*>(status);
  a.arrivals.timeout_ns = timeout_ns;
  return a;
}

// The MXFP8 forward's dispatch: pull_rows of a bf16 [src_rows, cols] source and the rounding of
// the pulled rows (mxfp8_quantize's `rounded` and transposed outputs) in one pass, without
// storing the pulled rows. Tiles at or past num_tokens write nothing. With `src_exponents`
// (EP 1: uint8 [src_rows]), `rounded` is f16 rebased per row and `row_exponents` uint8 [rows]
// gets each row's exponent byte (M_GROUPED_MXFP8_NT_F16_ROWS's operand).
inline void comm_pull_round(uintptr_t src_table, uintptr_t peer_rank, uintptr_t peer_token_idx,
                            uintptr_t num_tokens, int64_t rows, int64_t cols, int64_t src_rows,
                            int divisor, int ep, uintptr_t rounded, uintptr_t out_t,
                            uintptr_t scale_t, int ctas, uintptr_t stream,
                            uintptr_t src_exponents, uintptr_t row_exponents,
                            uintptr_t rounded_rows, uintptr_t row_scale, uintptr_t src_direct) {
  namespace c = comm_checks;
  c::group_size(ep);
  c::pull_source(src_table, src_direct, ep);
  const comm::ScheduleView view = c::schedule(peer_rank, peer_token_idx, num_tokens, rows);
  c::require(rows % mxfp8::kTile == 0 && cols > 0 && cols % mxfp8::kTile == 0,
             "`rows` and `cols` must be multiples of 128 (cols > 0), got " +
                 std::to_string(rows) + " and " + std::to_string(cols));
  c::require(rows / mxfp8::kTile * (cols / mxfp8::kTile) <= INT32_MAX,
             "too many 128x128 tiles for one launch: rows=" + std::to_string(rows) +
                 ", cols=" + std::to_string(cols));
  c::at_least("src_rows", src_rows, 0);
  c::at_least("divisor", divisor, 1);
  c::at_least("ctas", ctas, 0);
  c::address("rounded", rounded, 16);
  // Either the transposed pair (the forward) or the scaled rounded rows (the backward's d_out).
  c::require((rounded_rows == 0) == (row_scale == 0),
             "`rounded_rows` and `row_scale` must both be given or both be 0");
  c::require((rounded_rows == 0) != (out_t == 0 && scale_t == 0),
             "give the transposed pair (`out_t`, `scale_t`) or `rounded_rows` with `row_scale`, "
             "not both or neither");
  if (rounded_rows == 0) {
    c::address("out_t", out_t, 16);
    c::address("scale_t", scale_t, 16);
  } else {
    c::address("rounded_rows", rounded_rows, 16);
    c::address("row_scale", row_scale, 4);
    c::require(src_exponents == 0, "rebased rows (`src_exponents`) do not go with `rounded_rows`");
  }
  c::require((src_exponents == 0) == (row_exponents == 0),
             "`src_exponents` and `row_exponents` must both be given or both be 0");
  c::require(src_exponents == 0 || ep == 1,
             "rebased rows (`src_exponents`) need the local source (ep 1), got ep=" +
                 std::to_string(ep));
  mxfp8::QuantizeArgs args;
  args.row_exponents = reinterpret_cast<void*>(row_exponents);
  args.rounded = reinterpret_cast<void*>(rounded);
  args.out_t = reinterpret_cast<void*>(out_t);
  args.scale_t = reinterpret_cast<void*>(scale_t);
  args.rounded_rows = reinterpret_cast<void*>(rounded_rows);
  args.row_scale = reinterpret_cast<const float*>(row_scale);
  args.used_rows = view.num_tokens;
  args.rows = rows;
  args.cols = cols;
  mxfp8::GatherArgs gather;
  gather.src_table = reinterpret_cast<const uint64_t*>(src_table);
  gather.src_direct = reinterpret_cast<const void*>(src_direct);
  gather.peer_rank = view.peer_rank;
  gather.peer_token_idx = view.peer_token_idx;
  gather.src_rows = src_rows;
  gather.divisor = divisor;
  gather.ep = ep;
  gather.src_exponents = reinterpret_cast<const uint8_t*>(src_exponents);
  check_cuda(mxfp8::launch_gather_round(args, gather, ctas, c::stream_of(stream)),
             "pull_round kernel launch");
}

inline void comm_push_rows(uintptr_t rows_data, uintptr_t dst_table, uintptr_t peer_rank,
                           uintptr_t peer_token_idx, uintptr_t num_tokens, int64_t rows,
                           int64_t row_bytes, int64_t dst_rows, int ep, int ctas,
                           uintptr_t stream) {
  namespace c = comm_checks;
  c::group_size(ep);
  c::address("rows_data", rows_data, 4);
  c::address("dst_table", dst_table, 8);
  c::row_bytes(row_bytes);
  c::at_least("dst_rows", dst_rows, 0);
  c::at_least("ctas", ctas, 1);
  comm::PushArgs a;
  a.schedule = c::schedule(peer_rank, peer_token_idx, num_tokens, rows);
  a.rows = reinterpret_cast<const void*>(rows_data);
  a.dst_table = reinterpret_cast<const uint64_t*>(dst_table);
  a.row_bytes = row_bytes;
  a.dst_rows = dst_rows;
  a.ep = ep;
  a.ctas = ctas;
  check_cuda(comm::launch_push(a, c::stream_of(stream)), "push_rows kernel launch");
}

inline void comm_zero_unrouted(uintptr_t routing, uintptr_t dest, int64_t slots,
                               int64_t row_bytes, int ctas, uintptr_t stream) {
  namespace c = comm_checks;
  c::address("routing", routing, 4);
  c::address("dest", dest, 4);
  c::at_least("slots", slots, 0);
  c::row_bytes(row_bytes);
  c::at_least("ctas", ctas, 1);
  comm::ZeroUnroutedArgs a;
  a.routing = reinterpret_cast<const int32_t*>(routing);
  a.dest = reinterpret_cast<void*>(dest);
  a.slots = slots;
  a.row_bytes = row_bytes;
  a.ctas = ctas;
  check_cuda(comm::launch_zero_unrouted(a, c::stream_of(stream)), "zero_unrouted kernel launch");
}

inline void comm_epilogue(uintptr_t shared, uintptr_t routed, uintptr_t weights, uintptr_t out,
                          int64_t tokens, int64_t hidden, int topk, uintptr_t stream,
                          uintptr_t route_rows, int64_t routed_rows) {
  namespace c = comm_checks;
  c::at_least("tokens", tokens, 0);
  c::at_least("topk", topk, 1);
  c::require(hidden > 0 && hidden % 8 == 0,
             "`hidden` must be a positive multiple of 8, got " + std::to_string(hidden));
  c::require(tokens * (hidden / 8) < (int64_t{1} << 31),
             "tokens * hidden / 8 must be below 2^31, got " + std::to_string(tokens) + " x " +
                 std::to_string(hidden));
  if (shared != 0) c::address("shared", shared, 16);
  if (weights != 0) c::address("weights", weights, 4);
  c::address("routed", routed, 16);
  c::address("out", out, 16);
  if (route_rows != 0) {
    c::address("route_rows", route_rows, 4);
    c::at_least("routed_rows", routed_rows, 0);
  }
  comm::EpilogueArgs a;
  a.shared = reinterpret_cast<const void*>(shared);
  a.routed = reinterpret_cast<const void*>(routed);
  a.weights = reinterpret_cast<const float*>(weights);
  a.out = reinterpret_cast<void*>(out);
  a.tokens = tokens;
  a.hidden = hidden;
  a.topk = topk;
  a.route_rows = reinterpret_cast<const int32_t*>(route_rows);
  a.routed_rows = routed_rows;
  check_cuda(comm::launch_epilogue(a, c::stream_of(stream)), "epilogue kernel launch");
}

inline void bind_comm(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("comm_barrier", &comm_barrier, py::arg("flag_table"), py::arg("flags"), py::arg("epoch"),
        py::arg("status"), py::arg("rank"), py::arg("ep"), py::arg("timeout_ns"),
        py::arg("stream"), py::arg("tag") = 0u,
        "Device barrier over the group: signal every peer's flags[rank] with epoch+1, wait for "
        "this rank's flags to reach it (bounded: a timeout sets status bit 4), store the epoch. "
        "flags: uint32 [5 * ep] (epochs, two rows of tags, two of status words); a peer that "
        "signalled another nonzero `tag` at this barrier sets status bit 32, and every peer's "
        "status word is ORed into this rank's.");
  m.def("comm_all_gather", &comm_all_gather, py::arg("src"), py::arg("dst_table"),
        py::arg("bytes"), py::arg("rank"), py::arg("ep"), py::arg("stream"),
        py::arg("chunk_bytes") = 0,
        "Store `bytes` from src at offset rank*bytes of every rank's buffer (no barrier), each "
        "CTA `chunk_bytes` at a time (0: 32 KiB).");
  m.def("comm_pull_rows", &comm_pull_rows, py::arg("src_table"), py::arg("out"),
        py::arg("peer_rank"), py::arg("peer_token_idx"), py::arg("num_tokens"), py::arg("rows"),
        py::arg("row_bytes"), py::arg("src_rows"), py::arg("divisor"), py::arg("ep"),
        py::arg("ctas"), py::arg("zero_rest"), py::arg("stream"), py::arg("src_direct") = 0,
        "out[i] = rank peer_rank[i]'s source row peer_token_idx[i] // divisor; zero on padding "
        "rows, and on rows >= num_tokens when zero_rest (else left as they are; no barrier). "
        "src_direct (ep 1, 16-byte aligned): the local source itself, read instead of "
        "src_table[0].");
  py::class_<comm::PullArgs>(m, "OverlappedPull", py::module_local(),
                             "A pull for grouped_gemm's `pull` (comm_overlapped_pull).");
  m.def("comm_overlapped_pull", &comm_overlapped_pull, py::arg("src_table"),
        py::arg("peer_rank"), py::arg("peer_token_idx"), py::arg("num_tokens"), py::arg("rows"),
        py::arg("row_bytes"), py::arg("src_rows"), py::arg("divisor"), py::arg("ep"),
        py::arg("ctas"), py::arg("zero_rest"), py::arg("src_direct"), py::arg("arrivals"),
        py::arg("minibatch_rows"), py::arg("status"), py::arg("timeout_ns"),
        "comm_pull_rows's pull into a grouped GEMM's `a`, which grouped_gemm(pull=...) runs "
        "beside the GEMM on `ctas` CTAs, counting each minibatch_rows rows' arrival in "
        "`arrivals` (uint32 [ceil(rows / minibatch_rows)]); a wait for rows that gives up after "
        "timeout_ns sets the timeout bit in `status`.");
  m.def("comm_pull_round", &comm_pull_round, py::arg("src_table"), py::arg("peer_rank"),
        py::arg("peer_token_idx"), py::arg("num_tokens"), py::arg("rows"), py::arg("cols"),
        py::arg("src_rows"), py::arg("divisor"), py::arg("ep"), py::arg("rounded"),
        py::arg("out_t"), py::arg("scale_t"), py::arg("ctas"), py::arg("stream"),
        py::arg("src_exponents") = 0, py::arg("row_exponents") = 0, py::arg("rounded_rows") = 0,
        py::arg("row_scale") = 0, py::arg("src_direct") = 0,
        "comm_pull_rows of bf16 rows [rows, cols] and mxfp8_quantize's rounded values and "
        "transposed pair of the pulled rows in one pass (the pulled rows are not stored); "
        "128-row tiles at or past num_tokens write nothing; ctas 0: one CTA per tile (no "
        "barrier). With src_exponents (ep 1, uint8 [src_rows]): rounded is f16, each row times "
        "2^(127 - R) of its source row's byte R, and row_exponents (uint8 [rows]) gets R. With "
        "rounded_rows and row_scale (fp32 [rows]) instead of out_t and scale_t: rounded_rows "
        "gets mxfp8_round_rows of the pulled rows with that row_scale. src_direct as in "
        "comm_pull_rows.");
  m.def("comm_push_rows", &comm_push_rows, py::arg("rows_data"), py::arg("dst_table"),
        py::arg("peer_rank"), py::arg("peer_token_idx"), py::arg("num_tokens"), py::arg("rows"),
        py::arg("row_bytes"), py::arg("dst_rows"), py::arg("ep"), py::arg("ctas"),
        py::arg("stream"),
        "Rank peer_rank[i]'s destination row peer_token_idx[i] = rows_data[i]; padding rows are "
        "skipped (no barrier, no zero-fill).");
  m.def("comm_zero_unrouted", &comm_zero_unrouted, py::arg("routing"), py::arg("dest"),
        py::arg("slots"), py::arg("row_bytes"), py::arg("ctas"), py::arg("stream"),
        "dest[slot] = 0 (row_bytes each) where routing[slot] < 0: the rows of the routes "
        "nobody pushes (no barrier).");
  m.def("comm_epilogue", &comm_epilogue, py::arg("shared"), py::arg("routed"),
        py::arg("weights"), py::arg("out"), py::arg("tokens"), py::arg("hidden"),
        py::arg("topk"), py::arg("stream"), py::arg("route_rows") = 0,
        py::arg("routed_rows") = 0,
        "out[t] = bf16(shared[t] + sum_j w[t,j] * routed[t*topk+j]) in fp32, j in order; "
        "shared and weights may be 0 (absent). With route_rows (int32 [tokens*topk]) routed "
        "holds routed_rows rows read in place: route r's is row route_rows[r], zero where -1.");
}

}  // namespace mok::api
