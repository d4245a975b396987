// Python binding of the grouped expert GEMMs: argument checks, then the table kernel and the GEMM.
//
// Addresses are raw device pointers (Python ints) and the stream a cudaStream_t as an int;
// mok/backends/cuda/grouped_gemm.py allocates the outputs and the scratch bytes with torch.
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "comm/comm.h"
#include "common/cuda_check.hpp"
#include "gemm/grouped_gemm.h"

namespace mok::api {

namespace gemm_checks {

namespace py = pybind11;

using checks::require;

// TMA reads and writes 16-byte aligned rows.
inline void address(const char* name, uintptr_t value) { checks::address(name, value, 16); }

inline void extent(const char* name, int64_t value) {
  require(value > 0 && value % 8 == 0 && value <= (int64_t{1} << 30),
          std::string("`") + name + "` must be a positive multiple of 8 below 2^30, got " +
              std::to_string(value));
}

// The variant groups as error messages name them (mok.backends.cuda.grouped_gemm.Kind's names).
constexpr const char* kPairVariants =
    "the pair variants (M_GROUPED_BF16_NN_PAIR, M_GROUPED_MXFP8_NT_PAIR)";
constexpr const char* kMxVariants = "the MXFP8 variants (M_GROUPED_MXFP8_*, K_GROUPED_MXFP8_TN)";

inline gemm::Kind kind(int value) {
  require(value >= 0 && value < gemm::kKinds, "`kind` must be in [0, " +
                                                  std::to_string(gemm::kKinds) + "), got " +
                                                  std::to_string(value));
  return static_cast<gemm::Kind>(value);
}

// `d` is 0 exactly for the second set of the pair kinds (M_GROUPED_BF16_NN_PAIR,
// M_GROUPED_MXFP8_NT_PAIR): its products add to the first set's d.
inline gemm::OperandSet operand_set(const char* suffix, bool has_d, uintptr_t a, uintptr_t b,
                                    uintptr_t d) {
  const std::string s(suffix);
  address(("a" + s).c_str(), a);
  address(("b" + s).c_str(), b);
  if (has_d) {
    address(("d" + s).c_str(), d);
  } else {
    require(d == 0, "`d" + s + "` must be 0: " + kPairVariants + " write their sum to `d`");
  }
  return {reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b),
          reinterpret_cast<void*>(d)};
}

}  // namespace gemm_checks

inline void require_grouped_gemm() {
  if (!gemm::available()) {
    throw std::runtime_error("mok's grouped GEMMs are compiled only into the sm_90a module; "
                             "this module is built for " MOK_ARCH);
  }
}

inline int64_t grouped_gemm_scratch_bytes(int kind, int groups, int sm_count) {
  require_grouped_gemm();
  gemm_checks::kind(kind);
  gemm_checks::require(groups >= 1 && groups <= 1024,
                       "`groups` must be in [1, 1024], got " + std::to_string(groups));
  gemm_checks::require(sm_count >= 1, "`sm_count` must be >= 1, got " + std::to_string(sm_count));
  return static_cast<int64_t>(gemm::scratch_bytes(static_cast<gemm::Kind>(kind), groups, sm_count));
}

// The MXFP8 kinds (M_GROUPED_MXFP8_*, K_GROUPED_MXFP8_TN) read each set's B as MXFP8: its scale
// tiles' address, and whole 128 x 128 tiles (K_GROUPED_MXFP8_TN: along total_rows too).
inline void mx_weight_operands(gemm::GroupedArgs& args, uintptr_t b_scale, uintptr_t b2_scale) {
  namespace check = gemm_checks;
  if (!gemm::reads_mx_weight(args.kind)) {
    check::require(b_scale == 0 && b2_scale == 0,
                   std::string("`b_scale` and `b2_scale` must be 0 except for ") +
                       check::kMxVariants);
    return;
  }
  check::address("b_scale", b_scale);
  args.sets[0].b_scale = reinterpret_cast<const void*>(b_scale);
  if (args.num_sets == 2) {
    check::address("b2_scale", b2_scale);
    args.sets[1].b_scale = reinterpret_cast<const void*>(b2_scale);
  } else {
    check::require(b2_scale == 0, "`b2_scale` must be 0 without a second set");
  }
  check::require(args.n % 128 == 0 && args.k % 128 == 0,
                 std::string(check::kMxVariants) +
                     " need `n` and `k` multiples of 128 (whole MXFP8 scale tiles), got n=" +
                     std::to_string(args.n) + ", k=" + std::to_string(args.k));
  check::require(args.kind != gemm::Kind::K_GROUPED_MXFP8_TN ||
                     (args.total_rows > 0 && args.total_rows % 128 == 0),
                 "K_GROUPED_MXFP8_TN needs `total_rows` (b's columns) a positive multiple of "
                 "128, got " +
                     std::to_string(args.total_rows));
}

