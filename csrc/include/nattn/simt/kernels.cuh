// SIMT fused neighborhood attention: forward (online softmax, writes out + LSE) and
// backward (dQ + delta per query; dK, dV, dRPB per key over its inverse neighborhood).
//
// A query is served by a group of TPQ = HD / cpt<HD>() threads, each holding cpt<HD>()
// channels (NATTN_SIMT_CPT, default 16) of q and of the accumulator; dot products are
// reduced with shuffles inside the group.
// Window walks keep their memory offsets incrementally (adds, no multiplies per key).
// Every instruction used exists on SM50, so this family runs on every GPU from Maxwell
// on. Offsets are 64-bit, so tensors past 2^31 elements are addressed correctly.
//
// Attention dropout (Params::drop_rng set; docs/semantics.md) is a second instance of each
// kernel (kDrop), run for the problems with dropout that the tensor-core family does not take
// (float32 without TF32, GPUs before SM80, head dims above 128): the forward's row sum and LSE use the unmasked P while the P that meets V is masked, its
// 1 / (1 - p) folded into the output's row factor; the dQ pass forms dS = P (m dP / (1 - p) -
// delta), delta = rowsum(dO * O) - dLSE with the dropped O; the dK/dV pass adds m P dO to dV
// (scaled by 1 / (1 - p) at the store) and the same dS to dK and dRPB. The keep bits m come
// from simt/dropout.cuh (global indices: the key's token index is one more offset stream of the
// window cursor). Calls without dropout run the kDrop = false instances, whose code is the
// same as without the feature.
#pragma once
#include <math.h>

#include "nattn/common/drpb.cuh"
#include "nattn/common/registry.h"
#include "nattn/common/softmax.cuh"
#include "nattn/common/vec.cuh"
#include "nattn/common/window.cuh"
#include "nattn/simt/dropout.cuh"
#include "nattn/simt/launch.h"

// Tuning knobs (overridable with -D for tuning builds): channels per thread, and the
// number of keys (queries) handled per step of the forward (backward) inner loops.
#ifndef NATTN_SIMT_CPT
#define NATTN_SIMT_CPT 16
#endif
#ifndef NATTN_SIMT_FWD_CHUNK
#define NATTN_SIMT_FWD_CHUNK 2
#endif
#ifndef NATTN_SIMT_BWD_CHUNK
#define NATTN_SIMT_BWD_CHUNK 1
#endif

namespace nattn { namespace simt {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kFwdChunk = NATTN_SIMT_FWD_CHUNK;
constexpr int kBwdChunk = NATTN_SIMT_BWD_CHUNK;

// Channels per thread for a head-dim bucket (at least one thread per query).
template <int HD> __host__ __device__ constexpr int cpt() { return HD < NATTN_SIMT_CPT ? HD : NATTN_SIMT_CPT; }
template <int HD> __host__ __device__ constexpr int tpq() { return HD / cpt<HD>(); }

template <int TPQ>
__device__ __forceinline__ unsigned group_mask() {
  if constexpr (TPQ == 32) {
    return 0xffffffffu;
  } else {
    const unsigned lane = threadIdx.x & 31u;
    return ((1u << TPQ) - 1u) << (lane & ~unsigned(TPQ - 1));
  }
}

// Sums N values over the thread group (independent shuffles interleave).
template <int TPQ, int N>
__device__ __forceinline__ void group_sum_n(float* x, unsigned mask) {
#pragma unroll
  for (int o = TPQ / 2; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] += __shfl_xor_sync(mask, x[i], o);
  }
}

// Row-major coordinates of a flat token index.
template <int NA>
NATTN_HD void unravel(int64_t t, const int* spatial, int* c) {
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    c[a] = int(t % spatial[a]);
    t /= spatial[a];
  }
}

template <int NA>
NATTN_HD int64_t token_offset(const int* c, const int64_t* s) {
  int64_t o = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) o += int64_t(c[a]) * s[1 + a];
  return o;
}

