// The dispatch pull beside the GEMM that reads its rows (docs/overlap.md): bulk asynchronous
// copies through shared memory, each CTA owning whole minibatches.
//
// Beside a GEMM the pull has a few SMs, so each must keep many bytes in flight: one thread per CTA
// issues bulk loads (global -> shared, completing on an mbarrier) up to kLookahead chunks ahead of
// the bulk stores (shared -> global) that follow them, about 160 KiB in flight per SM, where
// thread loads of 16 bytes kept 32 KiB. A CTA owns minibatches blockIdx.x, blockIdx.x + gridDim.x,
// ...: it drains its stores at a minibatch's end and publishes the minibatch alone, so the
// GEMM's first tiles wait for one CTA's minibatch, not for every CTA's share of it. The other
// warps load the schedule entries of the next block of rows while the issuing thread works.
#include "comm/comm.h"
#include "comm/schedule_rows.cuh"
#include "common/arrivals.cuh"
#include "common/shared_memory.hpp"

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace mok::comm {
namespace detail {

constexpr int kChunkBytes = 16 << 10;  // one bulk copy; a row is split into chunks of this size
constexpr int kStages = 12;            // chunk buffers in shared memory
// Loads ahead of the stores. Before a load reuses a stage, the store that read it must have
// read it: with kLookahead = kStages - 2, at least one store group follows that store, so
// waiting until at most one store group is reading suffices.
constexpr int kLookahead = kStages - 2;
constexpr int kEntryRows = 256;    // schedule entries loaded per block of rows
constexpr int kPullThreads = 128;  // one issuing thread, the rest load entries

struct alignas(128) PullShared {
  uint8_t stage[kStages][kChunkBytes];
  uint8_t zeros[kChunkBytes];  // the source of padding rows' stores
  const uint8_t* entries[2][kEntryRows];  // source row of each row of a block; null: zeros
  uint8_t* stage_dst[kStages];
  int32_t stage_bytes[kStages];
  uint64_t loaded[kStages];  // mbarriers: a stage's bulk load has landed
};

constexpr size_t kPullSharedBytes = sizeof(PullShared);
static_assert(kPullSharedBytes <= 227 << 10, "above an SM90 CTA's shared memory");

// The source row of schedule row `row`, or null where it carries nothing (pull_kernel's rules).
__device__ __forceinline__ const uint8_t* source_row(const PullArgs& a, int64_t row,
                                                     int64_t live) {
  const RawEntry e = raw_entry(a.schedule, row, live);
  int64_t index;
  return valid_entry(e, a.ep, a.divisor, a.src_rows, &index) ? pull_source_row(a, e, index)
                                                             : nullptr;
}

// The issuing thread's pipeline: counts of chunks loaded and stored since the kernel began
// (a stage's mbarrier phase follows from them).
struct BulkPipe {
  PullShared& s;
  uint64_t issued = 0;
  uint64_t stored = 0;

  __device__ void store_oldest() {
    const int stage = static_cast<int>(stored % kStages);
    cutlass::arch::ClusterBarrier::wait(&s.loaded[stage],
                                        static_cast<uint32_t>((stored / kStages) & 1));
    cute::SM90_BULK_COPY_S2G::copy(s.stage[stage], s.stage_dst[stage], s.stage_bytes[stage]);
    cute::tma_store_arrive();
    ++stored;
  }

  __device__ void copy(const uint8_t* src, uint8_t* dst, int32_t bytes) {
    if (src == nullptr) {
      cute::SM90_BULK_COPY_S2G::copy(s.zeros, dst, bytes);
      cute::tma_store_arrive();
      return;
    }
    if (issued - stored == kLookahead) store_oldest();
    const int stage = static_cast<int>(issued % kStages);
    if (issued >= kStages) cute::tma_store_wait<1>();
    s.stage_dst[stage] = dst;
    s.stage_bytes[stage] = bytes;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.loaded[stage], bytes);
    cute::SM90_BULK_COPY_G2S::copy(src, &s.loaded[stage], s.stage[stage], bytes);
    ++issued;
  }

  // Every store of the minibatch written (not only read), then the minibatch published.
  __device__ void finish_minibatch(const Arrivals& arrivals, int64_t m) {
    while (stored < issued) store_oldest();
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    publish_arrival(arrivals, m);
  }
};

// Rows [first, last) of one minibatch, a block of at most kEntryRows at a time: while the
// issuing thread copies a block, the other warps load the next block's entries.
__device__ void pull_minibatch(const PullArgs& a, BulkPipe& pipe, int64_t first, int64_t last,
                               int64_t live) {
  PullShared& s = pipe.s;
  const bool issuer = threadIdx.x == 0;
  for (int64_t i = threadIdx.x; i < kEntryRows && first + i < last; i += blockDim.x) {
    s.entries[0][i] = source_row(a, first + i, live);
  }
  __syncthreads();
  int buffer = 0;
  for (int64_t block = first; block < last; block += kEntryRows, buffer ^= 1) {
    const int64_t next = block + kEntryRows;
    if (issuer) {
      const int64_t rows = last - block < kEntryRows ? last - block : kEntryRows;
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* src = s.entries[buffer][r];
        uint8_t* dst = static_cast<uint8_t*>(a.out) + (block + r) * a.row_bytes;
        for (int64_t offset = 0; offset < a.row_bytes; offset += kChunkBytes) {
          const int64_t bytes = a.row_bytes - offset < kChunkBytes ? a.row_bytes - offset
                                                                   : kChunkBytes;
          pipe.copy(src == nullptr ? nullptr : src + offset, dst + offset,
                    static_cast<int32_t>(bytes));
        }
      }
    } else if (threadIdx.x >= 32) {
      for (int64_t i = threadIdx.x - 32; i < kEntryRows && next + i < last; i += blockDim.x - 32) {
        s.entries[buffer ^ 1][i] = source_row(a, next + i, live);
      }
    }
    __syncthreads();
  }
}

