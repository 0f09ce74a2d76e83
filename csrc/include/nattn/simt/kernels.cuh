// SIMT fused neighborhood attention: forward (online softmax, writes out + LSE) and
// backward (dQ + delta per query; dK, dV, dRPB per key over its inverse neighborhood).
//
// A query is served by a group of HD/8 threads, each holding 8 channels of q and of the
// accumulator; the dot product is reduced with warp shuffles inside the group. Every
// instruction used exists on SM50, so this family runs on every GPU from Maxwell on.
// Offsets are 64-bit, so tensors past 2^31 elements are addressed correctly.
#pragma once
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/common/vec.cuh"
#include "nattn/common/window.cuh"
#include "nattn/simt/launch.h"

namespace nattn { namespace simt {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int TPQ>
__device__ __forceinline__ unsigned group_mask() {
  if constexpr (TPQ == 32) {
    return 0xffffffffu;
  } else {
    const unsigned lane = threadIdx.x & 31u;
    return ((1u << TPQ) - 1u) << (lane & ~unsigned(TPQ - 1));
  }
}

template <int TPQ>
__device__ __forceinline__ float group_sum(float x, unsigned mask) {
#pragma unroll
  for (int o = TPQ / 2; o > 0; o >>= 1) x += __shfl_xor_sync(mask, x, o);
  return x;
}

template <int TPQ>
__device__ __forceinline__ void group_sum2(float& x, float& y, unsigned mask) {
#pragma unroll
  for (int o = TPQ / 2; o > 0; o >>= 1) {
    x += __shfl_xor_sync(mask, x, o);
    y += __shfl_xor_sync(mask, y, o);
  }
}

// Row-major coordinates of a flat token index.
template <int NA>
__device__ __forceinline__ void unravel(int64_t t, const int* spatial, int* c) {
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    c[a] = int(t % spatial[a]);
    t /= spatial[a];
  }
}

template <int NA>
__device__ __forceinline__ int64_t token_offset(const int* c, const int64_t* s) {
  int64_t o = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) o += int64_t(c[a]) * s[1 + a];
  return o;
}

template <int NA>
__device__ __forceinline__ int64_t flat_token(const int* c, const int* spatial) {
  int64_t t = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) t = t * spatial[a] + c[a];
  return t;
}

// Calls f(j) for every point j of the box [start, start + count) (row-major order).
template <int NA, typename F>
__device__ __forceinline__ void for_each_in_box(const AxisRange* r, F&& f) {
  int j[3] = {0, 0, 0};
  for (int a0 = 0; a0 < r[0].count; ++a0) {
    j[0] = r[0].start + a0;
    if constexpr (NA == 1) {
      f(j);
    } else {
      for (int a1 = 0; a1 < r[1].count; ++a1) {
        j[1] = r[1].start + a1;
        if constexpr (NA == 2) {
          f(j);
        } else {
          for (int a2 = 0; a2 < r[2].count; ++a2) {
            j[2] = r[2].start + a2;
            f(j);
          }
        }
      }
    }
  }
}

// Flat RPB index of (query ig, key jg) per axis: sum over axes of (jg - ig + k - 1).
template <int NA>
__device__ __forceinline__ int rpb_index(const int* jg, const int* ig, const Params& p) {
  int r = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) r = r * p.rpb_size[a] + (jg[a] - ig[a] + p.kernel[a] - 1);
  return r;
}

