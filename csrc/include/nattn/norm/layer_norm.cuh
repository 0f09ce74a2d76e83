// Forward LayerNorm over the last axis of rows [M, C] (8 <= C <= 1024, a multiple of 8): the
// NA models' norms when no gradient is needed (nattn/nn/fast_norm.py). torch's kernel gives
// every row a block of 128 threads, which at the models' 64-512 channels (channels-last
// activations of 6k-400k rows) ran at ~1/12 of the memory rate. Here L lanes of a warp hold
// one row (L the smallest power of two >= C / 8, at most 32; 32 / L rows a warp), each lane
// up to four chunks of 8 channels in registers. The statistics are float32 as torch's: the
// mean, then the mean squared deviation from it (torch: Welford; both the biased variance),
// rstd = rsqrt(var + eps), y = w * ((x - mean) * rstd) + b. A block serves several groups of
// rows (gain and bias read once a lane, the next row loaded while one is normalized).
//
// Dtypes: x float32 / float16 / bfloat16, y any of them (autocast's float32 norm reads the
// 16-bit activation and writes float32: the input's cast is exact, so fusing it changes no
// bit); w and b any of them or absent. `round`: x, w and b are rounded to y's dtype before
// use, as a norm that casts its input and parameters to the autocast dtype first (the models'
// block norms, models/_common.py BranchLayerNorm).
//
// With a branch r (the models' residual add, s = x + r, then a norm of s): each element of s is
// float(x) + float(r) rounded to s's dtype, as torch's add computes it (float32 arithmetic,
// one rounding), written packed, and normalized as x would be. One pass reads x and r and
// writes s and y: 12 bytes an element for a float32 stream and a 16-bit branch and output,
// against 16 for the add and the norm as two kernels (and one launch less).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "nattn/common/vec.cuh"

