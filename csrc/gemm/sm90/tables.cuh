// The per-group tables a CUTLASS grouped GEMM reads (problem shapes, operand addresses, strides),
// written on the device from the schedule's segment sizes so the host never sees them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cute/tensor.hpp"
#include "gemm/grouped_gemm.h"
#include "mxfp8/format.hpp"

namespace mok::gemm::detail {

constexpr size_t kTableAlignment = 128;
constexpr int kWarp = 32;  // one warp per group in fill_tables
// The schedule pads a segment to a multiple of 256 rows, so at most 255 trailing rows are padding:
// fill_tables looks this far back for a segment's last routed row.
constexpr int kMaxPaddingRows = 256;

inline __host__ __device__ size_t round_up(size_t bytes) {
  return (bytes + kTableAlignment - 1) / kTableAlignment * kTableAlignment;
}

template <class Shape, class Element, class ElementD, class StrideA, class StrideB, class StrideC,
          class StrideD>
struct GroupTables {
  using ElementAB = Element;
  using ElementOut = ElementD;
  using StrideTypeA = StrideA;
  using StrideTypeB = StrideB;
  using StrideTypeC = StrideC;
  using StrideTypeD = StrideD;

  Shape* shapes;
  const Element** a;
  const Element** b;
  const Element** a2;  // the pair kinds' second pair (pairs_along_k)
  const Element** b2;
  ElementD** d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideC* stride_c;
  StrideD* stride_d;
  int32_t* used;  // rows of each group's segment the GEMM computes (the rest are zero rows)
  int64_t* row0;  // the group's first row in A (the f16-rows kind reads A's row exponents)
  int32_t* a_shift;  // 4 words (16 bytes) per group: row0 % 16, for the f16-rows kind's copies

  static size_t bytes(int groups) {
    const size_t g = static_cast<size_t>(groups);
    return round_up(g * sizeof(Shape)) + 5 * round_up(g * sizeof(void*)) +
           round_up(g * sizeof(StrideA)) + round_up(g * sizeof(StrideB)) +
           round_up(g * sizeof(StrideC)) + round_up(g * sizeof(StrideD)) +
           round_up(g * sizeof(int32_t)) + round_up(g * sizeof(int64_t)) +
           round_up(g * 4 * sizeof(int32_t));
  }

