// libnattn's cached device queries (csrc/src/lookup.cu), for the host code of the launchers
// too: each attribute is asked once per device.
#pragma once
#include <stddef.h>

namespace nattn { namespace host {

int device_cc(int device);           // 10 * major + minor, 0 when unknown
int device_sms(int device);          // streaming multiprocessors, 0 when unknown
int device_smem_per_sm(int device);  // shared memory of an SM in bytes, 0 when unknown

// With NATTN_POISON_WORKSPACES=1 (the GPU tests set it; read per call) a stream-ordered
// workspace that kernels fill before others read it (split-KV partials, the zero-padded
// copies) starts as 0xFF bytes, NaN in every float format: a row nothing wrote shows up as
// NaN in the results on every run. Otherwise nothing. `stream`: a cudaStream_t.
void poison_workspace(void* ptr, size_t bytes, void* stream);

}  }  // namespace nattn::host
