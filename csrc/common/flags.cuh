// Cross-GPU flag words: release/acquire at system scope, epoch tags, bounded waits.
//
// A flag word holds the epoch of the last signal that reached it. Epochs only grow (by one per
// barrier, identically on every rank), so a waiter compares with ">=" instead of "==": a peer that
// is already one barrier ahead has overwritten the flag with a larger epoch, which must still
// count as arrived. The comparison is wrap-safe, so the 32-bit counter never needs resetting and
// no flag buffer is ever cleared between calls.
//
// Waits are bounded: a peer that never signals (crashed, or running a different sequence of ops)
// makes the wait give up after a timeout, OR kStatusTimeout into the workspace status word and
// return false. The kernel then finishes normally; it never traps and never hangs the stream.
#pragma once

#include <cstdint>

namespace mok::comm {

// Bits of the device status word (mok/status.py TIMEOUT, OUT_OF_STEP).
constexpr int kStatusTimeout = 4;
constexpr int kStatusOutOfStep = 32;

// Longest pause between two polls of a flag: short against a cross-GPU round trip, so backing
// off costs little latency, long enough that a waiting warp leaves the SM's issue slots to other
// warps.
constexpr unsigned kMaxPollSleepNs = 256;

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// Store `value` so that every write this thread issued or observed before it (cumulativity) is
// visible to whoever acquires the flag, on any GPU of the system.
__device__ __forceinline__ void signal_flag(uint32_t* flag, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_flag_acquire(const uint32_t* flag) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// Orders every prior write of this thread, peer stores included, before its later writes as seen
// from any GPU (fence.sc.sys). Kernels that store into peers' memory end with it, so the barrier
// kernel that follows them in the stream never signals ahead of their data.
__device__ __forceinline__ void system_fence() { __threadfence_system(); }

// True once `value` (a flag) has reached `epoch`, modulo 2^32: valid while the two differ by less
// than 2^31 epochs, which holds because a peer is never more than one barrier ahead.
__device__ __forceinline__ bool epoch_reached(uint32_t value, uint32_t epoch) {
  return static_cast<int32_t>(value - epoch) >= 0;
}

// Spin (with exponential __nanosleep backoff) until *flag reaches `epoch`. After `timeout_ns` of
// %globaltimer time, OR kStatusTimeout into *status and return false.
__device__ __forceinline__ bool wait_flag(const uint32_t* flag, uint32_t epoch,
                                          uint64_t timeout_ns, int* status) {
  if (epoch_reached(load_flag_acquire(flag), epoch)) return true;
  const uint64_t start = global_timer_ns();
  unsigned sleep_ns = 8;
  while (!epoch_reached(load_flag_acquire(flag), epoch)) {
    if (global_timer_ns() - start > timeout_ns) {
      atomicOr(status, kStatusTimeout);
      return false;
    }
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < kMaxPollSleepNs ? 2 * sleep_ns : kMaxPollSleepNs;
  }
  return true;
}

}  // namespace mok::comm