// ------------------------------------------------------------------------- forward
template <typename T, int NA, int HD>
__global__ void __launch_bounds__(kThreads) forward_kernel(const Params p) {
  constexpr int TPQ = HD / 8, QPB = kThreads / TPQ;
  const int lane = threadIdx.x % TPQ;
  const int64_t qi = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  if (qi >= p.tokens) return;  // the whole thread group leaves together
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  const unsigned mask = group_mask<TPQ>();
  const int ch = lane * 8;
  const bool has_qk = ch < p.dim, has_v = ch < p.dim_v;

  int c[3], g[3], ig[3];
  AxisRange win[3];
  unravel<NA>(qi, p.spatial, c);
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    g[a] = c[a] % p.dilation[a];
    ig[a] = c[a] / p.dilation[a];
    win[a] = query_window(ig[a], group_len(p.spatial[a], g[a], p.dilation[a]), p.kernel[a],
                          p.stride[a], p.causal[a] != 0);
  }
  const T* Q = static_cast<const T*>(p.q);
  const T* K = static_cast<const T*>(p.k) + int64_t(b) * p.k_s[0] + int64_t(hkv) * p.k_s[4] + ch;
  const T* V = static_cast<const T*>(p.v) + int64_t(b) * p.v_s[0] + int64_t(hkv) * p.v_s[4] + ch;
  float q[8];
  load8(q, Q + int64_t(b) * p.q_s[0] + token_offset<NA>(c, p.q_s) + int64_t(h) * p.q_s[4] + ch, has_qk);
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] *= p.scale_log2;  // logits in log2 units
  const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;

  float m = -INFINITY, l = 0.f, acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for_each_in_box<NA>(win, [&](const int* jg) {
    int kc[3];
#pragma unroll
    for (int a = 0; a < NA; ++a) kc[a] = jg[a] * p.dilation[a] + g[a];
    float kv[8];
    load8(kv, K + token_offset<NA>(kc, p.k_s), has_qk);
    float s = group_sum<TPQ>(dot8(q, kv), mask);
    if (rpb) s += rpb[rpb_index<NA>(jg, ig, p)] * kLog2e;
    const float m_new = fmaxf(m, s);
    const float corr = exp2f(m - m_new), pr = exp2f(s - m_new);
    l = l * corr + pr;
    m = m_new;
    load8(kv, V + token_offset<NA>(kc, p.v_s), has_v);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(pr, kv[i], acc[i] * corr);
  });
  const float inv_l = 1.f / l;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] *= inv_l;
  if (has_v) {
    T* O = static_cast<T*>(p.out) + int64_t(b) * p.out_s[0] + token_offset<NA>(c, p.out_s) +
           int64_t(h) * p.out_s[4] + ch;
    Vec8<T>::store(O, acc);
  }
  if (lane == 0) p.lse[(int64_t(b) * p.tokens + qi) * p.heads + h] = (m + log2f(l)) * kLn2;
}

// --------------------------------------------------------------- backward: dQ + delta
template <typename T, int NA, int HD>
__global__ void __launch_bounds__(kThreads) backward_dq_kernel(const Params p) {
  constexpr int TPQ = HD / 8, QPB = kThreads / TPQ;
  const int lane = threadIdx.x % TPQ;
  const int64_t qi = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  if (qi >= p.tokens) return;
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  const unsigned mask = group_mask<TPQ>();
  const int ch = lane * 8;
  const bool has_qk = ch < p.dim, has_v = ch < p.dim_v;

  int c[3], g[3], ig[3];
  AxisRange win[3];
  unravel<NA>(qi, p.spatial, c);
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    g[a] = c[a] % p.dilation[a];
    ig[a] = c[a] / p.dilation[a];
    win[a] = query_window(ig[a], group_len(p.spatial[a], g[a], p.dilation[a]), p.kernel[a],
                          p.stride[a], p.causal[a] != 0);
  }
  const int64_t row = (int64_t(b) * p.tokens + qi) * p.heads + h;
  float q[8], dout[8], o[8];
  load8(q, static_cast<const T*>(p.q) + int64_t(b) * p.q_s[0] + token_offset<NA>(c, p.q_s) +
               int64_t(h) * p.q_s[4] + ch, has_qk);
  load8(dout, static_cast<const T*>(p.grad_out) + int64_t(b) * p.grad_out_s[0] +
                  token_offset<NA>(c, p.grad_out_s) + int64_t(h) * p.grad_out_s[4] + ch, has_v);
  load8(o, static_cast<const T*>(p.out) + int64_t(b) * p.out_s[0] + token_offset<NA>(c, p.out_s) +
               int64_t(h) * p.out_s[4] + ch, has_v);
  // delta = rowsum(dO * O) - grad_lse: dS = P * (dP - delta).
  const float delta = group_sum<TPQ>(dot8(dout, o), mask) - (p.grad_lse ? p.grad_lse[row] : 0.f);
  if (lane == 0) p.delta[row] = delta;
  const float lse2 = p.lse[row] * kLog2e;
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] *= p.scale_log2;

  const T* K = static_cast<const T*>(p.k) + int64_t(b) * p.k_s[0] + int64_t(hkv) * p.k_s[4] + ch;
  const T* V = static_cast<const T*>(p.v) + int64_t(b) * p.v_s[0] + int64_t(hkv) * p.v_s[4] + ch;
  const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
  float dq[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) dq[i] = 0.f;
  for_each_in_box<NA>(win, [&](const int* jg) {
    int kc[3];
#pragma unroll
    for (int a = 0; a < NA; ++a) kc[a] = jg[a] * p.dilation[a] + g[a];
    float kk[8], vv[8];
    load8(kk, K + token_offset<NA>(kc, p.k_s), has_qk);
    load8(vv, V + token_offset<NA>(kc, p.v_s), has_v);
    float s = dot8(q, kk), dp = dot8(dout, vv);
    group_sum2<TPQ>(s, dp, mask);
    if (rpb) s += rpb[rpb_index<NA>(jg, ig, p)] * kLog2e;
    const float ds = exp2f(s - lse2) * (dp - delta);
#pragma unroll
    for (int i = 0; i < 8; ++i) dq[i] = fmaf(ds, kk[i], dq[i]);
  });
  if (has_qk) {
#pragma unroll
    for (int i = 0; i < 8; ++i) dq[i] *= p.scale;
    T* DQ = static_cast<T*>(p.dq) + int64_t(b) * p.dq_s[0] + token_offset<NA>(c, p.dq_s) +
            int64_t(h) * p.dq_s[4] + ch;
    Vec8<T>::store(DQ, dq);
  }
}

