// Python binding of the MXFP8 quantize family: argument checks, then one launch.
//
// Arguments are raw device addresses (Python ints) and a cudaStream_t as an int, so the module has
// no torch dependency; mok/backends/cuda.py allocates the tensors and passes their data_ptr().
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <string>

#include "api/checks.hpp"
#include "common/cuda_check.hpp"
#include "mxfp8.h"

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

inline void mxfp8_quantize(uintptr_t x, uintptr_t out, uintptr_t scale, uintptr_t out_t,
                           uintptr_t scale_t, int64_t experts, int64_t rows, int64_t cols,
                           uintptr_t stream) {
  require(x != 0, "`x` must be a device address, got 0");
  check_pointer("x", x);
  const bool normal = check_pair("out", out, "scale", scale);
  const bool transposed = check_pair("out_t", out_t, "scale_t", scale_t);
  require(normal || transposed, "at least one of `out` and `out_t` must be given");
  require(experts >= 1, "`experts` must be >= 1, got " + std::to_string(experts));
  check_extent("rows", rows, mxfp8::kTile);
  check_extent("cols", cols, mxfp8::kTile);
  const int64_t tiles_per_expert = (rows / mxfp8::kTile) * (cols / mxfp8::kTile);
  require(tiles_per_expert == 0 ||
              experts <= std::numeric_limits<int32_t>::max() / tiles_per_expert,
          "too many 128x128 tiles for one launch: experts=" + std::to_string(experts) +
              ", rows=" + std::to_string(rows) + ", cols=" + std::to_string(cols));

  mxfp8::QuantizeArgs args;
  args.x = reinterpret_cast<const void*>(x);
  args.out = reinterpret_cast<void*>(out);
  args.scale = reinterpret_cast<void*>(scale);
  args.out_t = reinterpret_cast<void*>(out_t);
  args.scale_t = reinterpret_cast<void*>(scale_t);
  args.experts = experts;
  args.rows = rows;
  args.cols = cols;
  check_cuda(mxfp8::launch_quantize(args, reinterpret_cast<cudaStream_t>(stream)),
             "mxfp8_quantize kernel launch");
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

inline void bind_mxfp8(py::module_& m) {
  m.def("mxfp8_quantize", &mxfp8_quantize, py::arg("x"), py::arg("out"), py::arg("scale"),
        py::arg("out_t"), py::arg("scale_t"), py::arg("experts"), py::arg("rows"),
        py::arg("cols"), py::arg("stream"),
        R"doc(Quantize bf16 [experts, rows, cols] to MXFP8 on `stream` (asynchronous).

All buffers are device addresses (0 = layout not wanted), contiguous, 16-byte aligned:
  x        bf16  [experts, rows, cols]
  out      fp8   [experts, rows, cols]       scale    uint8 [experts*rows/128, cols/128, 32, 16]
  out_t    fp8   [experts, cols, rows]       scale_t  uint8 [experts*cols/128, rows/128, 32, 16]
rows and cols must be multiples of 128. Raises ValueError for bad arguments and RuntimeError
for a CUDA error.)doc");
  m.def("mxfp8_dequantize", &mxfp8_dequantize, py::arg("data"), py::arg("scale"), py::arg("out"),
        py::arg("rows"), py::arg("cols"), py::arg("transposed"), py::arg("experts"), py::arg("stream"),
        R"doc(MXFP8 -> bf16 on `stream`: out = bf16(data * 2^(scale - 127)), rounded to nearest even.

data fp8 [rows, cols] (blocks of 32 along cols), scale uint8 [rows/128, cols/128, 32, 16]
swizzled, out bf16 [rows, cols]; rows and cols multiples of 128, addresses 16-byte aligned.
transposed: data is [experts, rows/experts, cols] and out [experts, cols, rows/experts].)doc");
}

}  // namespace mok::api
