// The unfused window ops (params.h): one thread per output logit (kDot) or per 8 output
// channels (kSum, kInverseSum), fp32 accumulation, any GPU from SM50. The per-element
// functions are host+device: csrc/tests/window_ops_check.cu runs them on the CPU against
// a brute-force scatter of docs/semantics.md's windows.
#pragma once
#include <math.h>
#include <string.h>

#include "nattn/common/registry.h"
#include "nattn/common/vec.cuh"
#include "nattn/common/window.cuh"
#include "nattn/window/params.h"

namespace nattn {
namespace window {

// ---------------------------------------------------------------- conversions (host + device)
NATTN_HD float to_float(float x) { return x; }
NATTN_HD float to_float(__half x) { return __half2float(x); }
NATTN_HD float to_float(bf16_t x) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(unsigned(x.bits) << 16);
#else
  const unsigned u = unsigned(x.bits) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

template <typename T> NATTN_HD T from_float(float x);
template <> NATTN_HD float from_float<float>(float x) { return x; }
template <> NATTN_HD __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> NATTN_HD bf16_t from_float<bf16_t>(float x) {
#ifdef __CUDA_ARCH__
  return bf16_t{(unsigned short)float_to_bf16_bits(x)};
#else
  unsigned u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{0x7fc0u};
  return bf16_t{(unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
#endif
}

template <typename T>
NATTN_HD void load8_any(float* d, const T* s) {
#ifdef __CUDA_ARCH__
  Vec8<T>::load(d, s);
#else
  for (int i = 0; i < 8; ++i) d[i] = to_float(s[i]);
#endif
}

template <typename T>
NATTN_HD void store8_any(T* d, const float* s) {
#ifdef __CUDA_ARCH__
  Vec8<T>::store(d, s);
#else
  for (int i = 0; i < 8; ++i) d[i] = from_float<T>(s[i]);
#endif
}

// ---------------------------------------------------------------- window slots
// The key (group coordinate) of slot 0 of query ig's window along one axis; slot t holds
// base + t. Non-causal windows hold all k slots; causal ones those in [0, ig] (a window
// near the start holds fewer than k keys). Same formulas as query_window (window.cuh).
NATTN_HD int slot_base(int ig, int len_g, int k, int s, bool causal) {
  const int block = s == 1 ? ig : (ig / s) * s;
  if (causal) return nattn_min(block + s - 1, len_g - 1) - k + 1;
  const int leader = nattn_min(block + s / 2, len_g - 1);
  const int left = k / 2, right = k / 2 + k % 2 - 1;
  return nattn_max(nattn_min(leader, len_g - 1 - right), left) - left;
}

// Row-major coordinates of a flat index over NA extents.
template <int NA>
NATTN_HD void unravel(int64_t flat, const int* extent, int* coord) {
  for (int a = NA - 1; a >= 0; --a) {
    coord[a] = int(flat % extent[a]);
    flat /= extent[a];
  }
}

// One query's window along each axis: dilation group, group coordinate, slot 0's key.
template <int NA>
struct QueryWindow {
  int g[3], ig[3], base[3];

  NATTN_HD QueryWindow(const WindowParams& p, int64_t i) {
    int c[3];
    unravel<NA>(i, p.spatial, c);
    for (int a = 0; a < NA; ++a) {
      const int d = p.dilation[a];
      g[a] = c[a] % d;
      ig[a] = c[a] / d;
      base[a] = slot_base(ig[a], group_len(p.spatial[a], g[a], d), p.kernel[a], p.stride[a], p.causal[a] != 0);
    }
  }

  // The flat key index of slot t (per axis), or -1 when the window does not hold it.
  NATTN_HD int64_t key(const WindowParams& p, const int* t) const {
    int64_t j = 0;
    for (int a = 0; a < NA; ++a) {
      const int jg = base[a] + t[a];
      if (p.causal[a] && (jg < 0 || jg > ig[a])) return -1;
      j = j * p.spatial[a] + (int64_t(jg) * p.dilation[a] + g[a]);
    }
    return j;
  }
};

// ---------------------------------------------------------------- the three products
// out[b,i,h,w] = a[b,i,h,:] . b[b,key_w(i),h/G,:]
template <typename T, int NA>
NATTN_HD void dot_element(const WindowParams& p, int64_t idx) {
  const int w = int(idx % p.window);
  int64_t r = idx / p.window;
  const int h = int(r % p.heads);
  r /= p.heads;
  const int64_t i = r % p.tokens, b = r / p.tokens;
  int t[3];
  unravel<NA>(w, p.kernel, t);
  const int64_t j = QueryWindow<NA>(p, i).key(p, t);
  T* out = static_cast<T*>(p.out);
  if (j < 0) {
    out[idx] = from_float<T>(p.neg_inf ? -INFINITY : 0.f);
    return;
  }
  const T* x = static_cast<const T*>(p.a) + ((b * p.tokens + i) * p.heads + h) * p.dim;
  const T* y = static_cast<const T*>(p.b) + ((b * p.tokens + j) * p.heads_kv + h / p.groups) * p.dim;
  float acc = 0.f, xv[8], yv[8];
  for (int c = 0; c < p.dim; c += 8) {
    load8_any(xv, x + c);
    load8_any(yv, y + c);
    for (int e = 0; e < 8; ++e) acc = fmaf(xv[e], yv[e], acc);
  }
  out[idx] = from_float<T>(acc);
}

// out[b,i,h,c..c+8] = sum_w a[b,i,h,w] * b[b,key_w(i),h/G,c..c+8]
template <typename T, int NA>
NATTN_HD void sum_element(const WindowParams& p, int64_t idx) {
  const int chunks = p.dim / 8;
  const int c = int(idx % chunks) * 8;
  int64_t r = idx / chunks;
  const int h = int(r % p.heads);
  r /= p.heads;
  const int64_t i = r % p.tokens, b = r / p.tokens;
  const QueryWindow<NA> win(p, i);
  const T* weights = static_cast<const T*>(p.a) + ((b * p.tokens + i) * p.heads + h) * p.window;
  const T* rows = static_cast<const T*>(p.b) + (b * p.tokens * p.heads_kv + h / p.groups) * p.dim + c;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, yv[8];
  int t[3] = {0, 0, 0};
  for (int w = 0; w < p.window; ++w) {
    const int64_t j = win.key(p, t);
    if (j >= 0) {
      const float wt = to_float(weights[w]);
      load8_any(yv, rows + j * p.heads_kv * p.dim);
      for (int e = 0; e < 8; ++e) acc[e] = fmaf(wt, yv[e], acc[e]);
    }
    for (int a = NA - 1; a >= 0; --a) {  // next slot, row-major
      if (++t[a] < p.kernel[a]) break;
      t[a] = 0;
    }
  }
  store8_any(static_cast<T*>(p.out) + ((b * p.tokens + i) * p.heads + h) * p.dim + c, acc);
}

// out[b,j,hk,c..c+8] = sum over the query heads h of KV head hk and the queries i whose
// window holds key j (slot w): a[b,i,h,w] * b[b,i,h,c..c+8]. The queries form one range
// per axis (key_inverse), so the walk is a box, in a fixed order: deterministic.
template <typename T, int NA>
NATTN_HD void inverse_sum_element(const WindowParams& p, int64_t idx) {
  const int chunks = p.dim / 8;
  const int c = int(idx % chunks) * 8;
  int64_t r = idx / chunks;
  const int hk = int(r % p.heads_kv);
  r /= p.heads_kv;
  const int64_t j = r % p.tokens, b = r / p.tokens;
  int kc[3], g[3], jg[3], len[3], first[3], count[3];
  unravel<NA>(j, p.spatial, kc);
  bool empty = false;
  for (int a = 0; a < NA; ++a) {
    const int d = p.dilation[a];
    g[a] = kc[a] % d;
    jg[a] = kc[a] / d;
    len[a] = group_len(p.spatial[a], g[a], d);
    const AxisRange q = key_inverse(jg[a], len[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
    first[a] = q.start;
    count[a] = q.count;
    empty = empty || q.count <= 0;
  }
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, yv[8];
  const T* weights = static_cast<const T*>(p.a);
  const T* rows = static_cast<const T*>(p.b);
  int u[3] = {0, 0, 0};
  while (!empty) {
    int64_t i = 0;
    int w = 0;
    for (int a = 0; a < NA; ++a) {
      const int ig = first[a] + u[a];
      i = i * p.spatial[a] + (int64_t(ig) * p.dilation[a] + g[a]);
      w = w * p.kernel[a] + (jg[a] - slot_base(ig, len[a], p.kernel[a], p.stride[a], p.causal[a] != 0));
    }
    for (int gg = 0; gg < p.groups; ++gg) {
      const int64_t row = (b * p.tokens + i) * p.heads + hk * p.groups + gg;
      const float wt = to_float(weights[row * p.window + w]);
      load8_any(yv, rows + row * p.dim + c);
      for (int e = 0; e < 8; ++e) acc[e] = fmaf(wt, yv[e], acc[e]);
    }
    int a = NA - 1;  // next query of the box, row-major
    for (; a >= 0; --a) {
      if (++u[a] < count[a]) break;
      u[a] = 0;
    }
    empty = a < 0;
  }
  store8_any(static_cast<T*>(p.out) + ((b * p.tokens + j) * p.heads_kv + hk) * p.dim + c, acc);
}

// Elements (threads) of one call of `op`.
inline int64_t num_elements(const WindowParams& p) {
  const int64_t rows = int64_t(p.batch) * p.tokens;
  if (p.op == kDot) return rows * p.heads * p.window;
  return rows * (p.op == kSum ? p.heads : p.heads_kv) * (p.dim / 8);
}

template <typename T, int NA, int OP>
__global__ void __launch_bounds__(256) window_kernel(const WindowParams p, int64_t total) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += step) {
    if (OP == kDot) dot_element<T, NA>(p, idx);
    else if (OP == kSum) sum_element<T, NA>(p, idx);
    else inverse_sum_element<T, NA>(p, idx);
  }
}

template <typename T, int NA>
void launch_window(const WindowParams& p, cudaStream_t stream) {
  const int64_t total = num_elements(p);
  if (total <= 0) return;
  const int threads = 256;
  const int64_t want = (total + threads - 1) / threads;
  const unsigned blocks = unsigned(want < (int64_t(1) << 20) ? want : (int64_t(1) << 20));
  if (p.op == kDot) window_kernel<T, NA, kDot><<<blocks, threads, 0, stream>>>(p, total);
  else if (p.op == kSum) window_kernel<T, NA, kSum><<<blocks, threads, 0, stream>>>(p, total);
  else window_kernel<T, NA, kInverseSum><<<blocks, threads, 0, stream>>>(p, total);
}

}  // namespace window
}  // namespace nattn