// M_GROUPED_MXFP8_NT_F16_ROWS reads one exponent byte per row of A (shared by both sets) and per
// row of each B.
inline void exponent_operands(gemm::GroupedArgs& args, uintptr_t a_exponent,
                              uintptr_t b_exponent, uintptr_t b2_exponent) {
  namespace check = gemm_checks;
  if (args.kind != gemm::Kind::M_GROUPED_MXFP8_NT_F16_ROWS) {
    check::require(a_exponent == 0 && b_exponent == 0 && b2_exponent == 0,
                   "`a_exponent`, `b_exponent` and `b2_exponent` are for "
                   "M_GROUPED_MXFP8_NT_F16_ROWS only (must be 0)");
    return;
  }
  check::address("a_exponent", a_exponent);
  check::address("b_exponent", b_exponent);
  args.sets[0].a_exponent = reinterpret_cast<const void*>(a_exponent);
  args.sets[0].b_exponent = reinterpret_cast<const void*>(b_exponent);
  if (args.num_sets == 2) {
    check::require(args.sets[1].a == args.sets[0].a,
                   "M_GROUPED_MXFP8_NT_F16_ROWS's second set reads the same rows (`a2` = `a`): "
                   "they share `a_exponent`");
    check::address("b2_exponent", b2_exponent);
    args.sets[1].a_exponent = args.sets[0].a_exponent;
    args.sets[1].b_exponent = reinterpret_cast<const void*>(b2_exponent);
  } else {
    check::require(b2_exponent == 0, "`b2_exponent` must be 0 without a second set");
  }
}

// M_GROUPED_BF16_NT_SWIGLU writes gate (d), up (d2) and hidden from one activation with SwiGLU's
// clamp.
inline void swiglu_operands(gemm::GroupedArgs& args, uintptr_t hidden, bool has_limit,
                            float limit) {
  namespace check = gemm_checks;
  if (args.kind != gemm::Kind::M_GROUPED_BF16_NT_SWIGLU) {
    check::require(hidden == 0 && !has_limit,
                   "`hidden` and `has_limit` are for M_GROUPED_BF16_NT_SWIGLU only (must be 0 "
                   "and False)");
    return;
  }
  check::require(args.num_sets == 2 && args.sets[0].a == args.sets[1].a,
                 "M_GROUPED_BF16_NT_SWIGLU needs the up set (`a2` = `a`, `b2`, `d2`) beside the "
                 "gate set");
  check::address("hidden", hidden);
  args.hidden = reinterpret_cast<void*>(hidden);
  check::require(args.n % 128 == 0,
                 "M_GROUPED_BF16_NT_SWIGLU needs `n` a multiple of 128, got " +
                     std::to_string(args.n));
  check::require(!has_limit || (std::isfinite(limit) && limit >= 0.0f),
                 "`limit` must be finite and >= 0 with `has_limit`, got " + std::to_string(limit));
  args.has_limit = has_limit;
  args.limit = limit;
}

// The pull into `a` that runs beside the GEMM (comm_overlapped_pull): its rows are A's.
inline comm::PullArgs overlapped_pull(gemm::GroupedArgs& args, const comm::PullArgs& pull) {
  namespace check = gemm_checks;
  check::require(gemm::waits_for_rows(args.kind),
                 "`pull` runs beside M_GROUPED_BF16_NT or M_GROUPED_BF16_NN_F32 only");
  check::require(pull.row_bytes == args.k * 2,
                 "`pull`'s rows must be a's (k bf16 values, " + std::to_string(args.k * 2) +
                     " bytes), got " + std::to_string(pull.row_bytes) + " bytes");
  comm::PullArgs into_a = pull;
  into_a.out = const_cast<void*>(args.sets[0].a);
  args.arrivals = pull.arrivals;
  args.launch_pull = [](const void* p, cudaStream_t stream) {
    return comm::launch_pull(*static_cast<const comm::PullArgs*>(p), stream);
  };
  return into_a;
}