// The first instruction lets the GEMM launch (programmatic dependent launch): every CTA of this
// grid is resident by then, so a GEMM CTA that waits for rows never holds an SM a pull CTA needs.
__global__ void __launch_bounds__(kPullThreads, 1) pull_arrivals_kernel(PullArgs a) {
  asm volatile("griddepcontrol.launch_dependents;");
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  PullShared& s = *reinterpret_cast<PullShared*>(shared_bytes);
  for (int i = threadIdx.x; i < kChunkBytes / 16; i += blockDim.x) {
    reinterpret_cast<uint4*>(s.zeros)[i] = uint4{0, 0, 0, 0};
  }
  if (threadIdx.x < kStages) cutlass::arch::ClusterBarrier::init(&s.loaded[threadIdx.x], 1);
  cutlass::arch::fence_view_async_shared();  // the zeros, for the bulk stores that read them
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  const int64_t live = live_rows(a.schedule);
  const int64_t end = a.zero_rest ? a.schedule.rows : live;
  const int64_t step = a.arrivals.minibatch_rows;
  BulkPipe pipe{s};
  for (int64_t m = blockIdx.x; m < a.arrivals.minibatches; m += gridDim.x) {
    const int64_t first = m * step;
    const int64_t last = first + step < end ? first + step : end;
    if (first < last) pull_minibatch(a, pipe, first, last, live);
    if (threadIdx.x == 0) pipe.finish_minibatch(a.arrivals, m);
  }
}

}  // namespace detail

cudaError_t launch_arrival_pull(const PullArgs& args, cudaStream_t stream) {
  if (args.schedule.rows == 0 || args.row_bytes == 0) return cudaSuccess;
  if (args.row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(args.out) % 16 != 0) {
    return cudaErrorInvalidValue;  // bulk copies move 16-byte multiples between aligned addresses
  }
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  status = allow_dynamic_shared_memory<detail::PullShared>(
      detail::pull_arrivals_kernel, static_cast<int>(detail::kPullSharedBytes), device);
  if (status != cudaSuccess) return status;
  const dim3 grid(static_cast<unsigned>(args.ctas > 0 ? args.ctas : 1));
  detail::pull_arrivals_kernel<<<grid, detail::kPullThreads, detail::kPullSharedBytes, stream>>>(
      args);
  return cudaGetLastError();
}

}  // namespace mok::comm
