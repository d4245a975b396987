// The dispatch pull with Hopper's bulk-copy engine (cp.async.bulk), for rows of 16-byte multiples.
//
// Why: a pull reads peers' memory, and an SM has only so many remote loads in flight. Measured on
// 2x H200 (benchmarks/NOTES.md v5), the thread-copy pull moves ~8 GB/s per CTA, so it needs most of
// the GPU to reach NVLink's ~360 GB/s, while a push (remote stores, which do not wait for an answer)
// reaches it from 16 CTAs. Here one thread per CTA hands whole row pieces to the copy engine:
// kStages pieces of up to kPieceBytes are in flight per CTA (loads into shared memory, completion
// counted by an mbarrier), each then stored to the local output by a bulk store. Padding rows are
// bulk-stored from a zeroed piece. Same bytes, same order of rows per CTA as the thread copy.
#pragma once

#include <cstdint>

namespace mok::comm {

constexpr int kBulkStages = 12;
constexpr int64_t kBulkPieceBytes = 8192;
// Dynamic shared memory of the bulk pull: the stages, one zero piece, the stages' mbarriers.
constexpr int64_t kBulkSmemBytes = (kBulkStages + 1) * kBulkPieceBytes + kBulkStages * 8;

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count)
               : "memory");
}

// Expect `bytes` more of transaction on `bar` and arrive once (this thread).
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Global (local or peer) -> shared; completion is counted on `bar`.
__device__ __forceinline__ void bulk_load(void* smem, const void* global, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_address(smem)),
      "l"(global), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}

// Shared -> global, as one bulk group.
__device__ __forceinline__ void bulk_store(void* global, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(global),
               "r"(smem_address(smem)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Until no bulk store still reads shared memory (`Writes`: until every store has landed too).
template <bool kWrites>
__device__ __forceinline__ void bulk_stores_wait() {
  if constexpr (kWrites) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
}

// Makes this CTA's ordinary shared-memory writes (the zero piece, the mbarrier inits) visible to
// the copy engine before it uses them.
__device__ __forceinline__ void fence_shared_for_bulk() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

}  // namespace mok::comm