inline void grouped_gemm(int kind, uintptr_t a, uintptr_t b, uintptr_t d, uintptr_t a2,
                         uintptr_t b2, uintptr_t d2, uintptr_t rows, uintptr_t row_source,
                         int experts, int64_t n, int64_t k, int64_t total_rows, int sm_count,
                         uintptr_t scratch, int64_t scratch_bytes, uintptr_t stream,
                         uintptr_t b_scale, uintptr_t b2_scale, uintptr_t hidden,
                         bool has_limit, float limit, uintptr_t a_exponent,
                         uintptr_t b_exponent, uintptr_t b2_exponent,
                         const comm::PullArgs* pull) {
  namespace check = gemm_checks;
  require_grouped_gemm();
  gemm::GroupedArgs args;
  args.kind = check::kind(kind);
  const bool paired = gemm::pairs_along_k(args.kind);
  args.sets[0] = check::operand_set("", true, a, b, d);
  const bool second = a2 != 0 || b2 != 0 || d2 != 0;
  check::require(second || !paired,
                 std::string(check::kPairVariants) + " need their second pair (`a2`, `b2`)");
  if (second) args.sets[1] = check::operand_set("2", !paired, a2, b2, d2);
  args.num_sets = second ? 2 : 1;
  check::require(rows != 0 && rows % 4 == 0,
                 "`rows` must be a 4-byte aligned device address, got " + std::to_string(rows));
  args.rows = reinterpret_cast<const int32_t*>(rows);
  check::require(row_source % 4 == 0,
                 "`row_source` must be 0 or a 4-byte aligned device address, got " +
                     std::to_string(row_source));
  args.row_source = reinterpret_cast<const int32_t*>(row_source);
  const bool one_group = paired || args.kind == gemm::Kind::M_GROUPED_BF16_NT_SWIGLU;
  const int groups_per_expert = one_group ? 1 : args.num_sets;
  check::require(experts >= 1 && experts * groups_per_expert <= 1024,
                 "`experts` times the groups per expert must be in [1, 1024], got " +
                     std::to_string(experts) + " x " + std::to_string(groups_per_expert));
  args.experts = experts;
  check::extent("n", n);
  check::extent("k", k);
  check::require(!paired || k % gemm::kTileK == 0,
                 "`k` must be a multiple of " + std::to_string(gemm::kTileK) +
                     " for " + check::kPairVariants + " (each pair's tiles are whole), got " +
                     std::to_string(k));
  args.n = n;
  args.k = k;
  check::require(total_rows >= 0,
                 "`total_rows` must be non-negative, got " + std::to_string(total_rows));
  args.total_rows = total_rows;
  mx_weight_operands(args, b_scale, b2_scale);
  exponent_operands(args, a_exponent, b_exponent, b2_exponent);
  swiglu_operands(args, hidden, has_limit, limit);
  check::require(sm_count >= 0, "`sm_count` must be >= 0 (0 = every SM), got " +
                                    std::to_string(sm_count));
  args.sm_count = sm_count;
  check::require(scratch != 0 && scratch % 128 == 0,
                 "`scratch` must be a 128-byte aligned device address, got " +
                     std::to_string(scratch));
  args.scratch = reinterpret_cast<void*>(scratch);
  check::require(scratch_bytes > 0, "`scratch_bytes` must be positive");
  args.scratch_bytes = static_cast<size_t>(scratch_bytes);
  comm::PullArgs into_a;
  if (pull != nullptr) {
    into_a = overlapped_pull(args, *pull);
    args.pull = &into_a;
  }
  check_cuda(gemm::launch_grouped(args, reinterpret_cast<cudaStream_t>(stream)),
             "grouped GEMM launch (is `scratch_bytes` at least grouped_gemm_scratch_bytes?)");
}