// ------------------------------------------------------ backward: dK, dV, dRPB per key
template <typename T, int NA, int HD>
__global__ void __launch_bounds__(kThreads) backward_dkv_kernel(const Params p) {
  constexpr int TPQ = HD / 8, QPB = kThreads / TPQ;
  extern __shared__ float drpb_smem[];  // [groups, rpb_head_size] when p.rpb_in_smem
  const int lane = threadIdx.x % TPQ;
  const int64_t kj = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const bool stage = p.rpb != nullptr && p.rpb_in_smem;
  const int64_t smem_len = int64_t(p.groups) * p.rpb_head_size;
  if (stage) {
    for (int64_t i = threadIdx.x; i < smem_len; i += blockDim.x) drpb_smem[i] = 0.f;
    __syncthreads();
  }
  if (kj < p.tokens) {  // no early return: the block meets again at the dRPB flush
    const unsigned mask = group_mask<TPQ>();
    const int ch = lane * 8;
    const bool has_qk = ch < p.dim, has_v = ch < p.dim_v;
    int c[3], g[3], jg[3];
    AxisRange inv[3];
    unravel<NA>(kj, p.spatial, c);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      g[a] = c[a] % p.dilation[a];
      jg[a] = c[a] / p.dilation[a];
      inv[a] = key_inverse(jg[a], group_len(p.spatial[a], g[a], p.dilation[a]), p.kernel[a],
                           p.stride[a], p.causal[a] != 0);
    }
    float kk[8], vv[8], dk[8], dv[8];
    load8(kk, static_cast<const T*>(p.k) + int64_t(b) * p.k_s[0] + token_offset<NA>(c, p.k_s) +
                  int64_t(hkv) * p.k_s[4] + ch, has_qk);
    load8(vv, static_cast<const T*>(p.v) + int64_t(b) * p.v_s[0] + token_offset<NA>(c, p.v_s) +
                  int64_t(hkv) * p.v_s[4] + ch, has_v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      kk[i] *= p.scale_log2;
      dk[i] = 0.f;
      dv[i] = 0.f;
    }
    for (int hg = 0; hg < p.groups; ++hg) {  // GQA: every query head of this KV head
      const int h = hkv * p.groups + hg;
      const T* Q = static_cast<const T*>(p.q) + int64_t(b) * p.q_s[0] + int64_t(h) * p.q_s[4] + ch;
      const T* DO = static_cast<const T*>(p.grad_out) + int64_t(b) * p.grad_out_s[0] +
                    int64_t(h) * p.grad_out_s[4] + ch;
      const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
      const int64_t row0 = int64_t(b) * p.tokens * p.heads + h;
      for_each_in_box<NA>(inv, [&](const int* ig) {
        int qc[3];
#pragma unroll
        for (int a = 0; a < NA; ++a) qc[a] = ig[a] * p.dilation[a] + g[a];
        const int64_t row = row0 + flat_token<NA>(qc, p.spatial) * p.heads;
        float q[8], dout[8];
        load8(q, Q + token_offset<NA>(qc, p.q_s), has_qk);
        load8(dout, DO + token_offset<NA>(qc, p.grad_out_s), has_v);
        float s = dot8(q, kk), dp = dot8(dout, vv);
        group_sum2<TPQ>(s, dp, mask);
        int r = 0;
        if (rpb) {
          r = rpb_index<NA>(jg, ig, p);
          s += rpb[r] * kLog2e;
        }
        const float pr = exp2f(s - p.lse[row] * kLog2e);
        const float ds = pr * (dp - p.delta[row]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          dv[i] = fmaf(pr, dout[i], dv[i]);
          dk[i] = fmaf(ds, q[i], dk[i]);
        }
        if (rpb && lane == 0) {
          if (stage) atomicAdd(drpb_smem + int64_t(hg) * p.rpb_head_size + r, ds);
          else atomicAdd(p.drpb + int64_t(h) * p.rpb_head_size + r, ds);
        }
      });
    }
    if (has_qk) {
#pragma unroll
      for (int i = 0; i < 8; ++i) dk[i] *= p.scale;
      Vec8<T>::store(static_cast<T*>(p.dk) + int64_t(b) * p.dk_s[0] + token_offset<NA>(c, p.dk_s) +
                         int64_t(hkv) * p.dk_s[4] + ch, dk);
    }
    if (has_v)
      Vec8<T>::store(static_cast<T*>(p.dv) + int64_t(b) * p.dv_s[0] + token_offset<NA>(c, p.dv_s) +
                         int64_t(hkv) * p.dv_s[4] + ch, dv);
  }
  if (stage) {
    __syncthreads();
    float* dst = p.drpb + int64_t(hkv) * p.groups * p.rpb_head_size;
    for (int64_t i = threadIdx.x; i < smem_len; i += blockDim.x)
      if (drpb_smem[i] != 0.f) atomicAdd(dst + i, drpb_smem[i]);
  }
}

