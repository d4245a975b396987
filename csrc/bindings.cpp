// The extension module: one per architecture, named by the build (MOK_MODULE_NAME = _C_sm90a, ...).
// It only registers the API families; each family's checks and launches live in csrc/api/.
#include <pybind11/pybind11.h>

#include "api/comm.hpp"
#include "api/experts.hpp"
#include "api/gemm.hpp"
#include "api/info.hpp"
#include "api/mxfp8.hpp"
#include "api/schedule.hpp"

#ifndef MOK_MODULE_NAME
#error "MOK_MODULE_NAME must be defined by the build, e.g. _C_sm90a"
#endif

PYBIND11_MODULE(MOK_MODULE_NAME, m) {
  m.doc() = "mok CUDA kernels for " MOK_ARCH " (raw device pointers and streams; no torch)";
  mok::api::bind_info(m);
  mok::api::bind_mxfp8(m);
  mok::api::bind_schedule(m);
  mok::api::bind_comm(m);
  mok::api::bind_gemm(m);
  mok::api::bind_experts(m);
}