// Walks the box [start, start + count) per axis (dilation-group coordinates) in
// row-major order, keeping NOFF memory offsets and an RPB index up to date with adds.
// Offset t of point j is sum_a (j[a] * dil[a] + g[a]) * stride_t[a]; the RPB index is
// sum_a (sign * j[a] + base[a]) * rpb_mult[a].
template <int NA, int NOFF>
struct BoxCursor {
  int left[3], count[3];
  int64_t off[NOFF], step[NOFF][3], wrap[NOFF][3];
  int rpb, rpb_step[3], rpb_wrap[3];

  NATTN_HD BoxCursor(const AxisRange* r, const int* g, const Params& p,
                                       const int64_t* const* strides, int rpb_sign,
                                       const int* rpb_other) {
    int mult = 1, rmult[3];
#pragma unroll
    for (int a = NA - 1; a >= 0; --a) {
      rmult[a] = mult;
      mult *= p.rpb_size[a];
    }
    rpb = 0;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      left[a] = r[a].count;
      count[a] = r[a].count;
      rpb_step[a] = rpb_sign * rmult[a];
      // RPB slot of (key jg, query ig) on this axis: jg - ig + k - 1
      const int slot = rpb_sign > 0 ? r[a].start - rpb_other[a] : rpb_other[a] - r[a].start;
      rpb += (slot + p.kernel[a] - 1) * rmult[a];
    }
#pragma unroll
    for (int t = 0; t < NOFF; ++t) {
      off[t] = 0;
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        const int64_t s = strides[t][a];
        off[t] += int64_t(r[a].start * p.dilation[a] + g[a]) * s;
        step[t][a] = int64_t(p.dilation[a]) * s;
      }
    }
    // Moving to the next point: the last axis steps; an axis that runs out rewinds
    // (minus count * step) and the axis before it steps.
#pragma unroll
    for (int a = 0; a < NA; ++a) {
#pragma unroll
      for (int t = 0; t < NOFF; ++t) wrap[t][a] = a > 0 ? step[t][a - 1] - count[a] * step[t][a] : 0;
      rpb_wrap[a] = a > 0 ? rpb_step[a - 1] - count[a] * rpb_step[a] : 0;
    }
  }

  NATTN_HD void next() {
    constexpr int last = NA - 1;
    if (--left[last] > 0 || NA == 1) {
#pragma unroll
      for (int t = 0; t < NOFF; ++t) off[t] += step[t][last];
      rpb += rpb_step[last];
      return;
    }
    left[last] = count[last];
#pragma unroll
    for (int t = 0; t < NOFF; ++t) off[t] += wrap[t][last] + step[t][last];
    rpb += rpb_wrap[last] + rpb_step[last];
    if constexpr (NA == 3) {
      if (--left[1] == 0) {
        left[1] = count[1];
#pragma unroll
        for (int t = 0; t < NOFF; ++t) off[t] += wrap[t][1];
        rpb += rpb_wrap[1];
      }
    }
  }
};

template <int NA>
NATTN_HD int box_size(const AxisRange* r) {
  int n = 1;
#pragma unroll
  for (int a = 0; a < NA; ++a) n *= r[a].count;
  return n;
}

// Per-axis spatial strides of a tensor (the cursor's layout) and row-major token strides.
struct AxisStrides {
  int64_t s[3];
};

NATTN_HD AxisStrides axis_strides(const int64_t* st) {
  return {{st[1], st[2], st[3]}};
}

template <int NA>
NATTN_HD AxisStrides token_strides(const int* spatial) {
  AxisStrides t{{0, 0, 0}};
  int64_t m = 1;
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    t.s[a] = m;
    m *= spatial[a];
  }
  return t;
}

// The cursor of a query's window keys (forward, dQ pass): K and V offsets, and with dropout
// the keys' token indices (the mask's words) as a third stream.
template <int NA, bool kDrop>
__device__ __forceinline__ BoxCursor<NA, kDrop ? 3 : 2> key_cursor(const Params& p, const AxisRange* win,
                                                                  const int* g, const int* ig) {
  const AxisStrides ks = axis_strides(p.k_s), vs = axis_strides(p.v_s);
  AxisStrides ts;
  const int64_t* strides[kDrop ? 3 : 2] = {ks.s, vs.s};
  if constexpr (kDrop) {
    ts = token_strides<NA>(p.spatial);
    strides[2] = ts.s;
  }
  return BoxCursor<NA, kDrop ? 3 : 2>(win, g, p, strides, +1, ig);
}

