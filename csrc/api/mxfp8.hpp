// Python binding of the MXFP8 quantize family: argument checks, then one launch.
//
// Arguments are raw device addresses (Python ints) and a cudaStream_t as an int, so the module has
// no torch dependency; mok/backends/cuda/mxfp8.py allocates the tensors and passes their
// data_ptr().
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>

#include "api/checks.hpp"
#include "common/cuda_check.hpp"
#include "mxfp8/mxfp8.h"

namespace mok::api {

namespace py = pybind11;

using checks::require;

// Device addresses must be 16-byte aligned: the kernel moves data in 16-byte vectors.
inline void check_pointer(const char* name, uintptr_t address) {
  require(address % 16 == 0,
          std::string("`") + name + "` must be 16-byte aligned, got address " +
              std::to_string(address));
}

inline void check_extent(const char* name, int64_t value, int64_t multiple) {
  require(value >= 0 && value % multiple == 0,
          std::string("`") + name + "` must be a non-negative multiple of " +
              std::to_string(multiple) + ", got " + std::to_string(value));
}

// Both buffers of a layout are given, or neither.
inline bool check_pair(const char* data, uintptr_t data_ptr, const char* scale,
                       uintptr_t scale_ptr) {
  require((data_ptr == 0) == (scale_ptr == 0),
          std::string("`") + data + "` and `" + scale + "` must both be given or both be 0");
  check_pointer(data, data_ptr);
  check_pointer(scale, scale_ptr);
  return data_ptr != 0;
}

// rows x cols tiles of `experts` matrices, within what one launch's grid can hold.
inline void check_tiles(int64_t experts, int64_t rows, int64_t cols) {
  require(experts >= 1, "`experts` must be >= 1, got " + std::to_string(experts));
  check_extent("rows", rows, mxfp8::kTile);
  check_extent("cols", cols, mxfp8::kTile);
  const int64_t tiles_per_expert = (rows / mxfp8::kTile) * (cols / mxfp8::kTile);
  require(tiles_per_expert == 0 ||
              experts <= std::numeric_limits<int32_t>::max() / tiles_per_expert,
          "too many 128x128 tiles for one launch: experts=" + std::to_string(experts) +
              ", rows=" + std::to_string(rows) + ", cols=" + std::to_string(cols));
}

// An optional device int32 count (0 = none).
inline const int32_t* optional_count(const char* name, uintptr_t address) {
  if (address != 0) checks::address(name, address, 4);
  return reinterpret_cast<const int32_t*>(address);
}

inline void mxfp8_quantize(uintptr_t x, uintptr_t out, uintptr_t scale, uintptr_t out_t,
                           uintptr_t scale_t, uintptr_t rounded, uintptr_t rounded_rows,
                           uintptr_t used_rows, int64_t experts, int64_t rows, int64_t cols,
                           uintptr_t stream, uintptr_t row_scale) {
  require(x != 0, "`x` must be a device address, got 0");
  check_pointer("x", x);
  const bool normal = check_pair("out", out, "scale", scale);
  const bool transposed = check_pair("out_t", out_t, "scale_t", scale_t);
  check_pointer("rounded", rounded);
  check_pointer("rounded_rows", rounded_rows);
  const bool others = normal || transposed || rounded != 0;
  require(others || rounded_rows != 0,
          "at least one of `out`, `out_t`, `rounded` and `rounded_rows` must be given");
  require(!others || rounded_rows == 0,
          "`rounded_rows` is written alone: `out`, `out_t` and `rounded` must then be 0");
  require(row_scale == 0 || rounded_rows != 0,
          "`row_scale` scales the rows of `rounded_rows` only: give `rounded_rows` with it");
  if (row_scale != 0) checks::address("row_scale", row_scale, 4);
  check_tiles(experts, rows, cols);

  mxfp8::QuantizeArgs args;
  args.x = reinterpret_cast<const void*>(x);
  args.out = reinterpret_cast<void*>(out);
  args.scale = reinterpret_cast<void*>(scale);
  args.out_t = reinterpret_cast<void*>(out_t);
  args.scale_t = reinterpret_cast<void*>(scale_t);
  args.rounded = reinterpret_cast<void*>(rounded);
  args.rounded_rows = reinterpret_cast<void*>(rounded_rows);
  args.row_scale = reinterpret_cast<const float*>(row_scale);
  args.used_rows = optional_count("used_rows", used_rows);
  args.experts = experts;
  args.rows = rows;
  args.cols = cols;
  check_cuda(mxfp8::launch_quantize(args, reinterpret_cast<cudaStream_t>(stream)),
             "mxfp8_quantize kernel launch");
}

inline void mxfp8_swiglu_quantize(uintptr_t gate, uintptr_t up, uintptr_t hidden_rounded,
                                  uintptr_t hidden_t, uintptr_t hidden_scale_t, uintptr_t gate_q,
                                  uintptr_t gate_scale, uintptr_t up_q, uintptr_t up_scale,
                                  uintptr_t num_tokens, uintptr_t used_rows, int64_t rows,
                                  int64_t inter, bool has_limit, float limit, uintptr_t stream) {
  check_tiles(1, rows, inter);
  const auto buffer = [](const char* name, uintptr_t address) {
    checks::address(name, address, 16);
    return reinterpret_cast<void*>(address);
  };
  mxfp8::SwigluQuantizeArgs args;
  args.gate = buffer("gate", gate);
  args.up = buffer("up", up);
  args.hidden_rounded = buffer("hidden_rounded", hidden_rounded);
  args.hidden_t = buffer("hidden_t", hidden_t);
  args.hidden_scale_t = buffer("hidden_scale_t", hidden_scale_t);
  args.gate_q = buffer("gate_q", gate_q);
  args.gate_scale = buffer("gate_scale", gate_scale);
  args.up_q = buffer("up_q", up_q);
  args.up_scale = buffer("up_scale", up_scale);
  checks::address("num_tokens", num_tokens, 4);
  args.num_tokens = reinterpret_cast<const int32_t*>(num_tokens);
  args.used_rows = optional_count("used_rows", used_rows);
  args.rows = rows;
  args.inter = inter;
  args.has_limit = has_limit;
  args.limit = limit;
  check_cuda(mxfp8::launch_swiglu_quantize(args, reinterpret_cast<cudaStream_t>(stream)),
             "mxfp8_swiglu_quantize kernel launch");
}

inline void mxfp8_dequantize(uintptr_t data, uintptr_t scale, uintptr_t out, int64_t rows,
                             int64_t cols, bool transposed, int64_t experts, uintptr_t stream) {
  checks::address("data", data, 16);
  checks::address("scale", scale, 16);
  checks::address("out", out, 16);
  check_extent("rows", rows, mxfp8::kTile);
  check_extent("cols", cols, mxfp8::kTile);
  require(experts >= 1 && rows % (experts * mxfp8::kTile) == 0,
          "`experts` must be >= 1 and divide `rows` into multiples of 128, got experts=" +
              std::to_string(experts) + ", rows=" + std::to_string(rows));
  require(rows / 64 <= 65535, "`rows` must be at most 64 * 65535, got " + std::to_string(rows));
  mxfp8::DequantizeArgs args;
  args.data = reinterpret_cast<const void*>(data);
  args.scale = reinterpret_cast<const void*>(scale);
  args.out = reinterpret_cast<void*>(out);
  args.rows = rows;
  args.cols = cols;
  args.transposed = transposed;
  args.experts = experts;
  check_cuda(mxfp8::launch_dequantize(args, reinterpret_cast<cudaStream_t>(stream)),
             "mxfp8_dequantize kernel launch");
}

inline void mxfp8_rebase_weight(uintptr_t scale, uintptr_t factors, uintptr_t row_exponents,
                                int64_t rows, int64_t cols, uintptr_t stream) {
  checks::address("scale", scale, 16);
  checks::address("factors", factors, 16);
  checks::address("row_exponents", row_exponents, 16);
  check_extent("rows", rows, mxfp8::kTile);
  check_extent("cols", cols, mxfp8::kTile);
  mxfp8::RebaseWeightArgs args;
  args.scale = reinterpret_cast<const void*>(scale);
  args.factors = reinterpret_cast<void*>(factors);
  args.row_exponents = reinterpret_cast<void*>(row_exponents);
  args.rows = rows;
  args.cols = cols;
  check_cuda(mxfp8::launch_rebase_weight(args, reinterpret_cast<cudaStream_t>(stream)),
             "mxfp8_rebase_weight kernel launch");
}

inline void mxfp8_row_exponents(uintptr_t x, uintptr_t out, int64_t rows, int64_t cols,
                                uintptr_t stream) {
  checks::address("x", x, 16);
  checks::address("out", out, 1);
  require(rows >= 0, "`rows` must be non-negative, got " + std::to_string(rows));
  check_extent("cols", cols, 8);
  mxfp8::RowExponentsArgs args;
  args.x = reinterpret_cast<const void*>(x);
  args.out = reinterpret_cast<void*>(out);
  args.rows = rows;
  args.cols = cols;
  check_cuda(mxfp8::launch_row_exponents(args, reinterpret_cast<cudaStream_t>(stream)),
             "mxfp8_row_exponents kernel launch");
}

inline void bind_mxfp8(py::module_& m) {
  m.def("mxfp8_quantize", &mxfp8_quantize, py::arg("x"), py::arg("out"), py::arg("scale"),
        py::arg("out_t"), py::arg("scale_t"), py::arg("rounded"), py::arg("rounded_rows"),
        py::arg("used_rows"), py::arg("experts"), py::arg("rows"), py::arg("cols"),
        py::arg("stream"), py::arg("row_scale") = 0,
        R"doc(Quantize bf16 [experts, rows, cols] to MXFP8 on `stream` (asynchronous).

All buffers are device addresses (0 = layout not wanted), contiguous, 16-byte aligned:
  x        bf16  [experts, rows, cols]
  out      fp8   [experts, rows, cols]       scale    uint8 [experts*rows/128, cols/128, 32, 16]
  out_t    fp8   [experts, cols, rows]       scale_t  uint8 [experts*cols/128, rows/128, 32, 16]
  rounded  bf16  [experts, rows, cols]: the normal layout's values, bf16(e4m3 * 2^(scale-127))
  rounded_rows  bf16 [experts, rows, cols]: the transposed layout's values (only output)
  row_scale     fp32 [experts*rows], with rounded_rows only: x's row r taken as
                bf16(row_scale[r] * x[r]) first (scale_rows's product)
used_rows: 0, or an int32 [1] on the device; 128-row tiles at or past it write nothing.
rows and cols must be multiples of 128. Raises ValueError for bad arguments and RuntimeError
for a CUDA error.)doc");
  m.def("mxfp8_swiglu_quantize", &mxfp8_swiglu_quantize, py::arg("gate"), py::arg("up"),
        py::arg("hidden_rounded"), py::arg("hidden_t"), py::arg("hidden_scale_t"),
        py::arg("gate_q"), py::arg("gate_scale"), py::arg("up_q"), py::arg("up_scale"),
        py::arg("num_tokens"), py::arg("used_rows"), py::arg("rows"), py::arg("inter"),
        py::arg("has_limit"), py::arg("limit"), py::arg("stream"),
        R"doc(The MXFP8 forward's SwiGLU in one pass: from bf16 gate and up [rows, inter],
hidden = swiglu(gate, up) (0 for rows >= *num_tokens) as its rounded bf16 values and its
transposed pair, and gate and up quantized (normal layout); bit for bit the swiglu kernel
followed by mxfp8_quantize. rows and inter multiples of 128, addresses 16-byte aligned.)doc");
  m.def("mxfp8_dequantize", &mxfp8_dequantize, py::arg("data"), py::arg("scale"), py::arg("out"),
        py::arg("rows"), py::arg("cols"), py::arg("transposed"), py::arg("experts"), py::arg("stream"),
        R"doc(MXFP8 -> bf16 on `stream`: out = bf16(data * 2^(scale - 127)), rounded to nearest even.

data fp8 [rows, cols] (blocks of 32 along cols), scale uint8 [rows/128, cols/128, 32, 16]
swizzled, out bf16 [rows, cols]; rows and cols multiples of 128, addresses 16-byte aligned.
transposed: data is [experts, rows/experts, cols] and out [experts, cols, rows/experts].)doc");
  m.def("mxfp8_rebase_weight", &mxfp8_rebase_weight, py::arg("scale"), py::arg("factors"),
        py::arg("row_exponents"), py::arg("rows"), py::arg("cols"), py::arg("stream"),
        R"doc(An MXFP8 weight's operands for the f16 GEMM (M_GROUPED_MXFP8_NT_F16_ROWS)
on `stream`: from its scale tiles `scale` uint8 [rows/128, cols/128, 32, 16], `row_exponents`
uint8 [rows] (each row's largest scale byte other than 255, minus 7, at least 0) and `factors`
f16 in the scale tiles' layout (2^(E - R), 0 below 2^-24, NaN for E = 255). rows and cols
multiples of 128, addresses 16-byte aligned.)doc");
  m.def("mxfp8_row_exponents", &mxfp8_row_exponents, py::arg("x"), py::arg("out"),
        py::arg("rows"), py::arg("cols"), py::arg("stream"),
        R"doc(Each row's exponent byte for the f16 GEMM (M_GROUPED_MXFP8_NT_F16_ROWS) on
`stream`: x bf16 [rows, cols] (cols a multiple of 8, 16-byte aligned), out uint8 [rows] =
max(biased exponent of the row's largest |x| - 14, 0): the row's largest times 2^(127 - R) is in
[2^14, 2^15).)doc");
}

}  // namespace mok::api
