// The routed-row schedule on the GPU: a stable counting sort of every source's routes by local
// expert, then each route's row from a closed form of the round-robin order. No atomics decide an
// order (shared atomics only count), so the result is the same bits on every run, and nothing is
// read back to the host, so the whole call can live in a CUDA graph.
//
// Stream order of one call (schedule.h has the plan and the scratch layout):
//   count_kernel    block (chunk, src): hist[src][chunk][e] = routes of the chunk to local e;
//                   grid-stride, peer_rank, peer_token_idx (and route_rows) := -1 (every row
//                   not written below is padding: here, not in three memsets, so the host makes
//                   three calls fewer before the first GEMM); from int64 ids at EP 1 it also
//                   writes the routing (the int32 ids, -1 for an invalid one)
//   columns_kernel  thread (src, e): hist := exclusive scan over chunks; count[e][src] = total
//   segment_kernel  one block: segment starts (padded to 256 rows), tokens_per_expert, num_tokens
//                   (columns_segment_kernel: both in one block, where EP * E fits in it)
//   place_kernel    block (chunk, src): each route's ordinal j within its (src, e), its row
//                   seg_start[e] + sum_s min(count[e][s], j) + #{s < src : count[e][s] > j}
//                   (the whole rounds before j, then the sources before src in round j), and the
//                   two stores (a third, route_rows, for the routes of `rank` itself when asked),
//                   or the overflow bit when the row is past the capacity.
#include "schedule/schedule.h"

#include <cstdint>

namespace mok::schedule {
// A named namespace, not an anonymous one: nvcc derives anonymous-namespace symbol names from the
// source file's absolute path, which would make the binary depend on where it was built.
namespace detail {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kColumnBatch = 8;  // chunk loads a columns thread issues before it scans them

struct Params {
  const int32_t* topk_all;
  int32_t* peer_rank;
  int32_t* peer_token_idx;
  int32_t* num_tokens;
  int32_t* tokens_per_expert;
  int32_t* status;
  int64_t* seg_start;
  int32_t* count;
  int32_t* hist;
  int32_t* route_rows;  // or null
  const int64_t* ids;   // or null: count_kernel's keys come from these, see schedule.h
  int64_t routes;
  int64_t chunk;
  int64_t chunks;
  int64_t capacity;
  int64_t first_expert;  // rank * experts: the global id of local expert 0
  int rank;
  int ep;
  int experts;
};

// The local expert of one route of `src`, or -1 for another rank's expert, an id out of any
// range, and the lanes past the last route: -1 is never counted nor placed.
__device__ __forceinline__ int local_key(const Params& p, int src, int64_t route) {
  if (route >= p.routes) return -1;
  const int64_t id = __ldg(p.topk_all + src * p.routes + route);
  const int64_t local = id - p.first_expert;  // 64-bit: ids span the whole int32 range
  return (local >= 0 && local < p.experts) ? static_cast<int>(local) : -1;
}

// Route of lane 0, step 0 of `warp`: a block's chunk is its warps' 512-route pieces in order.
__device__ __forceinline__ int64_t piece_start(const Params& p, int warp) {
  return static_cast<int64_t>(blockIdx.x) * p.chunk + static_cast<int64_t>(warp) * kSteps * kLanes;
}

// keys[step] = local key of route piece_start + step * 32 + lane (coalesced 128-byte rows).
__device__ __forceinline__ void load_keys(const Params& p, int src, int warp, int lane,
                                          int (&keys)[kSteps]) {
  const int64_t first = piece_start(p, warp) + lane;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) keys[step] = local_key(p, src, first + step * kLanes);
}

// counters[key] += lanes holding `key`, with one shared atomic per distinct key (the group's
// lowest lane): skewed routing would otherwise put 32 atomics of a warp on one address.
__device__ __forceinline__ void add_warp_counts(int key, int lane, int* counters) {
  const unsigned peers = __match_any_sync(kFullMask, key);
  if (key >= 0 && __ffs(peers) - 1 == lane) atomicAdd(counters + key, __popc(peers));
}

// -1 into every row and route slot before place_kernel writes the placed ones.
__device__ void fill_padding(const Params& p) {
  const int64_t threads = static_cast<int64_t>(gridDim.x) * gridDim.y * blockDim.x;
  const int64_t first =
      (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < p.capacity; i += threads) {
    p.peer_rank[i] = -1;
    p.peer_token_idx[i] = -1;
  }
  if (p.route_rows == nullptr) return;
  for (int64_t i = first; i < p.routes; i += threads) p.route_rows[i] = -1;
}

// The routing of one id, as `routing` defines it: the id, or -1 outside [0, num_experts).
__device__ __forceinline__ int32_t routed_id(int64_t id, int64_t num_experts) {
  return id >= 0 && id < num_experts ? static_cast<int32_t>(id) : -1;
}

// ORs kInvalidExpertId into the status word if any thread of the block saw an invalid id: one
// atomic per block, and OR is order-free, so the word is deterministic. Every thread calls it.
__device__ __forceinline__ void report_invalid_ids(bool invalid, int32_t* status) {
  if (__syncthreads_or(invalid) && threadIdx.x == 0) atomicOr(status, kInvalidExpertId);
}

// load_keys from the int64 ids (EP 1: every expert is local, and local = global id), writing
// each route's int32 routing where place_kernel will read its key; true if an id was invalid.
__device__ __forceinline__ bool load_id_keys(const Params& p, int warp, int lane,
                                             int (&keys)[kSteps]) {
  const int64_t first = piece_start(p, warp) + lane;
  int32_t* routing = const_cast<int32_t*>(p.topk_all);
  bool invalid = false;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int64_t route = first + step * kLanes;
    keys[step] = -1;
    if (route >= p.routes) continue;
    keys[step] = routed_id(__ldg(p.ids + route), p.experts);
    invalid |= keys[step] < 0;
    routing[route] = keys[step];
  }
  return invalid;
}

