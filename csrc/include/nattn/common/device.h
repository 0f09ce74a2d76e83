// libnattn's cached device queries (csrc/src/lookup.cu), for the host code of the launchers
// too: each attribute is asked once per device.
#pragma once

namespace nattn { namespace host {

int device_cc(int device);           // 10 * major + minor, 0 when unknown
int device_sms(int device);          // streaming multiprocessors, 0 when unknown
int device_smem_per_sm(int device);  // shared memory of an SM in bytes, 0 when unknown

}  }  // namespace nattn::host
