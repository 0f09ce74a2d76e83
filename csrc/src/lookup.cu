// See lookup.h.
#include "lookup.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

namespace nattn { namespace host {

const nattn::KernelEntry* find_kernel(const char* family, int dtype, int na_dim, int dim) {
  const nattn::KernelEntry* best = nullptr;
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const nattn::KernelEntry& e = nattn::kKernels[i];
    // the integer tests first: a strcmp on each of the table's entries cost ~1 us a lookup
    if (e.dtype != dtype || e.na_dim != na_dim || !e.family || strcmp(e.family, family)) continue;
    if (e.head_dim >= dim && (!best || e.head_dim < best->head_dim)) best = &e;
  }
  return best;
}

// NATTN_FAMILY caps the family libnattn picks, for A/B measurements and for testing every
// family on one GPU: simt, tc, or sm90 (which also makes a forward that the Hopper family
// declines an error naming the reason). Unset, the most specialised family that takes a
// problem runs. Read on every call (a getenv), so a process can switch between runs.
int family_cap() {
  const char* f = getenv("NATTN_FAMILY");
  if (!f || !*f) return kCapAny;
  return !strcmp(f, "simt") ? kCapSimt : !strcmp(f, "tc") ? kCapTc : !strcmp(f, "sm90") ? kCapSm90Only : kCapAny;
}

void poison_workspace(void* ptr, size_t bytes, void* stream) {
  const char* on = getenv("NATTN_POISON_WORKSPACES");
  if (on && !strcmp(on, "1")) cudaMemsetAsync(ptr, 0xFF, bytes, static_cast<cudaStream_t>(stream));
}

// Compute capability of a device as 10 * major + minor (0 when unknown), asked once.
int device_cc(int device) {
  static int cc[64] = {0};  // 0: not asked yet, -1: failed
  if (device < 0 || device >= 64) return 0;
  if (!cc[device]) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
      cc[device] = -1;
    else
      cc[device] = 10 * major + minor;
  }
  return cc[device] > 0 ? cc[device] : 0;
}

// Streaming multiprocessors of a device (0 when unknown), asked once.
int device_sms(int device) {
  static int sms[64] = {0};  // 0: not asked yet, -1: failed
  if (device < 0 || device >= 64) return 0;
  if (!sms[device] && cudaDeviceGetAttribute(&sms[device], cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    sms[device] = -1;
  return sms[device] > 0 ? sms[device] : 0;
}

// Shared memory of one of a device's SMs in bytes (0 when unknown), asked once.
int device_smem_per_sm(int device) {
  static int bytes[64] = {0};  // 0: not asked yet, -1: failed
  if (device < 0 || device >= 64) return 0;
  if (!bytes[device] &&
      cudaDeviceGetAttribute(&bytes[device], cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess)
    bytes[device] = -1;
  return bytes[device] > 0 ? bytes[device] : 0;
}

// The tensor-core family runs on SM80+ (its code is built for every arch from 8.0).
bool tc_allowed(int device) { return family_cap() >= kCapTc && device_cc(device) >= 80; }

// The Hopper family's code is sm_90a: it runs on compute capability 9.0 exactly.
bool sm90_allowed(int device) { return family_cap() >= kCapAny && device_cc(device) == 90; }

}  }  // namespace nattn::host
