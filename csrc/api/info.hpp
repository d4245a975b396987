// Python binding of the module's identity: version() and build_info().
//
// The build stamps these through -D definitions (tools/build/extension.bzl lists them), so a
// deployed binary says which architecture, compiler and commit produced it.
#pragma once

#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>

#include <string>

#ifndef MOK_VERSION
#define MOK_VERSION "0+unknown"
#endif
#ifndef MOK_ARCH
#error "MOK_ARCH must name the architecture this module is compiled for, e.g. sm_90a"
#endif
#ifndef MOK_NVCC_VERSION
#define MOK_NVCC_VERSION "unknown"
#endif
#ifndef MOK_GIT_COMMIT
#define MOK_GIT_COMMIT "unknown"
#endif

namespace mok::api {

namespace py = pybind11;

inline std::string cuda_version_text() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}

// The host compiler as the preprocessor sees it; nvcc compiles this file with the host compiler.
inline std::string host_compiler_text() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

inline py::dict build_info() {
  py::dict info;
  info["version"] = MOK_VERSION;
  info["arch"] = MOK_ARCH;
  info["archs"] = py::make_tuple(MOK_ARCH);
  info["cuda_version"] = cuda_version_text();
  info["nvcc_version"] = MOK_NVCC_VERSION;
  info["host_compiler"] = host_compiler_text();
  info["pybind11_version"] = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
                             std::to_string(PYBIND11_VERSION_MINOR) + "." +
                             std::to_string(PYBIND11_VERSION_PATCH);
  info["git_commit"] = MOK_GIT_COMMIT;
  return info;
}

inline void bind_info(py::module_& m) {
  m.def("version", [] { return std::string(MOK_VERSION); }, "The mok version this was built as.");
  m.def("build_info", &build_info,
        "Build facts: version, arch, archs, cuda_version, nvcc_version, host_compiler, "
        "pybind11_version, git_commit.");
}

}  // namespace mok::api