inline void bind_gemm(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("grouped_gemm_available", &gemm::available,
        "True in the module that carries the Hopper grouped GEMMs (sm_90a).");
  m.def("grouped_gemm_scratch_bytes", &grouped_gemm_scratch_bytes, py::arg("kind"),
        py::arg("groups"), py::arg("sm_count"),
        "Device scratch bytes one grouped_gemm launch of `groups` groups needs.");
  m.def("grouped_gemm", &grouped_gemm, py::arg("kind"), py::arg("a"), py::arg("b"), py::arg("d"),
        py::arg("a2"), py::arg("b2"), py::arg("d2"), py::arg("rows"),
        py::arg("row_source"), py::arg("experts"), py::arg("n"), py::arg("k"),
        py::arg("total_rows"), py::arg("sm_count"), py::arg("scratch"), py::arg("scratch_bytes"),
        py::arg("stream"), py::arg("b_scale") = 0, py::arg("b2_scale") = 0,
        py::arg("hidden") = 0, py::arg("has_limit") = false, py::arg("limit") = 0.0f,
        py::arg("a_exponent") = 0, py::arg("b_exponent") = 0, py::arg("b2_exponent") = 0,
        py::arg("pull") = nullptr,
        R"doc(Grouped GEMM over the schedule's expert segments on `stream` (asynchronous).

`rows` int32 [experts]: padded rows per expert (device). Segment e starts at sum(rows[:e]).
`row_source` int32 [sum(rows)] (or 0): the schedule's source rank per row, -1 for padding; a
segment's rows after its last routed one then get no tiles (zero rows in d, left out of the
K-grouped sums). `kind`, named by grouping, precision and layout (A @ B, each taken as stored, N,
or transposed, T):
0 M_GROUPED_BF16_NT: d[seg] bf16 [R, n] = a[seg] bf16 [R, k] @ b[e]^T, b bf16 [E, n, k]
1 M_GROUPED_BF16_NN_F32: d[seg] fp32 [R, n] = a[seg] @ b[e], b bf16 [E, k, n]
2 M_GROUPED_BF16_NN_PAIR: d[seg] bf16 = a[seg] @ b[e] + a2[seg] @ b2[e] (b, b2 [E, k, n]; d2 = 0;
k a multiple of 64)
3 K_GROUPED_BF16_TN: d[e] bf16 [k, n] = a[seg]^T @ b[seg], a bf16 [rows, k], b bf16 [rows, n];
zeros if R = 0
4 M_GROUPED_MXFP8_NT: 0 with b (and b2) MXFP8 weights: float8_e4m3fn [E, n, k] bytes and
`b_scale` (`b2_scale`) their scale tiles as mxfp8_quantize writes them; n and k multiples of 128
5 M_GROUPED_BF16_NT_SWIGLU: 0's gate (a, b, d) and up (a2 = a, b2, d2) in one launch, plus
`hidden` bf16 [R, n] = silu(min(gate, L)) * clamp(up, -L, L) of the stored bf16 gate and up
(L = `limit` if `has_limit`); n a multiple of 128
6 M_GROUPED_MXFP8_NT_F16_ROWS: 4 with a float16 [R, k] rebased per row, `a_exponent` uint8
[R + 272] its rows' exponents (row r's values are a[r] * 2^(a_exponent[r] - 127); 272 bytes of
padding), `b_scale` (`b2_scale`) the weights' f16 factor tiles (2^(scale byte - weight row
exponent), the scale tiles' layout) and `b_exponent` (`b2_exponent`) uint8 [E * n] the weight
rows' exponents
7 M_GROUPED_MXFP8_NT_F32: 4 with d fp32 (the unrounded sums)
8 M_GROUPED_MXFP8_NT_PAIR: 2 with b and b2 MXFP8 weights as in 4, each [E, n, k] (k a multiple
of 128)
9 K_GROUPED_MXFP8_TN: 3 with b MXFP8 as stored: float8_e4m3fn [n, total_rows] (b's rows
transposed, blocks of 32 rows) and `b_scale` its scale tiles; n, k and total_rows multiples of
128, every segment starting at a multiple of 128 rows (else that expert's d is NaN)
The M-grouped kinds also zero their outputs' rows from sum(rows) to total_rows (0 = leave them).
A second operand set (a2, b2, d2; all 0 if unused) runs in the same launch. n and k must be
multiples of 8 and every address 16-byte aligned. `pull` (kinds 0 and 1: an OverlappedPull from
comm_overlapped_pull) pulls a's rows beside the GEMM, which loads each tile once its rows have
arrived.)doc");
}

}  // namespace mok::api
