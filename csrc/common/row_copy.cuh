// Row copies between local and peer memory in 16-byte (or narrower) vectors, by thread teams.
//
// A team of `lanes` consecutive threads (a power of two, at most a warp) moves one row at a time:
// a warp per row for wide rows, so each load instruction of the warp covers 512 contiguous bytes;
// narrower teams (down to one thread) for rows of a few vectors, so no lane idles. Each lane keeps
// kCopyUnroll loads in flight before it stores: NVLink has microseconds of latency, and only many
// outstanding requests per SM reach its bandwidth. The same functions serve local<-peer (pull) and
// peer<-local (push): a peer address from symmetric memory is an ordinary global pointer.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

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

// bf16(scale * v) for each bf16 of the 4-byte word (each product rounded once, to nearest
// even, as mok::experts' scale_rows rounds it).
__device__ __forceinline__ uint32_t scale_bf16_pair(uint32_t word, float scale) {
  __nv_bfloat162 pair;
  memcpy(&pair, &word, sizeof(word));
  pair = __floats2bfloat162_rn(__fmul_rn(scale, __low2float(pair)),
                               __fmul_rn(scale, __high2float(pair)));
  memcpy(&word, &pair, sizeof(word));
  return word;
}

__device__ __forceinline__ uint32_t scale_bf16(uint32_t v, float s) { return scale_bf16_pair(v, s); }
__device__ __forceinline__ uint2 scale_bf16(uint2 v, float s) {
  return make_uint2(scale_bf16_pair(v.x, s), scale_bf16_pair(v.y, s));
}
__device__ __forceinline__ uint4 scale_bf16(uint4 v, float s) {
  return make_uint4(scale_bf16_pair(v.x, s), scale_bf16_pair(v.y, s), scale_bf16_pair(v.z, s),
                    scale_bf16_pair(v.w, s));
}

// dst[i] = src[i] for i < vecs, split over the team's lanes. With kScaled the row is bf16 and
// also goes to scaled_dst multiplied by `scale`: one read of the (remote) source for both.
template <typename V, bool kScaled = false>
__device__ __forceinline__ void copy_row(V* dst, const V* src, int64_t vecs, const Team& team,
                                         V* scaled_dst = nullptr, float scale = 1.0f) {
  const int64_t step = team.lanes;
  int64_t i = team.lane;
  for (; i + (kCopyUnroll - 1) * step < vecs; i += kCopyUnroll * step) {
    V v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) v[u] = src[i + u * step];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) dst[i + u * step] = v[u];
    if constexpr (kScaled) {
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) scaled_dst[i + u * step] = scale_bf16(v[u], scale);
    }
  }
  for (; i < vecs; i += step) {
    const V v = src[i];
    dst[i] = v;
    if constexpr (kScaled) scaled_dst[i] = scale_bf16(v, scale);
  }
}

// dst[i] = 0 for i < vecs, split over the team's lanes.
template <typename V>
__device__ __forceinline__ void zero_row(V* dst, int64_t vecs, const Team& team) {
  const V zero{};
  for (int64_t i = team.lane; i < vecs; i += team.lanes) dst[i] = zero;
}

}  // namespace mok::comm
