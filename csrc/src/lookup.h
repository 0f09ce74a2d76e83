// libnattn's host-side queries: the generated kernel table (find_kernel), the devices
// (nattn/common/device.h: asked once each) and the NATTN_FAMILY cap, with which family a
// device may run.
#pragma once
#include "nattn/common/device.h"  // device_cc, device_sms, device_smem_per_sm
#include "nattn/common/registry.h"

namespace nattn { namespace host {

// The instance of `family` with the smallest head dim >= dim for (dtype, na_dim), or null.
const nattn::KernelEntry* find_kernel(const char* family, int dtype, int na_dim, int dim);

// NATTN_FAMILY: simt, tc, or sm90 (also makes a forward the Hopper family declines an error).
enum FamilyCap { kCapSimt = 0, kCapTc = 1, kCapAny = 2, kCapSm90Only = 3 };
int family_cap();
bool tc_allowed(int device);
bool sm90_allowed(int device);

}  }  // namespace nattn::host
