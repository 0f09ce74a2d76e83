// The backward's preprocessing: delta = rowsum(dO * O) - dLSE for every (batch, token,
// head) row, fp32 [B, N, H] (Params::delta), read by both passes. Memory-bound and cheap
// next to them: HD / 8 threads per row, one 16-byte load of each tensor per thread. Where
// O and dO are both packed ([B, *spatial, H, D] contiguous, the usual case) a row's
// elements start at row * HD and the threads need no index arithmetic; otherwise each row's
// (batch, token, head) is decoded and its offset built from the strides (64-bit divisions:
// that kernel ran at ~45% of the memory rate on HunyuanVideo-sized rows).
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

// Sum of the products of two packed pairs of O and dO.
template <typename T>
__device__ __forceinline__ float pair_dot(uint32_t o, uint32_t d) {
  const float2 of = unpack2<T>(o), df = unpack2<T>(d);
  return of.x * df.x + of.y * df.y;
}

// Sum of the products of one 16-byte piece of O and dO (8 elements each).
template <typename T>
__device__ __forceinline__ float piece_dot(const uint4& o, const uint4& d) {
  const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc += pair_dot<T>(ow[i], dw[i]);
  return acc;
}

// A row's delta from its rowsum(dO O): minus the LSE's gradient where the call has one.
__device__ __forceinline__ float row_delta(const Params& p, int64_t row, float dot) {
  return dot - (p.grad_lse ? p.grad_lse[row] : 0.f);
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
    acc = piece_dot<T>(o, d);
  }
#pragma unroll
  for (int w = kLanes / 2; w > 0; w /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, w);
  if (row < rows && part == 0) p.delta[row] = row_delta(p, row, acc);
}

// Packed O and dO: thread i reads the 16-byte piece i of both (row i / (HD / 8)).
template <typename T, int HD>
__global__ void __launch_bounds__(kDeltaThreads) delta_packed_kernel(const Params p) {
  constexpr int kLanes = HD / 8;
  const int64_t piece = int64_t(blockIdx.x) * kDeltaThreads + threadIdx.x;
  const int64_t row = piece / kLanes;  // a power of two: a shift
  const int64_t rows = int64_t(p.batch) * p.tokens * p.heads;
  float acc = 0.f;
  if (row < rows)
    acc = piece_dot<T>(reinterpret_cast<const uint4*>(p.out)[piece], reinterpret_cast<const uint4*>(p.grad_out)[piece]);
#pragma unroll
  for (int w = kLanes / 2; w > 0; w /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, w);
  if (row < rows && piece % kLanes == 0) p.delta[row] = row_delta(p, row, acc);
}

// Whether a [B, *spatial, H, HD] tensor of strides s is packed (host).
template <int HD>
inline bool delta_packed(const Params& p, const int64_t* s) {
  int64_t m = HD;
  if (s[4] != m) return false;
  m *= p.heads;
  for (int a = p.na_dim - 1; a >= 0; --a) {
    if (s[1 + a] != m) return false;
    m *= p.spatial[a];
  }
  return p.batch == 1 || s[0] == m;
}

// Launches delta for every row of the call (host).
template <typename T, int HD>
inline void launch_delta(const Params& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.tokens * p.heads;
  const unsigned blocks = unsigned((rows * (HD / 8) + kDeltaThreads - 1) / kDeltaThreads);
  if (delta_packed<HD>(p, p.out_s) && delta_packed<HD>(p, p.grad_out_s))
    delta_packed_kernel<T, HD><<<blocks, kDeltaThreads, 0, stream>>>(p);
  else
    delta_kernel<T, HD><<<blocks, kDeltaThreads, 0, stream>>>(p);
}

}  }  // namespace nattn::sm90
