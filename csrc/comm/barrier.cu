// The group's barrier (one CTA, epoch-tagged flag words: common/flags.cuh) and the routing
// all-gather. comm.h says how the barriers bracket the copy kernels.
#include "comm/comm.h"
#include "common/flags.cuh"

#include <algorithm>
#include <cstdint>

namespace mok::comm {
// A named namespace, not an anonymous one: nvcc derives anonymous-namespace symbol names from the
// source file's absolute path, which would make the binary depend on where it was built.
namespace detail {

constexpr int kBarrierThreads = 128;  // >= kMaxRanks: one thread per peer, no loop in practice
constexpr int kGatherThreads = 256;
constexpr int kMaxGatherCtasPerPeer = 64;
constexpr int64_t kDefaultGatherChunkBytes = int64_t{kGatherThreads} * 8 * 16;

// One CTA. Thread p signals peer p, then waits for peer p's signal; the epoch counter is read
// before and written after, by thread 0, so every thread uses the same epoch and the next barrier
// (next kernel in the stream) uses the one after it. With the epoch each rank leaves its tag and
// its status word in the peer's rows of the epoch's parity, before the release that signals the
// epoch: a peer at most one barrier ahead writes the other parity's rows, so the rows read after
// the acquire hold this very barrier's. Ranks at the same barrier with other tags (0: untagged)
// ran other code: the status word says so instead of their exchanges mixing silently. Each rank
// ORs its peers' status words into its own, so what one rank recorded before a barrier is every
// rank's verdict after it.
__global__ void __launch_bounds__(kBarrierThreads) barrier_kernel(BarrierArgs a) {
  __shared__ uint32_t s_epoch;
  __shared__ int s_status;
  if (threadIdx.x == 0) {
    s_epoch = *a.epoch + 1;
    s_status = *reinterpret_cast<volatile int*>(a.status);
  }
  __syncthreads();
  const uint32_t epoch = s_epoch;
  const int parity = static_cast<int>(epoch & 1u);
  const int tag_row = a.ep * (1 + parity);
  const int status_row = a.ep * (3 + parity);
  for (int peer = threadIdx.x; peer < a.ep; peer += blockDim.x) {
    if (peer == a.rank) continue;
    uint32_t* peer_flags = reinterpret_cast<uint32_t*>(a.flag_table[peer]);
    *reinterpret_cast<volatile uint32_t*>(peer_flags + tag_row + a.rank) = a.tag;
    *reinterpret_cast<volatile uint32_t*>(peer_flags + status_row + a.rank) = s_status;
    // Belt and braces: the kernels before this one in the stream fenced their own peer stores;
    // this fence also covers writes this thread merely observed.
    system_fence();
    signal_flag(peer_flags + a.rank, epoch);
  }
  for (int peer = threadIdx.x; peer < a.ep; peer += blockDim.x) {
    if (peer == a.rank || !wait_flag(a.flags + peer, epoch, a.timeout_ns, a.status)) continue;
    const uint32_t theirs = *reinterpret_cast<volatile uint32_t*>(a.flags + tag_row + peer);
    if (a.tag != 0u && theirs != 0u && theirs != a.tag) atomicOr(a.status, kStatusOutOfStep);
    const uint32_t peer_status = *reinterpret_cast<volatile uint32_t*>(a.flags + status_row + peer);
    if (peer_status != 0u) atomicOr(a.status, static_cast<int>(peer_status));
  }
  __syncthreads();
  // A timed-out wait still advances the epoch: every rank counts the same barriers, so the
  // ranks stay in step for later calls (the status word already holds the error).
  if (threadIdx.x == 0) *a.epoch = epoch;
}

// Grid (ctas_per_peer, ep): blockIdx.y picks the destination, staggered by rank so that the
// ranks do not all write to the same peer at once; the last one is this rank itself. CTA x
// copies chunks x, x + gridDim.x, ... of `chunk_vecs` vectors each.
template <typename V>
__global__ void __launch_bounds__(kGatherThreads) all_gather_kernel(AllGatherArgs a,
                                                                    int64_t chunk_vecs) {
  const int dst_rank = (a.rank + 1 + static_cast<int>(blockIdx.y)) % a.ep;
  const int64_t vecs = a.bytes / static_cast<int64_t>(sizeof(V));
  const V* src = static_cast<const V*>(a.src);
  V* dst = reinterpret_cast<V*>(a.dst_table[dst_rank] + a.rank * a.bytes);
  for (int64_t first = blockIdx.x * chunk_vecs; first < vecs; first += gridDim.x * chunk_vecs) {
    const int64_t end = first + chunk_vecs < vecs ? first + chunk_vecs : vecs;
    for (int64_t i = first + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
  }
  system_fence();
}

}  // namespace detail

cudaError_t launch_barrier(const BarrierArgs& args, cudaStream_t stream) {
  detail::barrier_kernel<<<1, detail::kBarrierThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_all_gather(const AllGatherArgs& args, cudaStream_t stream) {
  if (args.bytes == 0) return cudaSuccess;
  const bool wide = args.bytes % 16 == 0 && reinterpret_cast<uintptr_t>(args.src) % 16 == 0;
  const int64_t vec_bytes = wide ? 16 : 4;
  const int64_t chunk = args.chunk_bytes > 0 ? args.chunk_bytes : detail::kDefaultGatherChunkBytes;
  const int64_t chunk_vecs = chunk / vec_bytes;  // chunk is a multiple of 16
  const int64_t chunks = (args.bytes / vec_bytes + chunk_vecs - 1) / chunk_vecs;
  const int64_t ctas = std::min<int64_t>(chunks, detail::kMaxGatherCtasPerPeer);
  const int threads = static_cast<int>(std::min<int64_t>(chunk_vecs, detail::kGatherThreads));
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(args.ep));
  if (wide) {
    detail::all_gather_kernel<uint4><<<grid, threads, 0, stream>>>(args, chunk_vecs);
  } else {
    detail::all_gather_kernel<uint32_t><<<grid, threads, 0, stream>>>(args, chunk_vecs);
  }
  return cudaGetLastError();
}

}  // namespace mok::comm
