// Host launchers of the Hopper (sm90) family: problem checks, tensor maps, launch.
#pragma once
#include <cuda.h>
#include <string.h>

#include <type_traits>

#include "nattn/common/registry.h"
#include "nattn/sm90/forward.cuh"
#include "nattn/sm90/launch.h"
#include "nattn/sm90/tensor_map.h"

namespace nattn { namespace sm90 {

// What prepare_forward leaves for launch_forward (in Params::prepared).
struct ForwardLaunch {
  CUtensorMap q, k, v;
};
static_assert(sizeof(ForwardLaunch) <= kPrepareBytes, "workspace too small");

template <typename T, int NA, int HD, class Tl>
const char* prepare_forward(const Params& p, void* workspace) {
  if (p.dim != HD || p.dim_v != HD) return "head dims must both equal the instance's (32, 64 or 128)";
  int qbox[3], kbox[3];
  for (int a = 0; a < 3; ++a) {
    qbox[a] = Tl::Q::extent(a);
    kbox[a] = Tl::K::extent(a);
  }
  MapSpec mq, mk, mv;
  const char* why = map_spec(p, p.q_s, p.heads, HD, qbox, mq);
  if (!why) why = map_spec(p, p.k_s, p.heads_kv, HD, kbox, mk);
  if (!why) why = map_spec(p, p.v_s, p.heads_kv, HD, kbox, mv);
  if (why) return why;
  if (num_cta_tiles<typename Tl::Q>(p) > 0x7fffffff) return "too many query boxes for the grid";
  ForwardLaunch* l = static_cast<ForwardLaunch*>(workspace);
  constexpr bool kBf16 = sizeof(T) == 2 && !std::is_same<T, __half>::value;
  if ((why = encode(&l->q, mq, p.q, kBf16))) return why;
  if ((why = encode(&l->k, mk, p.k, kBf16))) return why;
  if ((why = encode(&l->v, mv, p.v, kBf16))) return why;
  return nullptr;
}

template <typename T, int NA, int HD, class Tl>
void launch_forward(const Params& p, cudaStream_t stream) {
  const ForwardLaunch* l = static_cast<const ForwardLaunch*>(p.prepared);
  constexpr int smem = Smem<HD, Tl::K::kSize>::kAlloc;
  static const bool configured = [] {
    cudaFuncSetAttribute(forward_kernel<T, NA, HD, Tl>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned(num_cta_tiles<typename Tl::Q>(p)), unsigned(p.heads), unsigned(p.batch));
  forward_kernel<T, NA, HD, Tl><<<grid, kThreads, smem, stream>>>(p, l->q, l->k, l->v);
}

}  }  // namespace nattn::sm90
