// The dispatch pull, the combine push and the clearing of a push destination's unrouted rows:
// row copies through peer pointers by thread teams (common/row_copy.cuh). comm.h says how the
// barriers bracket them.
#include "comm/comm.h"
#include "comm/schedule_rows.cuh"
#include "common/flags.cuh"
#include "common/row_copy.cuh"

#include <algorithm>
#include <cstdint>

namespace mok::comm {
// A named namespace, not an anonymous one: nvcc derives anonymous-namespace symbol names from the
// source file's absolute path, which would make the binary depend on where it was built.
namespace detail {

// Vectors [first, first + count) of schedule row `row` (entry `e`): the source's, or zeros.
template <typename V>
__device__ __forceinline__ void pull_slice(const PullArgs& a, int64_t row, int64_t first,
                                           int64_t count, RawEntry e, const Team& team) {
  V* dst = reinterpret_cast<V*>(static_cast<uint8_t*>(a.out) + row * a.row_bytes) + first;
  int64_t index;
  if (valid_entry(e, a.ep, a.divisor, a.src_rows, &index)) {
    copy_row(dst, reinterpret_cast<const V*>(pull_source_row(a, e, index)) + first, count, team);
  } else {
    zero_row(dst, count, team);
  }
}

// Column slices outermost (a slice is one batch of loads of the team): every row's slice before
// the next slice. A source row is read by up to `divisor` routed rows spread over the whole
// schedule; slice by slice, the source bytes in use at once are one slice of every source row
// (a few MB, held in L2 between their reads) instead of whole rows (all of x, which the pass's
// stores evict from L2 before their next reads; docs/exchanges.md, pulls). A team's rows are the
// same in every slice, and the next row's entry is loaded during this row's copy, so the slices
// add no schedule lookups to wait for (loaded with each copy, they made the pull slower).
template <typename V>
__global__ void __launch_bounds__(kCopyThreads) pull_kernel(PullArgs a, int lane_shift) {
  const Team team = grid_team(lane_shift);
  const int64_t vecs = a.row_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t slice_vecs = static_cast<int64_t>(team.lanes) * kCopyUnroll;
  const int64_t live = live_rows(a.schedule);
  const int64_t end = a.zero_rest ? a.schedule.rows : live;
  const RawEntry first_entry = raw_entry(a.schedule, team.index, live);
  for (int64_t first = 0; first < vecs; first += slice_vecs) {
    const int64_t count = vecs - first < slice_vecs ? vecs - first : slice_vecs;
    RawEntry entry = first_entry;
    for (int64_t row = team.index; row < end; row += team.count) {
      const RawEntry next = raw_entry(a.schedule, row + team.count, live);
      pull_slice<V>(a, row, first, count, entry, team);
      entry = next;
    }
  }
}

template <typename V>
__global__ void __launch_bounds__(kCopyThreads) push_kernel(PushArgs a, int lane_shift) {
  const Team team = grid_team(lane_shift);
  const int64_t vecs = a.row_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t live = live_rows(a.schedule);
  for (int64_t row = team.index; row < a.schedule.rows; row += team.count) {
    const RawEntry e = raw_entry(a.schedule, row, live);
    int64_t index;
    if (!valid_entry(e, a.ep, 1, a.dst_rows, &index)) continue;
    uint8_t* dst = reinterpret_cast<uint8_t*>(a.dst_table[e.rank]) + index * a.row_bytes;
    const uint8_t* src = static_cast<const uint8_t*>(a.rows) + row * a.row_bytes;
    copy_row(reinterpret_cast<V*>(dst), reinterpret_cast<const V*>(src), vecs, team);
  }
  system_fence();
}

template <typename V>
__global__ void __launch_bounds__(kCopyThreads) zero_unrouted_kernel(ZeroUnroutedArgs a,
                                                                     int lane_shift) {
  const Team team = grid_team(lane_shift);
  const int64_t vecs = a.row_bytes / static_cast<int64_t>(sizeof(V));
  for (int64_t slot = team.index; slot < a.slots; slot += team.count) {
    if (a.routing[slot] >= 0) continue;
    zero_row(reinterpret_cast<V*>(static_cast<uint8_t*>(a.dest) + slot * a.row_bytes), vecs, team);
  }
}

// The widest vector (16, 8 or 4 bytes) that divides the row and keeps the local buffer aligned.
// Peer tables hold 16-byte aligned addresses (checked where they are built), so the row size and
// the local address decide.
inline int vector_bytes(int64_t row_bytes, const void* local) {
  const auto address = reinterpret_cast<uintptr_t>(local);
  for (int width : {16, 8}) {
    if (row_bytes % width == 0 && address % width == 0) return width;
  }
  return 4;
}

// Lanes per team: a warp for rows of 32+ vectors, else the next power of two above the count.
inline int lane_shift_for(int64_t vecs) {
  int shift = 0;
  while (shift < 5 && (int64_t{1} << shift) < vecs) ++shift;
  return shift;
}

template <typename V>
void launch_typed(const PullArgs& a, dim3 grid, int shift, cudaStream_t stream) {
  pull_kernel<V><<<grid, kCopyThreads, 0, stream>>>(a, shift);
}

template <typename V>
void launch_typed(const PushArgs& a, dim3 grid, int shift, cudaStream_t stream) {
  push_kernel<V><<<grid, kCopyThreads, 0, stream>>>(a, shift);
}

template <typename V>
void launch_typed(const ZeroUnroutedArgs& a, dim3 grid, int shift, cudaStream_t stream) {
  zero_unrouted_kernel<V><<<grid, kCopyThreads, 0, stream>>>(a, shift);
}

// Picks the vector type for the row size and alignment, then launches `ctas` CTAs over `rows`.
template <typename Args>
cudaError_t launch_rows(const Args& a, int64_t rows, const void* local, cudaStream_t stream) {
  if (rows == 0 || a.row_bytes == 0) return cudaSuccess;
  const int width = vector_bytes(a.row_bytes, local);
  const int shift = lane_shift_for(a.row_bytes / width);
  const dim3 grid(static_cast<unsigned>(std::max(a.ctas, 1)));
  if (width == 16) {
    launch_typed<uint4>(a, grid, shift, stream);
  } else if (width == 8) {
    launch_typed<uint2>(a, grid, shift, stream);
  } else {
    launch_typed<uint32_t>(a, grid, shift, stream);
  }
  return cudaGetLastError();
}

}  // namespace detail

cudaError_t launch_pull(const PullArgs& args, cudaStream_t stream) {
  if (args.arrivals.counts != nullptr) return launch_arrival_pull(args, stream);
  return detail::launch_rows(args, args.schedule.rows, args.out, stream);
}

cudaError_t launch_push(const PushArgs& args, cudaStream_t stream) {
  return detail::launch_rows(args, args.schedule.rows, args.rows, stream);
}

cudaError_t launch_zero_unrouted(const ZeroUnroutedArgs& args, cudaStream_t stream) {
  return detail::launch_rows(args, args.slots, args.dest, stream);
}

}  // namespace mok::comm