// Query windows (forward, dQ) per axis.
template <int NA>
__device__ __forceinline__ void query_windows(int64_t qi, const Params& p, int* c, int* g, int* ig,
                                              AxisRange* win) {
  unravel<NA>(qi, p.spatial, c);
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    g[a] = c[a] % p.dilation[a];
    ig[a] = c[a] / p.dilation[a];
    win[a] = query_window(ig[a], group_len(p.spatial[a], g[a], p.dilation[a]), p.kernel[a],
                          p.stride[a], p.causal[a] != 0);
  }
}

// ------------------------------------------------------------------------- forward
template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(kThreads) forward_kernel(const Params p) {
  constexpr int C = cpt<HD>(), TPQ = tpq<HD>(), QPB = kThreads / TPQ, U = kFwdChunk;
  const int lane = threadIdx.x % TPQ;
  const int64_t qi = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  if (qi >= p.tokens) return;  // the whole thread group leaves together
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  const unsigned mask = group_mask<TPQ>();
  const int ch = lane * C;
  const bool has_v = ch < p.dim_v;

  int c[3], g[3], ig[3];
  AxisRange win[3];
  query_windows<NA>(qi, p, c, g, ig, win);
  const T* K = head_base<const T>(p.k, p.k_s, b, hkv) + ch;
  const T* V = head_base<const T>(p.v, p.v_s, b, hkv) + ch;
  float q[C];
  load_channels<C>(q, static_cast<const T*>(p.q) + int64_t(b) * p.q_s[0] +
                          token_offset<NA>(c, p.q_s) + int64_t(h) * p.q_s[4] + ch, ch, p.dim, true);
#pragma unroll
  for (int i = 0; i < C; ++i) q[i] *= p.scale_log2;  // logits in log2 units
  const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;

  BoxCursor<NA, kDrop ? 3 : 2> cur = key_cursor<NA, kDrop>(p, win, g, ig);
  const int total = box_size<NA>(win);
  QueryDrop drop;
  if constexpr (kDrop) drop.init(p, b, h, uint32_t(qi));
  float m = -INFINITY, l = 0.f, acc[C];
#pragma unroll
  for (int i = 0; i < C; ++i) acc[i] = 0.f;
  for (int base = 0; base < total; base += U) {
    float sc[U], bias[U], vv[U][C];
    bool keep[U];  // dropout: whether key u's weight meets V
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = U == 1 || base + u < total;
      if constexpr (kDrop) keep[u] = ok && drop.keep(uint32_t(cur.off[2]), p.drop_threshold);
      float kk[C];
      load_channels<C>(kk, K + cur.off[0], ch, p.dim, ok);
      load_channels<C>(vv[u], V + cur.off[1], ch, p.dim_v, ok);
      sc[u] = dot<C>(q, kk);
      bias[u] = rpb && ok ? rpb[cur.rpb] * kLog2e : 0.f;
      cur.next();
    }
    group_sum_n<TPQ, U>(sc, mask);
    float m_new = m;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      sc[u] += bias[u];
      if (U > 1 && base + u >= total) sc[u] = -INFINITY;
      m_new = fmaxf(m_new, sc[u]);
    }
    const float ref = m_new == -INFINITY ? 0.f : m_new;  // nothing finite yet: keep zeros
    const float corr = exp2f(m - ref);
    m = m_new;
    l *= corr;
#pragma unroll
    for (int i = 0; i < C; ++i) acc[i] *= corr;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float pr = exp2f(sc[u] - ref);
      l += pr;  // the row sum (and so the LSE) without dropout
      if constexpr (kDrop) pr = keep[u] ? pr : 0.f;
#pragma unroll
      for (int i = 0; i < C; ++i) acc[i] = fmaf(pr, vv[u][i], acc[i]);
    }
  }
  float inv_l = inv_row_sum(l);
  if constexpr (kDrop) inv_l *= p.drop_scale;  // kept weights meet V times 1 / (1 - p)