  // Lays the tables out back to back from `base` (which may be null to size them).
  static GroupTables carve(void* base, int groups) {
    char* cursor = static_cast<char*>(base);
    const size_t g = static_cast<size_t>(groups);
    auto take = [&](size_t element_bytes) {
      char* here = cursor;
      cursor += round_up(g * element_bytes);
      return here;
    };
    GroupTables t;
    t.shapes = reinterpret_cast<Shape*>(take(sizeof(Shape)));
    t.a = reinterpret_cast<const Element**>(take(sizeof(void*)));
    t.b = reinterpret_cast<const Element**>(take(sizeof(void*)));
    t.a2 = reinterpret_cast<const Element**>(take(sizeof(void*)));
    t.b2 = reinterpret_cast<const Element**>(take(sizeof(void*)));
    t.d = reinterpret_cast<ElementD**>(take(sizeof(void*)));
    t.stride_a = reinterpret_cast<StrideA*>(take(sizeof(StrideA)));
    t.stride_b = reinterpret_cast<StrideB*>(take(sizeof(StrideB)));
    t.stride_c = reinterpret_cast<StrideC*>(take(sizeof(StrideC)));
    t.stride_d = reinterpret_cast<StrideD*>(take(sizeof(StrideD)));
    t.used = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
    t.row0 = reinterpret_cast<int64_t*>(take(sizeof(int64_t)));
    t.a_shift = reinterpret_cast<int32_t*>(take(4 * sizeof(int32_t)));
    return t;
  }
};

// A packed stride: exactly one mode of (outer, inner, batch) is dynamic besides the batch.
template <class Stride>
__device__ Stride leading_stride(int64_t leading) {
  Stride stride{};
  if constexpr (cute::is_static<decltype(cute::get<0>(stride))>::value) {
    cute::get<1>(stride) = leading;
  } else {
    cute::get<0>(stride) = leading;
  }
  return stride;
}

// Rows of the segment [row0, row0 + rows) up to its last routed row (source >= 0), for the whole
// warp: the schedule puts a segment's padding rows (source -1, zero in every routed buffer) after
// its routed rows, so no tile needs to cover them. Without a source table every row counts.
__device__ __forceinline__ int routed_rows(const int32_t* source, int64_t row0, int rows) {
  if (source == nullptr) return rows;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  for (int back = 0; back < kMaxPaddingRows && back < rows; back += kWarp) {
    const int row = rows - 1 - back - lane;  // lane 0 the highest row of this step
    const bool routed = row >= 0 && source[row0 + row] >= 0;
    const unsigned hits = __ballot_sync(0xffffffffu, routed);
    if (hits != 0) return rows - back - (__ffs(hits) - 1);
  }
  // No routed row among the last kMaxPaddingRows: only those are known to be padding.
  return rows > kMaxPaddingRows ? rows - kMaxPaddingRows : 0;
}

// The operand set and expert of group g among `groups` = experts x sets per expert (one set per
// expert where both sets are one tile's: the pair kinds, M_GROUPED_BF16_NT_SWIGLU). Expert-major,
// g = e * sets + set: the persistent scheduler walks groups in order, so CTAs compute gate and
// up (or their weight gradients) of one expert together and read its rows once from HBM, as
// torch's stacked [E, 2I, H] weight does; set-major order read every row twice.
struct GroupIndex {
  int set;
  int expert;
};

__host__ __device__ inline GroupIndex group_index(int g, int groups, int experts) {
  const int sets = groups / experts;
  return {g % sets, g / sets};
}

// An expert's E4M3 weight bytes as the placeholder address of a bf16 descriptor.
template <class Element>
__device__ const Element* expert_weight(const void* weights, int64_t offset) {
  return reinterpret_cast<const Element*>(static_cast<const uint8_t*>(weights) + offset);
}

// Group g: one warp each (see group_index). Segment e starts at row0 = sum(rows[:e]).
template <Kind kKind, class Tables>
__global__ void fill_tables_kernel(GroupedArgs args, Tables tables) {
  const int g = static_cast<int>(blockIdx.x);
  const auto [set, e] = group_index(g, static_cast<int>(gridDim.x), args.experts);
  int64_t row0 = 0;
  for (int j = 0; j < e; ++j) row0 += args.rows[j];
  const int used = routed_rows(args.row_source, row0, args.rows[e]);
  if (threadIdx.x != 0) return;
  tables.used[g] = used;
  tables.row0[g] = row0;
  tables.a_shift[4 * g] = static_cast<int32_t>(row0 % 16);
  const OperandSet& s = args.sets[set];
  using Element = typename Tables::ElementAB;
  using ElementD = typename Tables::ElementOut;
  using StrideA = typename Tables::StrideTypeA;
  using StrideB = typename Tables::StrideTypeB;
  using StrideC = typename Tables::StrideTypeC;
  using StrideD = typename Tables::StrideTypeD;
  const auto* a = static_cast<const Element*>(s.a);
  const auto* b = static_cast<const Element*>(s.b);
  auto* d = static_cast<ElementD*>(s.d);
  const int64_t n = args.n;
  const int64_t k = args.k;
  if constexpr (kKind == Kind::K_GROUPED_MXFP8_TN) {
    // B's k tiles and scale tiles start at the segment's first row, so it must be a multiple
    // of 128 (the schedule's segments are of 256 rows): a group where it is not gets no tiles
    // and NaN in its D (zero_empty_experts), not another segment's rows.
    if (row0 % mxfp8::kTile != 0) tables.used[g] = used > 0 ? -1 : 0;
    // Computed transposed (mx_weight_mainloop.cuh's kRowsK): M = n (rows of B's E4M3 [n,
    // total_rows]), N = k (the gradient's columns), K = the segment's routed rows; D[e] [k, n]
    // is column-major M x N. A is B's bytes from the segment's first row, for the mainloop's
    // bf16 placeholder descriptor only; the gradient rows (N contiguous) are wgmma's B.
    const bool computed = tables.used[g] > 0;
    tables.shapes[g] = {computed ? static_cast<int>(n) : 0, static_cast<int>(k), used};
    tables.a[g] = expert_weight<Element>(s.b, row0);
    tables.b[g] = a + row0 * k;
    tables.d[g] = d + e * k * n;
    tables.stride_a[g] = leading_stride<StrideA>(args.total_rows);
    tables.stride_b[g] = leading_stride<StrideB>(k);
  } else if constexpr (kKind == Kind::K_GROUPED_BF16_TN) {
    // M = k (output rows), N = n, K = the segment's routed rows: A = a^T (M contiguous), B = b
    // (N contiguous). A segment without routed rows gets no tiles (M = 0); zero_empty_experts
    // writes its zeros.
    tables.shapes[g] = {used > 0 ? static_cast<int>(k) : 0, static_cast<int>(n), used};
    tables.a[g] = a + row0 * k;
    tables.b[g] = b + row0 * n;
    tables.d[g] = d + e * k * n;
    tables.stride_a[g] = leading_stride<StrideA>(k);
    tables.stride_b[g] = leading_stride<StrideB>(n);
  } else if constexpr (reads_mx_weight(kKind)) {
    // Computed transposed (mx_weight_mainloop.cuh): M = n (the weight's rows), N = the routed
    // rows. A is the expert's E4M3 weight, handed to the mainloop's bf16 placeholder descriptor
    // only (its own descriptor reads the bytes). M_GROUPED_MXFP8_NT_PAIR: two (weight, rows) pairs
    // of one shape along K.
    const bool paired = pairs_along_k(kKind);
    tables.shapes[g] = {static_cast<int>(n), used, static_cast<int>(paired ? 2 * k : k)};
    tables.a[g] = expert_weight<Element>(s.b, e * n * k);
    tables.b[g] = a + row0 * k;
    tables.d[g] = d + row0 * n;
    tables.stride_a[g] = leading_stride<StrideA>(k);
    tables.stride_b[g] = leading_stride<StrideB>(k);
    if (paired) {
      tables.a2[g] = expert_weight<Element>(args.sets[1].b, e * n * k);
      tables.b2[g] = static_cast<const Element*>(args.sets[1].a) + row0 * k;
    }
  } else {
    const bool paired = pairs_along_k(kKind);
    // M_GROUPED_BF16_NT_SWIGLU's tiles hold gate's and up's columns side by side
    // (gate_up_mainloop.cuh), whose fixed descriptors read the weights: B here is a placeholder
    // address.
    const bool gate_up = kKind == Kind::M_GROUPED_BF16_NT_SWIGLU;
    tables.shapes[g] = {used, static_cast<int>(gate_up ? 2 * n : n),
                        static_cast<int>(paired ? 2 * k : k)};
    tables.a[g] = a + row0 * k;
    tables.b[g] = b + e * n * k;
    tables.d[g] = d + row0 * n;
    tables.stride_a[g] = leading_stride<StrideA>(k);
    // The NT kinds: B[e] is [N, K] (K contiguous); the NN kinds: [K, N] (N contiguous).
    const bool k_major = kKind == Kind::M_GROUPED_BF16_NT || gate_up;
    tables.stride_b[g] = leading_stride<StrideB>(k_major ? k : n);
    if (paired) {  // the same shapes and strides as the first pair
      tables.a2[g] = static_cast<const Element*>(args.sets[1].a) + row0 * k;
      tables.b2[g] = static_cast<const Element*>(args.sets[1].b) + e * n * k;
    }
  }
  tables.stride_c[g] = leading_stride<StrideC>(n);
  tables.stride_d[g] = leading_stride<StrideD>(n);
}

// Weight gradients of experts without routed rows are exactly zero (the GEMM gives them no
// tiles); those of groups fill_tables refused (used -1) are NaN.
template <class ElementD>
__global__ void zero_empty_experts_kernel(GroupedArgs args, const int32_t* used) {
  const int g = static_cast<int>(blockIdx.y);
  if (used[g] > 0) return;
  const float value = used[g] == 0 ? 0.0f : __int_as_float(0x7fc00000);
  const auto [set, e] = group_index(g, static_cast<int>(gridDim.y), args.experts);
  auto* d = static_cast<ElementD*>(args.sets[set].d) + e * args.k * args.n;
  const int64_t count = args.k * args.n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    d[i] = ElementD(value);
  }
}

