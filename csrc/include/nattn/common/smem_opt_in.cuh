// Opting kernels into more than 48 KiB of dynamic shared memory, once per device.
//
// cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize, ...) sets the limit
// for the current device only: a process that runs a kernel on a second GPU must set it
// there too, or that launch fails with "invalid argument". Each launcher keeps one mask per
// kernel instance, a bit per device, and sets the attribute the first time a device launches.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

namespace nattn {

// Runs `configure()` (the launcher's cudaFuncSetAttribute calls) unless it already succeeded
// on the current device. Devices past 63 configure on every launch (correct, ~1 us slower).
template <class F>
inline void once_per_device(std::atomic<uint64_t>& done, F&& configure) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    configure();
    return;
  }
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return;
  if (configure() && bit) done.fetch_or(bit, std::memory_order_acq_rel);
}

// One kernel's limit: `bytes` of dynamic shared memory (no call at 48 KiB or less).
template <typename K>
inline bool allow_smem(K kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return true;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess;
}

}  // namespace nattn