#pragma unroll
  for (int i = 0; i < C; ++i) acc[i] *= inv_l;
  if (has_v)
    store_channels<C>(static_cast<T*>(p.out) + int64_t(b) * p.out_s[0] + token_offset<NA>(c, p.out_s) +
                          int64_t(h) * p.out_s[4] + ch, acc, ch, p.dim_v);
  if (lane == 0) p.lse[(int64_t(b) * p.tokens + qi) * p.heads + h] = row_lse(m, l);
}

// --------------------------------------------------------------- backward: dQ + delta
template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(kThreads) backward_dq_kernel(const Params p) {
  constexpr int C = cpt<HD>(), TPQ = tpq<HD>(), QPB = kThreads / TPQ, U = kBwdChunk;
  const int lane = threadIdx.x % TPQ;
  const int64_t qi = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  if (qi >= p.tokens) return;
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  const unsigned mask = group_mask<TPQ>();
  const int ch = lane * C;
  const bool has_qk = ch < p.dim;

  int c[3], g[3], ig[3];
  AxisRange win[3];
  query_windows<NA>(qi, p, c, g, ig, win);
  const int64_t row = (int64_t(b) * p.tokens + qi) * p.heads + h;
  float q[C], dout[C], o[C];
  load_channels<C>(q, static_cast<const T*>(p.q) + int64_t(b) * p.q_s[0] + token_offset<NA>(c, p.q_s) +
                          int64_t(h) * p.q_s[4] + ch, ch, p.dim, true);
  load_channels<C>(dout, static_cast<const T*>(p.grad_out) + int64_t(b) * p.grad_out_s[0] +
                             token_offset<NA>(c, p.grad_out_s) + int64_t(h) * p.grad_out_s[4] + ch,
                   ch, p.dim_v, true);
  load_channels<C>(o, static_cast<const T*>(p.out) + int64_t(b) * p.out_s[0] +
                          token_offset<NA>(c, p.out_s) + int64_t(h) * p.out_s[4] + ch, ch, p.dim_v, true);
  // delta = rowsum(dO * O) - grad_lse: dS = P * (dP - delta) (with dropout, O is the dropped
  // output and dP = m dO.v / (1 - p)).
  float dl[1] = {dot<C>(dout, o)};
  group_sum_n<TPQ, 1>(dl, mask);
  const float delta = dl[0] - (p.grad_lse ? p.grad_lse[row] : 0.f);
  if (lane == 0) p.delta[row] = delta;
  const float lse2 = lse_log2(p.lse[row]);
#pragma unroll
  for (int i = 0; i < C; ++i) q[i] *= p.scale_log2;

  const T* K = head_base<const T>(p.k, p.k_s, b, hkv) + ch;
  const T* V = head_base<const T>(p.v, p.v_s, b, hkv) + ch;
  const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
  BoxCursor<NA, kDrop ? 3 : 2> cur = key_cursor<NA, kDrop>(p, win, g, ig);
  const int total = box_size<NA>(win);
  QueryDrop drop;
  if constexpr (kDrop) drop.init(p, b, h, uint32_t(qi));
  float dq[C];
#pragma unroll
  for (int i = 0; i < C; ++i) dq[i] = 0.f;
  for (int base = 0; base < total; base += U) {
    float kk[U][C], red[2 * U];  // red: logits, then dP
    float bias[U];
    bool keep[U];  // dropout: whether key u is kept
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = U == 1 || base + u < total;
      if constexpr (kDrop) keep[u] = ok && drop.keep(uint32_t(cur.off[2]), p.drop_threshold);
      float vv[C];
      load_channels<C>(kk[u], K + cur.off[0], ch, p.dim, ok);
      load_channels<C>(vv, V + cur.off[1], ch, p.dim_v, ok);
      red[u] = dot<C>(q, kk[u]);
      red[U + u] = dot<C>(dout, vv);
      bias[u] = rpb && ok ? rpb[cur.rpb] * kLog2e : 0.f;
      cur.next();
    }
    group_sum_n<TPQ, 2 * U>(red, mask);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = U == 1 || base + u < total;
      float dp = red[U + u];
      if constexpr (kDrop) dp = keep[u] ? dp * p.drop_scale : 0.f;  // m dP / (1 - p)
      const float ds = ok ? exp2f(red[u] + bias[u] - lse2) * (dp - delta) : 0.f;
#pragma unroll
      for (int i = 0; i < C; ++i) dq[i] = fmaf(ds, kk[u][i], dq[i]);
    }
  }
  if (has_qk) {
#pragma unroll
    for (int i = 0; i < C; ++i) dq[i] *= p.scale;
    store_channels<C>(static_cast<T*>(p.dq) + int64_t(b) * p.dq_s[0] + token_offset<NA>(c, p.dq_s) +
                          int64_t(h) * p.dq_s[4] + ch, dq, ch, p.dim);
  }
}

