// Host entry points of the NVLink exchanges: the group's barrier and the routing all-gather
// (barrier.cu), the dispatch pull, the combine push and the clearing of a push destination's
// unrouted rows (pull_push.cu), and the pull beside a GEMM (arrival_pull.cu).
//
// None of them uses multicast: data moves with 16-byte loads and stores through peer pointers
// of PyTorch symmetric memory, and ranks synchronise through epoch-tagged flag words (the
// barrier). The copy kernels do not synchronise by themselves; mok/backends/cuda/comm.py brackets
// them with barriers, which the stream orders around them:
//   - data a kernel stores into peers' memory is fenced at system scope by every storing thread
//     before it exits, then the barrier's release store publishes it;
//   - a kernel that reads what peers stored runs after a barrier kernel whose acquire loads saw
//     those peers' flags.
//
// Every cross-rank address comes from a device table of int64 peer addresses, one per rank of the
// group (MoKWorkspace.peer_ptr_tables): entry r is rank r's copy of a symmetric buffer, mapped
// into this process. Tables are built once per workspace, so a launch passes one pointer per
// buffer and the kernels stay capturable in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/arrivals.hpp"

namespace mok::comm {

constexpr int kMaxRanks = 72;     // the largest EP group (one NVL72 domain)
constexpr int kCopyThreads = 512;  // threads per CTA of the copy kernels

// Device-side barrier over the group, epoch-tagged (see common/flags.cuh).
// Flag words of a rank (uint32 [5 * ep]): [0, ep) the epoch of each rank's last signal, then two
// rows of ep tags and two rows of ep status words, the rows of an epoch's parity holding the tag
// and the status word each rank signalled with.
struct BarrierArgs {
  const uint64_t* flag_table = nullptr;  // [ep] every rank's flag words
  uint32_t* flags = nullptr;             // this rank's flag words: flags[r] = rank r's last epoch
  uint32_t* epoch = nullptr;             // this rank's count of completed barriers
  int* status = nullptr;                 // device status word; a timeout ORs kStatusTimeout
  int rank = 0;
  int ep = 1;
  uint64_t timeout_ns = 0;
  uint32_t tag = 0;  // what this barrier separates; peers at another tag: kStatusOutOfStep
};

// Stores this rank's `bytes` from `src` at byte offset rank * bytes of every rank's buffer.
struct AllGatherArgs {
  const void* src = nullptr;
  const uint64_t* dst_table = nullptr;  // [ep] every rank's gather buffer (ep * bytes each)
  int64_t bytes = 0;                    // a multiple of 4
  int rank = 0;
  int ep = 1;
  // Bytes a CTA copies at a time (MoKConfig.all_gather_top_experts_chunk_bytes, a multiple of
  // 16); 0: 32 KiB chunks.
  int64_t chunk_bytes = 0;
};

// The rows of a schedule as the kernels read them.
struct ScheduleView {
  const int32_t* peer_rank = nullptr;       // [rows] source/destination rank, < 0 on padding
  const int32_t* peer_token_idx = nullptr;  // [rows] token * topk + slot on that rank
  const int32_t* num_tokens = nullptr;      // [1] rows at or past it are padding
  int64_t rows = 0;
};

// out[i] = rank peer_rank[i]'s source row peer_token_idx[i] / divisor; zero on padding rows.
struct PullArgs {
  ScheduleView schedule;
  const uint64_t* src_table = nullptr;  // [ep] every rank's source buffer [src_rows, row_bytes]
  // Non-null (ep 1 only): the caller's own source, read instead of src_table[0], so that it
  // need not be copied into the workspace buffer first. 16-byte aligned.
  const void* src_direct = nullptr;
  void* out = nullptr;   // local [schedule.rows, row_bytes]
  int64_t row_bytes = 0;  // a multiple of 4
  int64_t src_rows = 0;
  int divisor = 1;
  int ep = 1;
  int ctas = 1;
  bool zero_rest = true;  // false: rows at or past num_tokens are left as they are
  // Set: the pull runs beside the GEMM that reads its rows (launched right after it with
  // programmatic dependent launch), each of its `ctas` CTAs (one an SM, all resident at once)
  // on whole minibatches, counting each minibatch's arrival (common/arrivals.cuh). row_bytes
  // and `out` must then be 16-byte aligned (bulk copies), as the GEMM's TMA needs anyway.
  Arrivals arrivals;
};

// Rank peer_rank[i]'s destination row peer_token_idx[i] = rows[i]; padding rows are skipped.
struct PushArgs {
  ScheduleView schedule;
  const void* rows = nullptr;           // local [schedule.rows, row_bytes]
  const uint64_t* dst_table = nullptr;  // [ep] every rank's destination [dst_rows, row_bytes]
  int64_t row_bytes = 0;                // a multiple of 4
  int64_t dst_rows = 0;
  int ep = 1;
  int ctas = 1;
};

// Zeroes this rank's destination rows of the routes nobody pushes (routing[slot] < 0), so that a
// combine need not clear its whole destination first (mok/schedule.py says when that holds).
struct ZeroUnroutedArgs {
  const int32_t* routing = nullptr;  // [slots] this rank's expert id of each route, -1 if none
  void* dest = nullptr;              // local [slots, row_bytes]
  int64_t slots = 0;
  int64_t row_bytes = 0;             // a multiple of 4
  int ctas = 1;
};

// Each enqueues one kernel on `stream` and returns the launch status (never synchronises).
cudaError_t launch_barrier(const BarrierArgs& args, cudaStream_t stream);
cudaError_t launch_all_gather(const AllGatherArgs& args, cudaStream_t stream);
// With args.arrivals set, launch_pull launches launch_arrival_pull's kernel (arrival_pull.cu).
cudaError_t launch_pull(const PullArgs& args, cudaStream_t stream);
cudaError_t launch_arrival_pull(const PullArgs& args, cudaStream_t stream);
cudaError_t launch_push(const PushArgs& args, cudaStream_t stream);
cudaError_t launch_zero_unrouted(const ZeroUnroutedArgs& args, cudaStream_t stream);

}  // namespace mok::comm
