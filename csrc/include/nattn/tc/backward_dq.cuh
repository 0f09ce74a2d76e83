// The tensor-core backward's dQ pass: delta = rowsum(dO * O) - dLSE, then S, dP = dO V^T,
// dS = P (dP - delta), dQ += dS K over a warp's window union; writes dQ and delta.
#pragma once
#include "nattn/common/softmax.cuh"
#include "nattn/tc/walk.cuh"

namespace nattn { namespace tc {

// --------------------------------------------------------------- backward: dQ + delta
// MT m-tiles a warp (config.cuh, dq_mtiles), as in the forward.
template <typename T, int NA, int HD, bool kDrop, int MT = 1>
__global__ void __launch_bounds__(block_warps<T, HD>() * 32, dq_blocks<T, NA, HD, kDrop, MT>())
    backward_dq_kernel(const Params p) {
#if NATTN_TC_ENABLED
  constexpr int R = 2 * MT;  // rows a lane holds
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  constexpr int KT = Lt::KT, NT = Lt::NT;
  extern __shared__ __align__(16) uint16_t tc_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  S* buf = reinterpret_cast<S*>(tc_smem) + warp * ((2 * kTcStages + 2 * MT) * Lt::TILE);  // stages x (K, V), its Q, dO
  S* sQ = buf + 2 * kTcStages * Lt::TILE;
  int g[3], L[3], first[3];
  if (!warp_box<NA>(p, p.box, int64_t(blockIdx.x) * block_warps<T, HD>() + warp, g, L, first)) return;
  const Rows<NA, false, MT> rw(p, first, L, lane);
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  AxisRange u[3];
  box_union<NA, false>(p, p.box, first, L, u);
  int rmult[3];
  rpb_mults<NA>(p, rmult);

  // The rows' LSE and dLSE first, and dO and O for delta after chunk 0's copies are issued:
  // their global-load latencies overlap the staging (Nsight Compute, PERF.md fourteenth
  // session: waiting on them was ~15% of this pass's stall samples at DiNAT's 7x7).
  float lse_in[R], dlse[R];
  int64_t row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row[r] = (int64_t(b) * p.tokens + token_index<NA>(p, rw.ig[r], g)) * p.heads + h;
    lse_in[r] = rw.ok[r] ? p.lse[row[r]] : 0.f;
    dlse[r] = p.grad_lse && rw.ok[r] ? p.grad_lse[row[r]] : 0.f;
  }
  const T* D = head_base<const T>(p.grad_out, p.grad_out_s, b, h);
  {
    const T* Q = head_base<const T>(p.q, p.q_s, b, h);
    rw.template stage<T, HD>(sQ, p, Q, p.q_s, g, p.dim, lane);
    rw.template stage<T, HD>(sQ + MT * Lt::TILE, p, D, p.grad_out_s, g, p.dim_v, lane);
    cp_async_commit();
  }
  RowWalk<T, NA, HD, kDrop, MT> keys(p, rw, g, u, buf, lane, b, h, hkv, rmult);
  auto& walk = keys.walk;
  const float* rpb = keys.rpb;
  walk.prologue();

  float delta[R], lse2[R];
  {
    const T* O = head_base<const T>(p.out, p.out_s, b, h);
    // delta = rowsum(dO * O) - dLSE: this lane's channels of both rows of each m-tile, then its quad
    float dl[R];
#pragma unroll
    for (int r = 0; r < R; ++r) dl[r] = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int r0 = 2 * mt, r1 = r0 + 1;
      if constexpr (Lt::kF32) {
        row_dots_f32<HD>(dl + r0, D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[r0], g),
                         D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[r1], g),
                         O + spatial_offset<NA>(p, p.out_s, rw.ig[r0], g),
                         O + spatial_offset<NA>(p, p.out_s, rw.ig[r1], g), p.dim_v, tq);
      } else {
        unsigned da[KT][4];
        load_a<HD>(da, D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[r0], g),
                   D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[r1], g), p.dim_v, tq);
        unsigned oa[KT][4];
        load_a<HD>(oa, O + spatial_offset<NA>(p, p.out_s, rw.ig[r0], g),
                   O + spatial_offset<NA>(p, p.out_s, rw.ig[r1], g), p.dim_v, tq);
#pragma unroll
        for (int kt = 0; kt < KT; ++kt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float d0, d1, o0, o1;
            Mma<T>::unpack(da[kt][i], d0, d1);
            Mma<T>::unpack(oa[kt][i], o0, o1);
            dl[r0 + (i & 1)] += d0 * o0 + d1 * o1;
          }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      delta[r] = quad_sum(dl[r]) - dlse[r];
      lse2[r] = rw.ok[r] ? lse_log2(lse_in[r]) : 0.f;
      if (tq == 0 && rw.ok[r]) p.delta[row[r]] = delta[r];
    }
  }

  float dq[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[mt][nt][e] = 0.f;
  if constexpr (Lt::kF32) walk.template round_own_rows_tf32<2 * MT>(sQ, lane);  // the Q and dO rows
  for (int ci = 0; ci < walk.chunks; ++ci) {
    walk.arrive(ci);
    const S* sK = walk.tile(ci);
    ColsOf<R> cl;
    uint32_t ktok[4];
    walk.template take<kDrop>(ci, cl, rmult, rpb != nullptr, ktok, g);
    unsigned keep = 0;
    if constexpr (kDrop) keep = keep_bits_query_rows(keys.drop, keys.qtok, ktok, p.drop_threshold);
    // Each m-tile's products and scores in turn (its S and dP live only for its turn).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float s[2][4], dp[2][4];
      mma_tiles_t<T, HD>(s, sQ + mt * Lt::TILE, sK, lane);
      mma_tiles_t<T, HD>(dp, sQ + (MT + mt) * Lt::TILE, sK + Lt::TILE, lane);
      rpb_instanced(rpb != nullptr, [&](auto with_rpb) {
        for_each_score([&](int nt, int e, int r2, int q) {
          const int r = 2 * mt + r2;
          const bool ok = rw.ok[r] && cl.ok[r][q];
          float v = s[nt][e] * p.scale_log2;
          if constexpr (decltype(with_rpb)::value) {
            v += table_bias(rpb, ok, rpb_index<false>(keys.rrow[r], cl.rpb[q])) * kLog2e;  // as in the forward
          }
          float dpe = dp[nt][e];
          if constexpr (kDrop) dpe = kept(keep, r2, q) ? dpe * p.drop_scale : 0.f;  // m dP / (1 - p)
          s[nt][e] = ok ? fast_exp2(v - lse2[r]) * (dpe - delta[r]) : 0.f;  // dS
        });
      });
      unsigned dsa[Lt::AREGS];
      pack_a<T>(dsa, s);
      mma_rows<T, HD>(dq[mt], dsa, sK, lane);
    }
    __syncwarp();
  }
  cp_async_wait<0>();
  T* DQ = head_base<T>(p.dq, p.dq_s, b, h);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int r0 = 2 * mt, r1 = r0 + 1;
    store_rows<T, HD>(DQ + spatial_offset<NA>(p, p.dq_s, rw.ig[r0], g), DQ + spatial_offset<NA>(p, p.dq_s, rw.ig[r1], g),
                      rw.ok[r0], rw.ok[r1], dq[mt], p.scale, p.scale, p.dim, tq);
  }
#endif
}

}  }  // namespace nattn::tc