// ------------------------------------------------------ backward: dK, dV, dRPB per key
template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(kThreads) backward_dkv_kernel(const Params p) {
  constexpr int C = cpt<HD>(), TPQ = tpq<HD>(), QPB = kThreads / TPQ, U = kBwdChunk;
  extern __shared__ float drpb_smem[];  // [groups, rpb_head_size] when p.rpb_in_smem
  const int lane = threadIdx.x % TPQ;
  const int64_t kj = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const bool stage = p.rpb != nullptr && p.rpb_in_smem;
  const int64_t smem_len = int64_t(p.groups) * p.rpb_head_size;
  if (stage) drpb_stage_begin(drpb_smem, smem_len);
  if (kj < p.tokens) {  // no early return: the block meets again at the dRPB flush
    const unsigned mask = group_mask<TPQ>();
    const int ch = lane * C;
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
    float kk[C], vv[C], dk[C], dv[C];
    load_channels<C>(kk, static_cast<const T*>(p.k) + int64_t(b) * p.k_s[0] +
                             token_offset<NA>(c, p.k_s) + int64_t(hkv) * p.k_s[4] + ch, ch, p.dim, true);
    load_channels<C>(vv, static_cast<const T*>(p.v) + int64_t(b) * p.v_s[0] +
                             token_offset<NA>(c, p.v_s) + int64_t(hkv) * p.v_s[4] + ch, ch, p.dim_v, true);
#pragma unroll
    for (int i = 0; i < C; ++i) {
      kk[i] *= p.scale_log2;
      dk[i] = 0.f;
      dv[i] = 0.f;
    }
    const AxisStrides qs = axis_strides(p.q_s), gs = axis_strides(p.grad_out_s);
    const AxisStrides ts = token_strides<NA>(p.spatial);
    const int64_t* strides[3] = {qs.s, gs.s, ts.s};
    const int total = box_size<NA>(inv);
    for (int hg = 0; hg < p.groups; ++hg) {  // GQA: every query head of this KV head
      const int h = hkv * p.groups + hg;
      const T* Q = head_base<const T>(p.q, p.q_s, b, h) + ch;
      const T* DO = static_cast<const T*>(p.grad_out) + int64_t(b) * p.grad_out_s[0] +
                    int64_t(h) * p.grad_out_s[4] + ch;
      const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
      const int64_t row0 = int64_t(b) * p.tokens * p.heads + h;
      BoxCursor<NA, 3> cur(inv, g, p, strides, -1, jg);  // walks queries; off[2]: token index
      DropKeys drop;  // the mask of query head h
      if constexpr (kDrop) drop.init(p, b, h);
      for (int base = 0; base < total; base += U) {
        float qq[U][C], dd[U][C], red[2 * U], lse2[U], dlt[U], bias[U];
        int ridx[U];
        bool keep[U];  // dropout: whether (query u, this key) is kept
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const bool ok = U == 1 || base + u < total;
          if constexpr (kDrop) keep[u] = ok && drop.keep(uint32_t(cur.off[2]), uint32_t(kj), p.drop_threshold);
          const int64_t row = row0 + (ok ? cur.off[2] : 0) * p.heads;
          load_channels<C>(qq[u], Q + cur.off[0], ch, p.dim, ok);
          load_channels<C>(dd[u], DO + cur.off[1], ch, p.dim_v, ok);
          red[u] = dot<C>(qq[u], kk);
          red[U + u] = dot<C>(dd[u], vv);
          lse2[u] = lse_log2(p.lse[row]);
          dlt[u] = p.delta[row];
          ridx[u] = cur.rpb;
          bias[u] = rpb && ok ? rpb[cur.rpb] * kLog2e : 0.f;
          cur.next();
        }
        group_sum_n<TPQ, 2 * U>(red, mask);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (U > 1 && base + u >= total) continue;
          float pr = exp2f(red[u] + bias[u] - lse2[u]);
          float dp = red[U + u];
          if constexpr (kDrop) dp = keep[u] ? dp * p.drop_scale : 0.f;  // m dP / (1 - p)
          const float ds = pr * (dp - dlt[u]);
          if constexpr (kDrop) pr = keep[u] ? pr : 0.f;  // dV takes the masked P (1 / (1 - p) at the store)
#pragma unroll
          for (int i = 0; i < C; ++i) {
            dv[i] = fmaf(pr, dd[u][i], dv[i]);
            dk[i] = fmaf(ds, qq[u][i], dk[i]);
          }
          if (rpb && lane == 0) {
            if (stage) atomicAdd(drpb_smem + int64_t(hg) * p.rpb_head_size + ridx[u], ds);
            else atomicAdd(p.drpb + int64_t(h) * p.rpb_head_size + ridx[u], ds);
          }
        }
      }
    }
    if (has_qk) {
#pragma unroll
      for (int i = 0; i < C; ++i) dk[i] *= p.scale;
      store_channels<C>(static_cast<T*>(p.dk) + int64_t(b) * p.dk_s[0] + token_offset<NA>(c, p.dk_s) +
                            int64_t(hkv) * p.dk_s[4] + ch, dk, ch, p.dim);
    }
    if constexpr (kDrop) {
#pragma unroll
      for (int i = 0; i < C; ++i) dv[i] *= p.drop_scale;
    }
    if (has_v)
      store_channels<C>(static_cast<T*>(p.dv) + int64_t(b) * p.dv_s[0] + token_offset<NA>(c, p.dv_s) +
                            int64_t(hkv) * p.dv_s[4] + ch, dv, ch, p.dim_v);
  }
  if (stage) drpb_stage_flush(p, hkv, drpb_smem, smem_len);
}

