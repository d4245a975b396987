// Host entry points of mok's grouped expert GEMMs (Hopper TMA + wgmma, CUTLASS 3 collectives).
//
// Every GEMM runs over the schedule's expert segments: `rows[g]` consecutive routed rows per
// local expert (multiples of 256, read on the device), so a launch needs no host sync. One
// launch may cover two operand sets (gate and up): groups = sets * experts (one per expert
// where the two sets are one reduction's halves, the pair kinds). Given the schedule's row
// sources, a segment's trailing padding rows (source -1, zero rows) get no tiles: the M-grouped
// kinds write them as zeros, the K-grouped ones (weight gradients) leave them out of their sums.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/arrivals.hpp"

namespace mok::gemm {

// What each group computes (R = the segment's rows, e = the local expert, rows from row0), named
// as DeepGEMM names its GEMMs: M_GROUPED (the segments group A's rows, one B per expert) or
// K_GROUPED (they group the reduction, one D per expert); the operands' precision; A @ B with
// each operand taken as stored (N) or transposed (T), both stored row-major (NT: A [M, K] @
// B [N, K]^T); then what else differs. The values are the binding's `kind` integers, which the
// Python package's Kind mirrors.
enum class Kind : int {
  // D[row0:, :N] (bf16) = A[row0:, :K] @ B[e]^T; A bf16 [rows, K], B bf16 [E, N, K].
  M_GROUPED_BF16_NT = 0,
  // D (fp32) = A[row0:, :K] @ B[e]; A bf16 [rows, K], B bf16 [E, K, N].
  M_GROUPED_BF16_NN_F32 = 1,
  // D (bf16) = A[row0:, :K] @ B[e] + A2[row0:, :K] @ B2[e] in one fp32 accumulation (sets[0]
  // holds A, B, D; sets[1] A2, B2): the backward's d_x. K must be a multiple of kTileK.
  M_GROUPED_BF16_NN_PAIR = 2,
  // D[e] (bf16 [M, N]) = A[row0:row0+R, :M]^T @ B[row0:row0+R, :N]; empty experts get zeros.
  K_GROUPED_BF16_TN = 3,
  // M_GROUPED_BF16_NT with B an MXFP8 weight as mxfp8_quantize stores it: E4M3 [E, N, K] and
  // its scale tiles (`b_scale`), read without a bf16 copy. N and K must be multiples of 128.
  M_GROUPED_MXFP8_NT = 4,
  // The forward's gate and up GEMMs with SwiGLU in the epilogue: sets[0] = (A, W_gate, gate),
  // sets[1] = (A, W_up, up), both W bf16 [E, N, K], and `hidden` = swiglu(gate, up), each bf16
  // [rows, N] from one tile. N must be a multiple of 128.
  M_GROUPED_BF16_NT_SWIGLU = 5,
  // M_GROUPED_MXFP8_NT on f16 operands, each rebased per row so that f16 holds it: A f16
  // [rows, K] with one byte R_a per row (`a_exponent`, [rows] and 272 readable bytes past them)
  // is x / 2^(R_a - 127); the E4M3 weight is converted per K block to e4m3 * 2^(E - R_b), the
  // f16 factors 2^(E - R_b) given in `b_scale` in the scale tiles' layout (2 bytes an entry),
  // with one byte R_b per weight row (`b_exponent`, [E * N]); the fp32 sums are multiplied by
  // 2^(R_b - 127) * 2^(R_a - 127) before the epilogue. Converting E4M3 to f16 takes two
  // instructions a pair, to bf16 five (docs/grouped-gemm.md, the f16-rows variant).
  M_GROUPED_MXFP8_NT_F16_ROWS = 6,
  // M_GROUPED_MXFP8_NT with fp32 D: the MXFP8 backward's d_h = q(d_out) @ W_down from W_down's
  // transposed pair (E4M3 [E, N, K], blocks along K) as mxfp8_quantize stores it.
  M_GROUPED_MXFP8_NT_F32 = 7,
  // M_GROUPED_BF16_NN_PAIR's sum on MXFP8 weights read as stored: D (bf16) = A @ W[e]^T +
  // A2 @ W2[e]^T in one fp32 accumulation, W and W2 E4M3 [E, N, K] with scale tiles (sets[0]
  // holds A, W, D and its scales; sets[1] A2, W2): the MXFP8 backward's d_x from gate's and
  // up's transposed pairs. N and K must be multiples of 128.
  M_GROUPED_MXFP8_NT_PAIR = 8,
  // K_GROUPED_BF16_TN with B an activation's transposed MXFP8 pair as mxfp8_round stores it:
  // E4M3 [N, total_rows] (`b`; blocks of 32 rows along total_rows = `total_rows`) and its scale
  // tiles (`b_scale`), read without a bf16 copy: the MXFP8 backward's gate and up weight
  // gradients from the saved x. N, M and total_rows must be multiples of 128.
  K_GROUPED_MXFP8_TN = 9,
};

constexpr int kKinds = 10;

// The kinds whose B operands are MXFP8 as stored (E4M3 and scale tiles): weights, or
// K_GROUPED_MXFP8_TN's transposed activation.
__host__ __device__ constexpr bool reads_mx_weight(Kind kind) {
  return kind == Kind::M_GROUPED_MXFP8_NT || kind == Kind::M_GROUPED_MXFP8_NT_F16_ROWS ||
         kind == Kind::M_GROUPED_MXFP8_NT_F32 || kind == Kind::M_GROUPED_MXFP8_NT_PAIR ||
         kind == Kind::K_GROUPED_MXFP8_TN;
}

// The K-grouped kinds: the reduction runs over a segment's rows (one D per expert).
__host__ __device__ constexpr bool is_weight_grad(Kind kind) {
  return kind == Kind::K_GROUPED_BF16_TN || kind == Kind::K_GROUPED_MXFP8_TN;
}

// The kinds that sum two operand pairs along K into one D (the second set has no D).
__host__ __device__ constexpr bool pairs_along_k(Kind kind) {
  return kind == Kind::M_GROUPED_BF16_NN_PAIR || kind == Kind::M_GROUPED_MXFP8_NT_PAIR;
}
constexpr int kMaxSets = 2;
constexpr int kTileK = 64;  // the K depth of every kind's tiles

struct OperandSet {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;  // null for the pair kinds' second set
  const void* b_scale = nullptr;  // the MXFP8 kinds: B's E8M0 scale tiles
  const void* a_exponent = nullptr;  // M_GROUPED_MXFP8_NT_F16_ROWS: uint8 per row of A
  const void* b_exponent = nullptr;  // M_GROUPED_MXFP8_NT_F16_ROWS: uint8 per row of B ([E * N])
};

struct GroupedArgs {
  Kind kind = Kind::M_GROUPED_BF16_NT;
  OperandSet sets[kMaxSets];
  int num_sets = 1;
  const int32_t* rows = nullptr;  // [experts] padded rows per expert (device)
  // [sum(rows)] source rank of each row, -1 for padding (device), or null: every row computed.
  const int32_t* row_source = nullptr;
  int experts = 0;
  int64_t n = 0;  // output columns
  int64_t k = 0;  // reduction length (the M-grouped kinds) / output rows M (the K-grouped ones)
  // The M-grouped kinds: rows of D; rows past the last segment (sum(rows)) are set to zero, so a
  // routed buffer holds no stale values past the schedule. K_GROUPED_MXFP8_TN: B's columns (rows
  // of the routed buffer it was rounded from).
  int64_t total_rows = 0;
  void* hidden = nullptr;  // M_GROUPED_BF16_NT_SWIGLU's third output
  bool has_limit = false;  // M_GROUPED_BF16_NT_SWIGLU: silu(min(gate, L)) * clamp(up, -L, L)
  float limit = 0.0f;
  int sm_count = 0;  // persistent CTAs; 0 = every SM of the device
  void* scratch = nullptr;  // device bytes for the group tables and CUTLASS's workspace
  size_t scratch_bytes = 0;
  // M_GROUPED_BF16_NT and M_GROUPED_BF16_NN_F32 only: A's rows arrive while the GEMM runs. The
  // launch zeroes the counters after the tables, calls `launch_pull(pull, stream)` (the pull
  // that counts them) and launches the GEMM as its programmatic dependent; the producer waits
  // for a tile's rows before loading them (common/arrivals.cuh).
  comm::Arrivals arrivals;
  cudaError_t (*launch_pull)(const void* pull, cudaStream_t stream) = nullptr;
  const void* pull = nullptr;
};

// False in modules built for other architectures (the callers fall back to torch).
bool available();

// Scratch bytes a launch of `kind` over `groups` groups needs with `sm_count` persistent CTAs
// (host only, no CUDA call).
size_t scratch_bytes(Kind kind, int groups, int sm_count);

// Whether `kind` can wait for its A rows to arrive (GroupedArgs::arrivals).
__host__ __device__ constexpr bool waits_for_rows(Kind kind) {
  return kind == Kind::M_GROUPED_BF16_NT || kind == Kind::M_GROUPED_BF16_NN_F32;
}

// Enqueues the group-table kernel and the GEMM on `stream`; never synchronises.
cudaError_t launch_grouped(const GroupedArgs& args, cudaStream_t stream);

}  // namespace mok::gemm