__global__ void count_kernel(const Params p) {
  extern __shared__ int s_hist[];  // [experts]
  fill_padding(p);
  const int src = blockIdx.y;
  const int warp = threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) s_hist[e] = 0;
  __syncthreads();
  int keys[kSteps];
  bool invalid = false;
  if (p.ids != nullptr) {
    invalid = load_id_keys(p, warp, lane, keys);
  } else {
    load_keys(p, src, warp, lane, keys);
  }
#pragma unroll
  for (int step = 0; step < kSteps; ++step) add_warp_counts(keys[step], lane, s_hist);
  report_invalid_ids(invalid, p.status);  // also the barrier before s_hist is read
  int32_t* out = p.hist + (static_cast<int64_t>(src) * p.chunks + blockIdx.x) * p.experts;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) out[e] = s_hist[e];
}

// Column (src, e) of hist: chunk counts -> exclusive prefix, in chunk order; count[e][src] =
// total. Loads go out kColumnBatch at a time before the dependent sum so they overlap.
__device__ __forceinline__ void scan_column(const Params& p, int64_t column) {
  const int src = static_cast<int>(column / p.experts);
  const int e = static_cast<int>(column % p.experts);
  int32_t* cell = p.hist + static_cast<int64_t>(src) * p.chunks * p.experts + e;
  int32_t total = 0;
  for (int64_t c0 = 0; c0 < p.chunks; c0 += kColumnBatch) {
    int32_t v[kColumnBatch];
#pragma unroll
    for (int i = 0; i < kColumnBatch; ++i) {
      v[i] = c0 + i < p.chunks ? cell[(c0 + i) * p.experts] : 0;
    }
#pragma unroll
    for (int i = 0; i < kColumnBatch; ++i) {
      if (c0 + i < p.chunks) cell[(c0 + i) * p.experts] = total;
      total += v[i];
    }
  }
  p.count[static_cast<int64_t>(e) * p.ep + src] = total;
}

// One thread per column.
__global__ void __launch_bounds__(kColumnThreads) columns_kernel(const Params p) {
  const int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column < static_cast<int64_t>(p.ep) * p.experts) scan_column(p, column);
}

// Rows of local expert e's segment: its routes from every source, rounded up to 256.
__device__ __forceinline__ int64_t padded_rows(const Params& p, int e) {
  const int32_t* counts = p.count + static_cast<int64_t>(e) * p.ep;
  int64_t rows = 0;
  for (int s = 0; s < p.ep; ++s) rows += counts[s];
  return (rows + kRowsPerSegment - 1) / kRowsPerSegment * kRowsPerSegment;
}

// Exclusive prefix sum of `value` over the block (kSegmentThreads = 32 warps of 32), in thread
// order; `total` gets the block's sum.
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t value, int64_t& total) {
  constexpr int kWarps = kSegmentThreads / kLanes;
  static_assert(kWarps <= kLanes, "one warp scans the warp totals");
  __shared__ int64_t s_warp[kWarps];
  const int warp = threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  int64_t inclusive = value;
#pragma unroll
  for (int d = 1; d < kLanes; d <<= 1) {
    const int64_t up = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == kLanes - 1) s_warp[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int64_t sum = lane < kWarps ? s_warp[lane] : 0;
#pragma unroll
    for (int d = 1; d < kLanes; d <<= 1) {
      const int64_t up = __shfl_up_sync(kFullMask, sum, d);
      if (lane >= d) sum += up;
    }
    if (lane < kWarps) s_warp[lane] = sum;
  }
  __syncthreads();
  total = s_warp[kWarps - 1];
  return (warp == 0 ? 0 : s_warp[warp - 1]) + inclusive - value;
}

