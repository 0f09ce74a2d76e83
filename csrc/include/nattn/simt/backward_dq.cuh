// The SIMT backward's dQ pass: per query, delta = rowsum(dO * O) - dLSE and dQ over its window
// (and, with a fixed-point dRPB, each head's largest |dS|: common/drpb_fixed.cuh).
#pragma once
#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/simt/common.cuh"
#include "nattn/simt/dropout.cuh"

namespace nattn { namespace simt {

// --------------------------------------------------------------- backward: dQ + delta
template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(kThreads) backward_dq_kernel(const Params p) {
  constexpr int C = cpt<HD>(), TPQ = tpq<HD>(), QPB = kThreads / TPQ, U = kBwdChunk;
  const int lane = threadIdx.x % TPQ;
  const int64_t qi = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  __shared__ unsigned blk_max[2];  // fixed-point dRPB: the block's largest |dS|, threads counted
  if (p.drpb_max) {
    if (threadIdx.x == 0) blk_max[0] = blk_max[1] = 0;
    __syncthreads();
  }
  if (qi >= p.tokens) {
    if (p.drpb_max) drpb_max_arrive(blk_max, 0, p.drpb_max + h);
    return;
  }
  const unsigned mask = group_mask<TPQ>();
  const int ch = lane * C;
  const bool has_qk = ch < p.dim;

  int c[3], g[3], ig[3];
  AxisRange win[3];
  token_windows<NA>(qi, p, c, g, ig, win);
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
  unsigned ds_max = 0;  // with a fixed-point dRPB: the largest |dS| of the query's scores, as float bits
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
      if (p.drpb_max) ds_max = drpb_abs_max(ds_max, ds);  // only for a fixed-point dRPB
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
  if (p.drpb_max) drpb_max_arrive(blk_max, ds_max, p.drpb_max + h);
}

}  }  // namespace nattn::simt
