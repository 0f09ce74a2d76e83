// The KV-parallel backward's last step: dQ = scale * (the fp32 sums the dK/dV pass added up,
// backward_dkv.cuh with DQ_ATOMIC), rounded to the input type and stored with dQ's strides.
#pragma once
#include "nattn/common/registry.h"
#include "nattn/sm90/backward_delta.cuh"
#include "nattn/sm90/forward.cuh"

namespace nattn { namespace sm90 {

template <typename T, int HD>
__global__ void __launch_bounds__(kDeltaThreads) dq_convert_kernel(const Params p) {
  const int64_t rows = int64_t(p.batch) * p.tokens * p.heads;
  const int64_t idx = int64_t(blockIdx.x) * kDeltaThreads + threadIdx.x;  // one per 8 channels
  const int64_t row = idx / (HD / 8);
  if (row >= rows) return;
  const int part = int(idx % (HD / 8));
  const int h = int(row % p.heads);
  int64_t token = (row / p.heads) % p.tokens;
  const int b = int(row / (int64_t(p.heads) * p.tokens));
  int64_t off = 0;
  for (int a = p.na_dim - 1; a >= 0; --a) {
    off += (token % p.spatial[a]) * p.dq_s[1 + a];
    token /= p.spatial[a];
  }
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + row * HD + part * 8);
  const float4 x = src[0], y = src[1];
  uint4 out;
  out.x = pack2<T>(x.x * p.scale, x.y * p.scale);
  out.y = pack2<T>(x.z * p.scale, x.w * p.scale);
  out.z = pack2<T>(y.x * p.scale, y.y * p.scale);
  out.w = pack2<T>(y.z * p.scale, y.w * p.scale);
  *reinterpret_cast<uint4*>(head_base<T>(p.dq, p.dq_s, b, h) + off + part * 8) = out;
}

}  }  // namespace nattn::sm90