// ------------------------------------------------------------------------- launchers
template <typename T, int NA, int HD>
void launch_forward(const Params& p, cudaStream_t stream) {
  constexpr int QPB = kThreads / (HD / 8);
  const dim3 grid(unsigned((p.tokens + QPB - 1) / QPB), unsigned(p.heads), unsigned(p.batch));
  forward_kernel<T, NA, HD><<<grid, kThreads, 0, stream>>>(p);
}

// Shared memory for staging dRPB; larger tables go straight to global atomics.
constexpr int64_t kMaxRpbSmemBytes = 48 * 1024;

template <typename T, int NA, int HD>
void launch_backward(const Params& p, cudaStream_t stream) {
  constexpr int QPB = kThreads / (HD / 8);
  const unsigned blocks = unsigned((p.tokens + QPB - 1) / QPB);
  backward_dq_kernel<T, NA, HD><<<dim3(blocks, p.heads, p.batch), kThreads, 0, stream>>>(p);
  Params pk = p;
  const int64_t smem = int64_t(p.groups) * p.rpb_head_size * int64_t(sizeof(float));
  pk.rpb_in_smem = p.rpb != nullptr && smem <= kMaxRpbSmemBytes;
  backward_dkv_kernel<T, NA, HD><<<dim3(blocks, p.heads_kv, p.batch), kThreads,
                                   pk.rpb_in_smem ? size_t(smem) : 0, stream>>>(pk);
}

}  }  // namespace nattn::simt