// Thread t owns experts [t * per, (t + 1) * per): their padded sizes, one block-wide scan, then
// the starts. Rows past the capacity are cut exactly as the reference cuts them.
__device__ __forceinline__ void lay_out_segments(const Params& p) {
  const int per = (p.experts + kSegmentThreads - 1) / kSegmentThreads;
  const int first = static_cast<int>(threadIdx.x) * per;
  const int last = min(first + per, p.experts);
  int64_t owned = 0;
  for (int e = first; e < last; ++e) owned += padded_rows(p, e);
  int64_t total = 0;
  int64_t row = block_exclusive_scan(owned, total);
  for (int e = first; e < last; ++e) {
    const int64_t rows = padded_rows(p, e);
    p.seg_start[e] = row;
    const int64_t kept = min(row + rows, p.capacity) - min(row, p.capacity);
    p.tokens_per_expert[e] = static_cast<int32_t>(kept);
    row += rows;
  }
  if (threadIdx.x == 0) *p.num_tokens = static_cast<int32_t>(min(total, p.capacity));
}

__global__ void __launch_bounds__(kSegmentThreads) segment_kernel(const Params p) {
  lay_out_segments(p);
}

// Both steps in one block (ep * experts <= kSegmentThreads): the barrier makes every thread's
// count stores visible to the block before the segments read them.
__global__ void __launch_bounds__(kSegmentThreads) columns_segment_kernel(const Params p) {
  if (threadIdx.x < static_cast<int64_t>(p.ep) * p.experts) scan_column(p, threadIdx.x);
  __syncthreads();
  lay_out_segments(p);
}

// Stores route `route` of `src`, the `ordinal`-th of its (src, key), at its row; false when the
// row is past the capacity (the route is dropped and reported).
__device__ __forceinline__ bool place(const Params& p, int src, int key, int32_t ordinal,
                                      int64_t route) {
  const int32_t* counts = p.count + static_cast<int64_t>(key) * p.ep;
  int64_t position = 0;
  for (int s = 0; s < p.ep; ++s) {
    const int32_t c = __ldg(counts + s);
    position += min(c, ordinal) + (s < src && c > ordinal ? 1 : 0);
  }
  const int64_t row = p.seg_start[key] + position;
  if (row >= p.capacity) return false;
  p.peer_rank[row] = src;
  p.peer_token_idx[row] = static_cast<int32_t>(route);
  if (p.route_rows != nullptr && src == p.rank) p.route_rows[route] = static_cast<int32_t>(row);
  return true;
}

// Pass 1 counts each warp's piece into the warp's own shared row; the block turns the rows into
// first ordinals (chunk base + earlier warps' counts); pass 2 walks the piece in route order.
__global__ void place_kernel(const Params p) {
  extern __shared__ int s_next[];  // [warps][experts]: the next ordinal per warp and expert
  const int src = blockIdx.y;
  const int warps = blockDim.x / kLanes;
  const int warp = threadIdx.x / kLanes;
  const int lane = threadIdx.x % kLanes;
  int* next = s_next + warp * p.experts;
  for (int i = threadIdx.x; i < warps * p.experts; i += blockDim.x) s_next[i] = 0;
  __syncthreads();
  int keys[kSteps];
  load_keys(p, src, warp, lane, keys);
#pragma unroll
  for (int step = 0; step < kSteps; ++step) add_warp_counts(keys[step], lane, next);
  __syncthreads();

  const int32_t* base = p.hist + (static_cast<int64_t>(src) * p.chunks + blockIdx.x) * p.experts;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) {
    int32_t ordinal = base[e];
    for (int w = 0; w < warps; ++w) {
      const int32_t routes = s_next[w * p.experts + e];
      s_next[w * p.experts + e] = ordinal;
      ordinal += routes;
    }
  }
  __syncthreads();

  const unsigned lanes_below = (1u << lane) - 1u;
  const int64_t first = piece_start(p, warp) + lane;
  bool overflow = false;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int key = keys[step];
    const unsigned peers = __match_any_sync(kFullMask, key);
    const int32_t ordinal = key >= 0 ? next[key] + __popc(peers & lanes_below) : 0;
    __syncwarp();  // every lane has read next[key] before the group's leader advances it
    if (key >= 0 && __ffs(peers) - 1 == lane) next[key] += __popc(peers);
    __syncwarp();
    if (key >= 0) overflow |= !place(p, src, key, ordinal, first + step * kLanes);
  }
  // An integer OR of one constant: the word's final value does not depend on which block wins.
  if (__syncthreads_or(overflow) && threadIdx.x == 0) atomicOr(p.status, kCapacityOverflow);
}

