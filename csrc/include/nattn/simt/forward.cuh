// The SIMT forward: per query, an online softmax over its window; writes out and the LSE.
#pragma once
#include "nattn/common/softmax.cuh"
#include "nattn/simt/common.cuh"
#include "nattn/simt/dropout.cuh"

namespace nattn { namespace simt {

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
  token_windows<NA>(qi, p, c, g, ig, win);
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

}  }  // namespace nattn::simt
