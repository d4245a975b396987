// Row copies between local and peer memory in 16-byte (or narrower) vectors, by thread teams.
//
// A team of `lanes` consecutive threads (a power of two, at most a warp) moves one row at a time:
// a warp per row for wide rows, so each load instruction of the warp covers 512 contiguous bytes;
// narrower teams (down to one thread) for rows of a few vectors, so no lane idles. Each lane keeps
// kCopyUnroll loads in flight before it stores: a peer load's latency is long, and only many
// outstanding requests per SM reach NVLink's bandwidth. The same functions serve local<-peer
// (pull) and peer<-local (push): a peer address from symmetric memory is an ordinary global
// pointer.
#pragma once

#include <cstdint>

namespace mok::comm {

constexpr int kCopyUnroll = 4;

// This thread's place in the grid's teams.
struct Team {
  int lane;       // [0, lanes)
  int lanes;      // threads per team: a power of two, at most 32
  int64_t index;  // this team's index
  int64_t count;  // teams in the grid
};

// `lane_shift` = log2(lanes); blockDim.x must be a multiple of 32.
__device__ __forceinline__ Team grid_team(int lane_shift) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Team team;
  team.lanes = 1 << lane_shift;
  team.lane = static_cast<int>(threadIdx.x) & (team.lanes - 1);
  team.index = thread >> lane_shift;
  team.count = threads >> lane_shift;
  return team;
}

// dst[i] = src[i] for i < vecs, split over the team's lanes.
template <typename V>
__device__ __forceinline__ void copy_row(V* dst, const V* src, int64_t vecs, const Team& team) {
  const int64_t step = team.lanes;
  int64_t i = team.lane;
  for (; i + (kCopyUnroll - 1) * step < vecs; i += kCopyUnroll * step) {
    V v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) v[u] = src[i + u * step];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) dst[i + u * step] = v[u];
  }
  for (; i < vecs; i += step) dst[i] = src[i];
}

// dst[i] = 0 for i < vecs, split over the team's lanes.
template <typename V>
__device__ __forceinline__ void zero_row(V* dst, int64_t vecs, const Team& team) {
  const V zero{};
  for (int64_t i = team.lane; i < vecs; i += team.lanes) dst[i] = zero;
}

}  // namespace mok::comm
