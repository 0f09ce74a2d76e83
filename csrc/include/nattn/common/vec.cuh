// 8-channel vector loads/stores with float conversion for fp32, fp16 and bf16.
// Only SM50-level instructions: 16-byte loads, integer bit tricks for bf16.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>
#include "nattn/common/registry.h"

namespace nattn {

template <typename T> struct Vec8;

template <> struct Vec8<float> {
  static __device__ __forceinline__ void load(float* d, const float* s) {
    const float4 a = reinterpret_cast<const float4*>(s)[0];
    const float4 b = reinterpret_cast<const float4*>(s)[1];
    d[0] = a.x; d[1] = a.y; d[2] = a.z; d[3] = a.w;
    d[4] = b.x; d[5] = b.y; d[6] = b.z; d[7] = b.w;
  }
  static __device__ __forceinline__ void store(float* d, const float* s) {
    reinterpret_cast<float4*>(d)[0] = make_float4(s[0], s[1], s[2], s[3]);
    reinterpret_cast<float4*>(d)[1] = make_float4(s[4], s[5], s[6], s[7]);
  }
};

template <> struct Vec8<__half> {
  static __device__ __forceinline__ void load(float* d, const __half* s) {
    const uint4 u = *reinterpret_cast<const uint4*>(s);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      d[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
      d[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
    }
  }
  static __device__ __forceinline__ void store(__half* d, const float* s) {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned lo = __half_as_ushort(__float2half_rn(s[2 * i]));
      const unsigned hi = __half_as_ushort(__float2half_rn(s[2 * i + 1]));
      w[i] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(d) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

__device__ __forceinline__ unsigned float_to_bf16_bits(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN stays NaN
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;          // round to nearest even
}

template <> struct Vec8<bf16_t> {
  static __device__ __forceinline__ void load(float* d, const bf16_t* s) {
    const uint4 u = *reinterpret_cast<const uint4*>(s);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      d[2 * i] = __uint_as_float(w[i] << 16);
      d[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  static __device__ __forceinline__ void store(bf16_t* d, const float* s) {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = float_to_bf16_bits(s[2 * i]) | (float_to_bf16_bits(s[2 * i + 1]) << 16);
    *reinterpret_cast<uint4*>(d) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

// Load 8 channels, or zeros when this thread's channels lie past the head dim.
template <typename T>
__device__ __forceinline__ void load8(float* d, const T* s, bool in_range) {
  if (in_range) {
    Vec8<T>::load(d, s);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = 0.f;
  }
}

__device__ __forceinline__ float dot8(const float* a, const float* b) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s = fmaf(a[i], b[i], s);
  return s;
}

}  // namespace nattn

namespace nattn {

// C channels per thread (a multiple of 8), starting at channel `ch` of a row of `dim`;
// each 8-channel piece is loaded only when it lies inside the row (dim % 8 == 0).
template <int C, typename T>
__device__ __forceinline__ void load_channels(float* d, const T* row, int ch, int dim, bool ok) {
#pragma unroll
  for (int i = 0; i < C / 8; ++i) load8(d + 8 * i, row + 8 * i, ok && ch + 8 * i < dim);
}

template <int C, typename T>
__device__ __forceinline__ void store_channels(T* row, const float* s, int ch, int dim) {
#pragma unroll
  for (int i = 0; i < C / 8; ++i)
    if (ch + 8 * i < dim) Vec8<T>::store(row + 8 * i, s + 8 * i);
}

template <int C>
__device__ __forceinline__ float dot(const float* a, const float* b) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < C; ++i) s = fmaf(a[i], b[i], s);
  return s;
}

}  // namespace nattn
