// A schedule row's entry as the copy kernels read it: which rows are live, and which source row
// (if any) an entry names. Shared by the thread-team copies (pull_push.cu) and the bulk pull
// beside a GEMM (arrival_pull.cu).
#pragma once

#include <cstdint>

#include "comm/comm.h"

namespace mok::comm::detail {

// Rows at or past num_tokens are padding (num_tokens clamped to [0, rows]).
__device__ __forceinline__ int64_t live_rows(const ScheduleView& s) {
  const int64_t n = *s.num_tokens;
  return n < 0 ? 0 : (n < s.rows ? n : s.rows);
}

// A schedule row's entry as stored: the source rank and the index into its buffer (before the
// divisor); rank -1 for padding.
struct RawEntry {
  int rank;
  int32_t idx;
};

__device__ __forceinline__ RawEntry raw_entry(const ScheduleView& s, int64_t row, int64_t live) {
  if (row >= live) return {-1, -1};
  return {s.peer_rank[row], s.peer_token_idx[row]};
}

// The row of `e` in a [limit, ...] buffer, or false for an entry that carries nothing: padding,
// or an entry outside the group or the buffer (which a valid schedule never holds; skipping it
// keeps a corrupt schedule from touching memory it does not own).
__device__ __forceinline__ bool valid_entry(RawEntry e, int ep, int divisor, int64_t limit,
                                            int64_t* index) {
  if (e.rank < 0 || e.rank >= ep || e.idx < 0) return false;
  *index = e.idx / divisor;
  return *index < limit;
}

// The start of the source row a pull copies into schedule row `e`'s place (`index` from
// valid_entry): the caller's own source at EP 1, else the rank's buffer.
__device__ __forceinline__ const uint8_t* pull_source_row(const PullArgs& a, RawEntry e,
                                                          int64_t index) {
  const uint8_t* src = a.src_direct != nullptr
                           ? static_cast<const uint8_t*>(a.src_direct)
                           : reinterpret_cast<const uint8_t*>(a.src_table[e.rank]);
  return src + index * a.row_bytes;
}

}  // namespace mok::comm::detail