Params make_params(const Args& a, const Plan& plan) {
  const Layout layout = make_layout(a.ep, a.routes, a.experts);
  char* scratch = static_cast<char*>(a.workspace);
  Params p;
  p.topk_all = a.topk_all;
  p.peer_rank = a.peer_rank;
  p.peer_token_idx = a.peer_token_idx;
  p.num_tokens = a.num_tokens;
  p.tokens_per_expert = a.tokens_per_expert;
  p.status = a.status;
  p.seg_start = reinterpret_cast<int64_t*>(scratch + layout.seg_start);
  p.count = reinterpret_cast<int32_t*>(scratch + layout.count);
  p.hist = reinterpret_cast<int32_t*>(scratch + layout.hist);
  p.routes = a.routes;
  p.chunk = plan.chunk;
  p.chunks = plan.chunks;
  p.capacity = a.capacity;
  p.first_expert = a.rank * a.experts;
  p.rank = static_cast<int>(a.rank);
  p.route_rows = a.route_rows;
  p.ids = a.ids;
  p.ep = static_cast<int>(a.ep);
  p.experts = static_cast<int>(a.experts);
  return p;
}

__global__ void __launch_bounds__(kRoutingThreads)
    routing_kernel(const int64_t* ids, int32_t* routing, int64_t routes, int64_t num_experts,
                   int32_t* status) {
  const int64_t route = static_cast<int64_t>(blockIdx.x) * kRoutingThreads + threadIdx.x;
  bool invalid = false;
  if (route < routes) {
    const int32_t routed = routed_id(ids[route], num_experts);
    routing[route] = routed;
    invalid = routed < 0;
  }
  report_invalid_ids(invalid, status);
}

}  // namespace detail

cudaError_t launch_routing(const int64_t* ids, int32_t* routing, int64_t routes,
                           int64_t num_experts, int32_t* status, cudaStream_t stream) {
  if (routes == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((routes + kRoutingThreads - 1) / kRoutingThreads);
  detail::routing_kernel<<<blocks, kRoutingThreads, 0, stream>>>(ids, routing, routes,
                                                                 num_experts, status);
  return cudaGetLastError();
}

cudaError_t launch(const Args& args, cudaStream_t stream) {
  const Plan plan = make_plan(args.routes, args.experts);
  const detail::Params p = detail::make_params(args, plan);
  cudaError_t status = cudaSuccess;
  if (plan.chunks == 0) {  // no routes, no count_kernel: every row is padding (0xFF bytes: -1)
    const size_t row_bytes = static_cast<size_t>(args.capacity) * sizeof(int32_t);
    status = cudaMemsetAsync(args.peer_rank, 0xFF, row_bytes, stream);
    if (status != cudaSuccess) return status;
    status = cudaMemsetAsync(args.peer_token_idx, 0xFF, row_bytes, stream);
    if (status != cudaSuccess) return status;
  }

  const dim3 blocks(static_cast<unsigned>(plan.chunks), static_cast<unsigned>(args.ep));
  const unsigned threads = static_cast<unsigned>(plan.warps * kLanes);
  const size_t hist_bytes = static_cast<size_t>(args.experts) * sizeof(int);
  if (plan.chunks > 0) {
    detail::count_kernel<<<blocks, threads, hist_bytes, stream>>>(p);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  const int64_t columns = args.ep * args.experts;
  if (columns <= kSegmentThreads) {
    detail::columns_segment_kernel<<<1, kSegmentThreads, 0, stream>>>(p);
  } else {
    const auto column_blocks =
        static_cast<unsigned>((columns + kColumnThreads - 1) / kColumnThreads);
    detail::columns_kernel<<<column_blocks, kColumnThreads, 0, stream>>>(p);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    detail::segment_kernel<<<1, kSegmentThreads, 0, stream>>>(p);
  }
  status = cudaGetLastError();
  if (status != cudaSuccess || plan.chunks == 0) return status;
  detail::place_kernel<<<blocks, threads, plan.warps * hist_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mok::schedule
