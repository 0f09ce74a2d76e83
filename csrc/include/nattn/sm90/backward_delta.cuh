// The backward's preprocessing: delta = rowsum(dO * O) - dLSE for every (batch, token,
// head) row, fp32 [B, N, H] (Params::delta), read by both passes. Memory-bound and cheap
// next to them: HD / 8 threads per row, one 16-byte load of each tensor per thread.
#pragma once
#include <cuda_fp16.h>

#include "nattn/common/registry.h"

namespace nattn { namespace sm90 {

constexpr int kDeltaThreads = 256;

template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t u);
template <>
__device__ __forceinline__ float2 unpack2<bf16_t>(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t u) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

template <typename T, int HD>
__global__ void __launch_bounds__(kDeltaThreads) delta_kernel(const Params p) {
  constexpr int kLanes = HD / 8;  // 4, 8 or 16: a row's threads sit in one warp
  const int64_t rows = int64_t(p.batch) * p.tokens * p.heads;
  const int64_t row = (int64_t(blockIdx.x) * kDeltaThreads + threadIdx.x) / kLanes;
  const int part = threadIdx.x % kLanes;
  float acc = 0.f;
  if (row < rows) {
    const int h = int(row % p.heads);
    int64_t token = (row / p.heads) % p.tokens;
    const int b = int(row / (int64_t(p.heads) * p.tokens));
    int64_t off_o = 0, off_d = 0;
    for (int a = p.na_dim - 1; a >= 0; --a) {
      const int64_t i = token % p.spatial[a];
      token /= p.spatial[a];
      off_o += i * p.out_s[1 + a];
      off_d += i * p.grad_out_s[1 + a];
    }
    const uint4 o = *reinterpret_cast<const uint4*>(head_base<const T>(p.out, p.out_s, b, h) + off_o + part * 8);
    const uint4 d =
        *reinterpret_cast<const uint4*>(head_base<const T>(p.grad_out, p.grad_out_s, b, h) + off_d + part * 8);
    const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 of = unpack2<T>(ow[i]), df = unpack2<T>(dw[i]);
      acc += of.x * df.x + of.y * df.y;
    }
  }
#pragma unroll
  for (int w = kLanes / 2; w > 0; w /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, w);
  if (row < rows && part == 0) p.delta[row] = acc - (p.grad_lse ? p.grad_lse[row] : 0.f);
}

}  }  // namespace nattn::sm90