// Output blockIdx.y of a launch: each operand set's D, then M_GROUPED_BF16_NT_SWIGLU's hidden.
__device__ __forceinline__ void* output(const GroupedArgs& args, int index) {
  return index < kMaxSets ? args.sets[index].d : args.hidden;
}

// Zeroes the D rows no tile computes, in 16-byte vectors, for output blockIdx.y: each
// segment's padding rows [row0 + used, row0 + rows) and, when total_rows > 0, the rows from the
// last segment's end to total_rows. `used` is per group: expert e's first group is
// e * sets_per_expert (group_index), and every group of an expert has its segment's count. A
// template (not `static`) so the kernel has one name in every translation unit, whatever the
// build path.
template <int kUnused = 0>
__global__ void zero_uncomputed_rows_kernel(GroupedArgs args, const int32_t* used,
                                            int sets_per_expert, int64_t row_bytes) {
  auto* d = static_cast<uint4*>(output(args, static_cast<int>(blockIdx.y)));
  const int64_t vectors = row_bytes / 16;
  const int64_t first = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t row0 = 0;
  for (int e = 0; e <= args.experts; ++e) {
    const bool tail = e == args.experts;  // the rows past every segment
    const int64_t begin = tail ? row0 : row0 + used[e * sets_per_expert];
    const int64_t tail_end = args.total_rows > row0 ? args.total_rows : row0;
    const int64_t end = tail ? tail_end : row0 + args.rows[e];
    for (int64_t i = begin * vectors + first; i < end * vectors; i += stride) {
      d[i] = make_uint4(0, 0, 0, 0);
    }
    if (!tail) row0 += args.rows[e];
  }
}

template <Kind kKind, class Tables>
cudaError_t fill_tables(const GroupedArgs& args, const Tables& tables, int groups,
                        cudaStream_t stream) {
  fill_tables_kernel<kKind><<<groups, kWarp, 0, stream>>>(args, tables);
  if constexpr (is_weight_grad(kKind)) {
    zero_empty_experts_kernel<typename Tables::ElementOut>
        <<<dim3(64, groups), 256, 0, stream>>>(args, tables.used);
  } else if (args.row_source != nullptr || args.total_rows > 0) {
    const int64_t row_bytes = args.n * static_cast<int64_t>(sizeof(typename Tables::ElementOut));
    const int outputs = pairs_along_k(kKind) ? 1
                        : kKind == Kind::M_GROUPED_BF16_NT_SWIGLU   ? kMaxSets + 1
                                                         : args.num_sets;
    const int sets_per_expert = args.experts > 0 ? groups / args.experts : 1;
    zero_uncomputed_rows_kernel<><<<dim3(132, outputs), 256, 0, stream>>>(
        args, tables.used, sets_per_expert, row_bytes);
  }
  return cudaGetLastError();
}

}  // namespace mok::gemm::detail
