// Host-side CUDA error handling shared by every API family.
//
// The module never aborts the Python process: every runtime call is checked and a failure becomes a
// C++ exception that pybind11 turns into a Python RuntimeError naming the call and the CUDA error.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace mok {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const char* what_call)
      : std::runtime_error(std::string("CUDA error in ") + what_call + ": " +
                           cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")"),
        code_(code) {}

  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

inline void check_cuda(cudaError_t code, const char* what_call) {
  if (code != cudaSuccess) {
    throw CudaError(code, what_call);
  }
}

}  // namespace mok

// Stringifies the call so the message says which runtime function failed.
#define MOK_CUDA_CHECK(call) ::mok::check_cuda((call), #call)
