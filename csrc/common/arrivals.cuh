// Arrival counters: a dispatch pull overlapped with the grouped GEMM that reads its rows
// (docs/overlap.md). Each minibatch of the schedule's rows is copied by one CTA of the pull
// (comm/arrival_pull.cu), which then sets the minibatch's counter; the GEMM's producer warp waits
// until every minibatch of a tile's rows has arrived before it loads the tile. Counters are
// zeroed in the stream before the pull, so no epoch is needed, and a wait is bounded like a
// barrier's (common/flags.cuh).
//
// Memory ordering: the pull stores its rows by bulk copies (the async proxy); its issuing thread
// waits until they are written, fences the async proxy against its own generic accesses, then
// fences at GPU scope and adds. The waiting thread loads the counter with acquire semantics, then
// fences the async proxy, because the GEMM reads the rows by TMA, which goes through it too.
#pragma once

#include <cstdint>

#include "common/arrivals.hpp"
#include "common/flags.cuh"

namespace mok::comm {

// Called by the one thread that issued minibatch `m`'s bulk stores, once they are written
// (cp.async.bulk.wait_group 0).
__device__ __forceinline__ void publish_arrival(const Arrivals& a, int64_t m) {
  asm volatile("fence.proxy.async.global;" ::: "memory");
  __threadfence();
  atomicAdd(a.counts + m, 1u);
}

__device__ __forceinline__ uint32_t load_count_acquire(const uint32_t* count) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(count) : "memory");
  return value;
}

// One thread: waits until every minibatch holding a row of [first, last) has arrived, then
// makes the rows visible to its TMA loads. False (and kStatusTimeout in the status word) if a
// wait gave up: the rows read then are wrong, and check_status says so.
__device__ __forceinline__ bool wait_rows(const Arrivals& a, int64_t first, int64_t last) {
  bool arrived = true;
  const int64_t end = last < a.minibatches * a.minibatch_rows ? last
                                                              : a.minibatches * a.minibatch_rows;
  for (int64_t m = first / a.minibatch_rows; arrived && m * a.minibatch_rows < end; ++m) {
    if (load_count_acquire(a.counts + m) != 0) continue;
    const uint64_t start = global_timer_ns();
    unsigned sleep_ns = 8;
    while (load_count_acquire(a.counts + m) == 0) {
      if (global_timer_ns() - start > a.timeout_ns) {
        atomicOr(a.status, kStatusTimeout);
        arrived = false;
        break;
      }
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < kMaxPollSleepNs ? 2 * sleep_ns : kMaxPollSleepNs;
    }
  }
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return arrived;
}

}  // namespace mok::comm
