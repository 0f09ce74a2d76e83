// The SIMT backward's dK/dV pass: per key, over its inverse neighbourhood (every query head
// of its KV head): dK, dV and dRPB (staged per block: in int64 fixed point with the launcher's
// workspace, common/drpb_fixed.cuh, else float32, common/drpb.cuh).
#pragma once
#include "nattn/common/drpb.cuh"
#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/simt/common.cuh"
#include "nattn/simt/dropout.cuh"

namespace nattn { namespace simt {

// ------------------------------------------------------ backward: dK, dV, dRPB per key
// Fraction bits of the fixed-point dRPB (int64 tables): a table entry's terms in the call are
// at most one per key token and batch.
__host__ __device__ inline int drpb_bits(const Params& p) { return fixed_bits_wide((long long)p.batch * p.tokens); }

template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(kThreads) backward_dkv_kernel(const Params p) {
  constexpr int C = cpt<HD>(), TPQ = tpq<HD>(), QPB = kThreads / TPQ, U = kBwdChunk;
  extern __shared__ __align__(8) float drpb_smem[];  // [groups, rpb_head_size] when p.rpb_in_smem (int64: twice)
  const int lane = threadIdx.x % TPQ;
  const int64_t kj = int64_t(blockIdx.x) * QPB + threadIdx.x / TPQ;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const bool stage = p.rpb != nullptr && p.rpb_in_smem;
  const bool fixed = stage && p.drpb_fixed != nullptr;  // an int64 table: twice the words
  long long* const fixed_smem = reinterpret_cast<long long*>(drpb_smem);
  const int bits = fixed ? drpb_bits(p) : 0;
  const int64_t smem_len = int64_t(p.groups) * p.rpb_head_size;
  if (stage) drpb_stage_begin(drpb_smem, fixed ? 2 * smem_len : smem_len);
  if (kj < p.tokens) {  // no early return: the block meets again at the dRPB flush
    const unsigned mask = group_mask<TPQ>();
    const int ch = lane * C;
    const bool has_qk = ch < p.dim, has_v = ch < p.dim_v;
    int c[3], g[3], jg[3];
    AxisRange inv[3];
    token_windows<NA, true>(kj, p, c, g, jg, inv);
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
      const float fixed_scale = fixed ? drpb_fixed_scale(p.drpb_max[h], bits) : 0.f;
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
            if (fixed)  // exact: a power-of-two scale, then the float's integer value
              atomicAdd(reinterpret_cast<unsigned long long*>(fixed_smem) + int64_t(hg) * p.rpb_head_size + ridx[u],
                        (unsigned long long)__float2ll_rn(ds * fixed_scale));
            else if (stage) atomicAdd(drpb_smem + int64_t(hg) * p.rpb_head_size + ridx[u], ds);
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
  if (fixed) drpb_fixed_flush(p, hkv, fixed_smem, smem_len);
  else if (stage) drpb_stage_flush(p, hkv, drpb_smem, smem_len);
}

}  }  // namespace nattn::simt