namespace nattn { namespace norm {

enum Dtype : int { kF32 = 0, kF16 = 1, kBF16 = 2 };  // kernel_table.DTYPES' order

constexpr int kChunk = 8;      // channels a lane loads at once (16 bytes of a 16-bit row)
constexpr int kMaxChunks = 4;  // per lane: rows of up to 32 x 4 x 8 = 1024 channels
constexpr int kMaxChannels = 32 * kMaxChunks * kChunk;
constexpr int kThreads = 256;

struct LayerNormParams {
  const void* x;
  void* y;             // [rows, channels], packed
  const void* w;       // [channels] or null
  const void* b;       // [channels] or null
  int64_t rows, x_row;  // x's row stride in elements (its channels are packed)
  int channels, lanes;  // lanes per row: a power of two, lanes * kMaxChunks * kChunk >= channels
  int w_dtype;          // Dtype of w and b
  float eps;
  int round;
  int passes;           // row groups a block serves (layer_norm_passes)
  const void* r;        // the branch added to x first ([rows, channels], rows r_row apart), or null
  void* s;              // x + r, written [rows, channels] packed (with r)
  int64_t r_row;
  int r_dtype, s_dtype;  // Dtype of r and s
};

__device__ __forceinline__ int nattn_norm_min(int a, int b) { return a < b ? a : b; }

// Eight floats stored as T (common/vec.cuh), except bfloat16, which the hardware converts in
// pairs here (Vec8<bf16_t>::store rounds with integer operations, for SM50).
template <typename T>
__device__ __forceinline__ void store8(T* p, const float* v) {
  Vec8<T>::store(p, v);
}
template <>
__device__ __forceinline__ void store8<bf16_t>(bf16_t* p, const float* v) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);  // round to nearest even
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// v rounded to T's precision (nearest even), as float.
template <typename T>
__device__ __forceinline__ float rounded(float v);
template <>
__device__ __forceinline__ float rounded<float>(float v) { return v; }
template <>
__device__ __forceinline__ float rounded<__half>(float v) { return __half2float(__float2half_rn(v)); }
template <>
__device__ __forceinline__ float rounded<bf16_t>(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Eight elements at p of runtime dtype `dtype`, as floats, and eight floats stored so. (`at`:
// int for a parameter's channel, int64_t for a row's element.)
template <typename Index>
__device__ __forceinline__ void load8_any(const void* p, int dtype, Index at, float* v) {
  if (dtype == kF32) Vec8<float>::load(v, static_cast<const float*>(p) + at);
  else if (dtype == kF16) Vec8<__half>::load(v, static_cast<const __half*>(p) + at);
  else Vec8<bf16_t>::load(v, static_cast<const bf16_t*>(p) + at);
}
__device__ __forceinline__ void store8_any(void* p, int dtype, int64_t at, const float* v) {
  if (dtype == kF32) store8<float>(static_cast<float*>(p) + at, v);
  else if (dtype == kF16) store8<__half>(static_cast<__half*>(p) + at, v);
  else store8<bf16_t>(static_cast<bf16_t*>(p) + at, v);
}
__device__ __forceinline__ float rounded_any(float v, int dtype) {
  return dtype == kF32 ? v : dtype == kF16 ? rounded<__half>(v) : rounded<bf16_t>(v);
}

// Eight parameters from channel c of a vector of runtime dtype `dtype`, or `fill` where p is
// null (no gain: 1, no bias: 0).
__device__ __forceinline__ void load_param8(const void* p, int dtype, int c, float fill, float* v) {
  if (!p) {
#pragma unroll
    for (int e = 0; e < kChunk; ++e) v[e] = fill;
  } else {
    load8_any(p, dtype, c, v);
  }
}

// Sum over the `lanes` lanes (a power of two) of each aligned group of the warp.
__device__ __forceinline__ float group_sum(float s, int lanes) {
  for (int off = lanes / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

// A lane's K chunks of one row (zeros past the channels or for a row past the last): x, or
// with a branch x + r (stored to s here), rounded to TOut's precision when p.round.
template <typename TIn, typename TOut, int K>
__device__ __forceinline__ void load_row(const LayerNormParams& p, int64_t row, int sub, float (&v)[K][kChunk]) {
  const TIn* x = static_cast<const TIn*>(p.x) + (row < p.rows ? row : 0) * p.x_row;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (sub + k * p.lanes) * kChunk;
    if (row < p.rows && c < p.channels) {
      Vec8<TIn>::load(v[k], x + c);
      if (p.r) {
        float r[kChunk];
        load8_any(p.r, p.r_dtype, row * p.r_row + c, r);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[k][e] = rounded_any(v[k][e] + r[e], p.s_dtype);
        store8_any(p.s, p.s_dtype, row * p.channels + c, v[k]);
      }
      if (p.round) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v[k][e] = rounded<TOut>(v[k][e]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[k][e] = 0.f;
    }
  }
}

// A block serves p.passes groups of kThreads / L consecutive rows, one group after the other;
// each lane reads its channels' gain and bias once, and the next group's row while it
// normalizes the current one. K: chunks a lane holds (L * K * kChunk >= channels).
template <typename TIn, typename TOut, int K>
__global__ void __launch_bounds__(kThreads) layer_norm_kernel(const LayerNormParams p) {
  const int L = p.lanes, sub = threadIdx.x % L, group = kThreads / L;
  float w[K][kChunk], b[K][kChunk];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = nattn_norm_min((sub + k * L) * kChunk, p.channels - kChunk);  // past the end: unused
    load_param8(p.w, p.w_dtype, c, 1.f, w[k]);
    load_param8(p.b, p.w_dtype, c, 0.f, b[k]);
    if (p.round) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) w[k][e] = rounded<TOut>(w[k][e]), b[k][e] = rounded<TOut>(b[k][e]);
    }
  }
  const int64_t first = int64_t(blockIdx.x) * p.passes * group + threadIdx.x / L;
  float v[K][kChunk], next[K][kChunk];
  load_row<TIn, TOut, K>(p, first, sub, v);
  for (int j = 0; j < p.passes; ++j) {
    const int64_t row = first + int64_t(j) * group;
    if (j + 1 < p.passes) load_row<TIn, TOut, K>(p, row + group, sub, next);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < kChunk; ++e) sum += v[k][e];
    const float mean = group_sum(sum, L) / float(p.channels);  // every lane: dead rows add zeros
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if ((sub + k * L) * kChunk < p.channels) {
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          const float d = v[k][e] - mean;
          sq += d * d;
        }
      }
    }
    const float rstd = rsqrtf(group_sum(sq, L) / float(p.channels) + p.eps);
    if (row < p.rows) {
      TOut* y = static_cast<TOut*>(p.y) + row * p.channels;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int c = (sub + k * L) * kChunk;
        if (c >= p.channels) continue;
        float out[kChunk];
#pragma unroll
        for (int e = 0; e < kChunk; ++e) out[e] = w[k][e] * ((v[k][e] - mean) * rstd) + b[k][e];
        store8<TOut>(y + c, out);
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[k][e] = next[k][e];
  }
}

// The lanes per row for `channels` (see LayerNormParams): up to 32, then 1, 2 or 4 chunks a lane.
inline int layer_norm_lanes(int channels) {
  int lanes = 1;
  while (lanes < 32 && lanes * kChunk < channels) lanes *= 2;
  return lanes;
}

// Rows per thread: enough blocks for ~8 per SM (sms: the device's, 0 when unknown), at most 16.
inline int layer_norm_passes(int64_t rows, int lanes, int sms) {
  const int64_t per_block = kThreads / lanes, want_blocks = int64_t(sms > 0 ? sms : 132) * 8;
  const int64_t passes = rows / (per_block * want_blocks);
  return int(passes < 1 ? 1 : passes > 16 ? 16 : passes);
}

template <typename TIn, typename TOut>
void launch_layer_norm(const LayerNormParams& p, cudaStream_t stream) {
  const int64_t per_block = int64_t(p.passes) * (kThreads / p.lanes);
  const unsigned blocks = unsigned((p.rows + per_block - 1) / per_block);
  const int chunks = (p.channels / kChunk + p.lanes - 1) / p.lanes;
  if (chunks <= 1) layer_norm_kernel<TIn, TOut, 1><<<blocks, kThreads, 0, stream>>>(p);
  else if (chunks <= 2) layer_norm_kernel<TIn, TOut, 2><<<blocks, kThreads, 0, stream>>>(p);
  else layer_norm_kernel<TIn, TOut, kMaxChunks><<<blocks, kThreads, 0, stream>>>(p);
}

}  }  // namespace nattn::norm
