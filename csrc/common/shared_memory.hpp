// A kernel's dynamic shared memory above 48 KiB, allowed once per device.
//
// The allowance is a function attribute of the device's context, so it is set on a kernel's first
// launch on each device rather than before every launch: a host call less on the launch path.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

namespace mok {

// Tag names the kernel: each tag has its own table of devices already allowed. Devices beyond the
// table are allowed on every launch, which is correct, only slower.
template <typename Tag, typename KernelFunction>
cudaError_t allow_dynamic_shared_memory(KernelFunction kernel, int bytes, int device) {
  constexpr int kDevices = 64;
  static std::array<std::atomic<bool>, kDevices> allowed{};
  const bool cached = device >= 0 && device < kDevices;
  if (cached && allowed[device].load(std::memory_order_acquire)) return cudaSuccess;
  if (bytes >= (48 << 10)) {
    const cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (status != cudaSuccess) return status;
  }
  if (cached) allowed[device].store(true, std::memory_order_release);
  return cudaSuccess;
}

}  // namespace mok