// ------------------------------------------------------------------------- launchers
template <typename T, int NA, int HD, bool kDrop>
void launch_forward_as(const Params& p, cudaStream_t stream) {
  constexpr int QPB = kThreads / tpq<HD>();
  const dim3 grid(unsigned((p.tokens + QPB - 1) / QPB), unsigned(p.heads), unsigned(p.batch));
  forward_kernel<T, NA, HD, kDrop><<<grid, kThreads, 0, stream>>>(p);
}

template <typename T, int NA, int HD, bool kDrop>
void launch_backward_as(const Params& p, cudaStream_t stream) {
  constexpr int QPB = kThreads / tpq<HD>();
  const unsigned blocks = unsigned((p.tokens + QPB - 1) / QPB);
  backward_dq_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads, p.batch), kThreads, 0, stream>>>(p);
  Params pk = p;
  const int64_t smem = drpb_stage_bytes(p);  // larger tables go straight to global atomics
  pk.rpb_in_smem = smem > 0;
  backward_dkv_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads_kv, p.batch), kThreads,
                                          pk.rpb_in_smem ? size_t(smem) : 0, stream>>>(pk);
}

// A call with attention dropout (Params::drop_rng) runs the kDrop instances.
template <typename T, int NA, int HD>
void launch_forward(const Params& p, cudaStream_t stream) {
  if (p.drop_rng) launch_forward_as<T, NA, HD, true>(p, stream);
  else launch_forward_as<T, NA, HD, false>(p, stream);
}

template <typename T, int NA, int HD>
void launch_backward(const Params& p, cudaStream_t stream) {
  if (p.drop_rng) launch_backward_as<T, NA, HD, true>(p, stream);
  else launch_backward_as<T, NA, HD, false>(p, stream);
}

}  }  // namespace nattn::simt
