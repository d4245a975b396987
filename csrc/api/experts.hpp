// Python binding of the expert elementwise kernels: argument checks, then one launch each.
//
// Addresses are raw device pointers (Python ints) and the stream a cudaStream_t as an int;
// mok/backends/cuda/elementwise.py allocates the outputs with torch.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "api/checks.hpp"
#include "common/cuda_check.hpp"
#include "experts/experts.h"

namespace mok::api {

namespace expert_checks {

namespace py = pybind11;

using checks::require;


inline void extents(int64_t rows, const char* cols_name, int64_t cols) {
  require(rows >= 0 && rows < (int64_t{1} << 31),
          "`rows` must be in [0, 2^31), got " + std::to_string(rows));
  require(cols > 0 && cols % 8 == 0, std::string("`") + cols_name +
                                         "` must be a positive multiple of 8, got " +
                                         std::to_string(cols));
}

template <class T>
const T* in(const char* name, uintptr_t value, uintptr_t alignment = 16) {
  checks::address(name, value, alignment);
  return reinterpret_cast<const T*>(value);
}

template <class T>
T* out(const char* name, uintptr_t value, uintptr_t alignment = 16) {
  checks::address(name, value, alignment);
  return reinterpret_cast<T*>(value);
}

// The fields both SwiGLU directions share: used rows, extents and the clamp.
template <class Args>
void swiglu_shape(Args& args, uintptr_t num_tokens, int64_t rows, int64_t inter, bool has_limit,
                  float limit) {
  extents(rows, "inter", inter);
  args.num_tokens = in<int32_t>("num_tokens", num_tokens, 4);
  args.rows = rows;
  args.inter = inter;
  args.has_limit = has_limit;
  args.limit = limit;
}

// swiglu_backward's optional MXFP8 gate and up: both scale tiles or neither, whole 128 x 128
// tiles (the swizzled layout's unit).
inline void mxfp8_inputs(experts::SwigluBackwardArgs& args, uintptr_t gate_scale,
                         uintptr_t up_scale) {
  require((gate_scale == 0) == (up_scale == 0),
          "`gate_scale` and `up_scale` must be given together (MXFP8 gate and up) or both be 0");
  if (gate_scale == 0) return;
  require(args.rows % 128 == 0 && args.inter % 128 == 0,
          "MXFP8 gate and up need `rows` and `inter` multiples of 128, got rows=" +
              std::to_string(args.rows) + ", inter=" + std::to_string(args.inter));
  args.gate_scale = in<void>("gate_scale", gate_scale);
  args.up_scale = in<void>("up_scale", up_scale);
}

}  // namespace expert_checks

inline void swiglu(uintptr_t gate, uintptr_t up, uintptr_t hidden, uintptr_t num_tokens,
                   int64_t rows, int64_t inter, bool has_limit, float limit, bool zero_rest,
                   uintptr_t stream) {
  namespace check = expert_checks;
  experts::SwigluArgs args;
  check::swiglu_shape(args, num_tokens, rows, inter, has_limit, limit);
  args.gate = check::in<void>("gate", gate);
  args.up = check::in<void>("up", up);
  args.hidden = check::out<void>("hidden", hidden);
  args.zero_rest = zero_rest;
  check_cuda(experts::launch_swiglu(args, reinterpret_cast<cudaStream_t>(stream)),
             "swiglu kernel launch");
}

inline void swiglu_backward(uintptr_t d_h, uintptr_t router_weight, uintptr_t gate, uintptr_t up,
                            uintptr_t hidden, uintptr_t d_gate, uintptr_t d_up,
                            uintptr_t d_hidden, uintptr_t d_router_weight, uintptr_t num_tokens,
                            int64_t rows, int64_t inter, bool has_limit, float limit,
                            bool zero_rest, uintptr_t stream, uintptr_t scaled_hidden,
                            uintptr_t gate_scale, uintptr_t up_scale) {
  namespace check = expert_checks;
  experts::SwigluBackwardArgs args;
  check::swiglu_shape(args, num_tokens, rows, inter, has_limit, limit);
  args.d_h = check::in<float>("d_h", d_h);
  args.router_weight = check::in<float>("router_weight", router_weight, 4);
  args.gate = check::in<void>("gate", gate);
  args.up = check::in<void>("up", up);
  check::mxfp8_inputs(args, gate_scale, up_scale);
  args.hidden = check::in<void>("hidden", hidden);
  args.d_gate = check::out<void>("d_gate", d_gate);
  args.d_up = check::out<void>("d_up", d_up);
  if (d_hidden != 0) args.d_hidden = check::out<void>("d_hidden", d_hidden);  // 0: not written
  args.d_router_weight = check::out<float>("d_router_weight", d_router_weight, 4);
  if (scaled_hidden != 0) args.scaled_hidden = check::out<void>("scaled_hidden", scaled_hidden);
  args.zero_rest = zero_rest;
  check_cuda(experts::launch_swiglu_backward(args, reinterpret_cast<cudaStream_t>(stream)),
             "swiglu_backward kernel launch");
}

inline void scale_rows(uintptr_t x, uintptr_t weight, uintptr_t out, uintptr_t num_tokens,
                       int64_t rows, int64_t cols, bool zero_rest, uintptr_t stream) {
  namespace check = expert_checks;
  check::extents(rows, "cols", cols);
  experts::ScaleRowsArgs args;
  args.x = check::in<void>("x", x);
  args.weight = check::in<float>("weight", weight, 4);
  args.out = check::out<void>("out", out);
  args.num_tokens = check::in<int32_t>("num_tokens", num_tokens, 4);
  args.rows = rows;
  args.cols = cols;
  args.zero_rest = zero_rest;
  check_cuda(experts::launch_scale_rows(args, reinterpret_cast<cudaStream_t>(stream)),
             "scale_rows kernel launch");
}

inline void bind_experts(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("swiglu", &swiglu, py::arg("gate"), py::arg("up"), py::arg("hidden"),
        py::arg("num_tokens"), py::arg("rows"), py::arg("inter"), py::arg("has_limit"),
        py::arg("limit"), py::arg("zero_rest"), py::arg("stream"),
        "hidden = bf16(silu(min(gate, L)) * clamp(up, -L, L)) for rows < *num_tokens; rows after "
        "are zeroed when zero_rest, else left untouched.");
  m.def("swiglu_backward", &swiglu_backward, py::arg("d_h"), py::arg("router_weight"),
        py::arg("gate"), py::arg("up"), py::arg("hidden"), py::arg("d_gate"), py::arg("d_up"),
        py::arg("d_hidden"), py::arg("d_router_weight"), py::arg("num_tokens"), py::arg("rows"),
        py::arg("inter"), py::arg("has_limit"), py::arg("limit"), py::arg("zero_rest"),
        py::arg("stream"), py::arg("scaled_hidden") = 0, py::arg("gate_scale") = 0,
        py::arg("up_scale") = 0,
        R"doc(SwiGLU backward of rw * d_h and the router-weight gradient, per routed row.

d_h fp32 [rows, inter]; router_weight fp32 [rows]; gate, up, hidden bf16 [rows, inter], or gate
and up E4M3 with non-zero gate_scale and up_scale (their swizzled scale tiles, blocks along
inter; rows and inter multiples of 128), read as their mxfp8_dequantize values. Writes d_gate,
d_up, d_hidden = bf16(rw * d_h) (not with d_hidden 0) and d_router_weight[r] = sum_i d_h * hidden
(fp32, fixed order); with a non-zero scaled_hidden also bf16(rw * hidden) there (scale_rows of
hidden, bit for bit). Rows >= *num_tokens get d_router_weight 0 and, when zero_rest, zeros in
the other outputs (else those rows are left untouched).)doc");
  m.def("scale_rows", &scale_rows, py::arg("x"), py::arg("weight"), py::arg("out"),
        py::arg("num_tokens"), py::arg("rows"), py::arg("cols"), py::arg("zero_rest"),
        py::arg("stream"),
        "out[r] = bf16(weight[r] * x[r]) for rows < *num_tokens; rows after are zeroed when "
        "zero_rest, else left untouched (bf16 [rows, cols]).");
}

}  // namespace mok::api
