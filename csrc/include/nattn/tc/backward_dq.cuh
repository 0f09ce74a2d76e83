// The tensor-core backward's dQ pass: delta = rowsum(dO * O) - dLSE, then S, dP = dO V^T,
// dS = P (dP - delta), dQ += dS K over a warp's window union; writes dQ and delta (and, with
// RPB, each head's largest |dS| for the fixed-point dRPB of the dK/dV pass).
#pragma once
#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/tc/walk.cuh"

namespace nattn { namespace tc {

// --------------------------------------------------------------- backward: dQ + delta
template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(block_warps<T, HD>() * 32, dq_blocks<T, NA, HD, kDrop>())
    backward_dq_kernel(const Params p) {
#if NATTN_TC_ENABLED
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  constexpr int KT = Lt::KT, NT = Lt::NT;
  extern __shared__ __align__(16) uint16_t tc_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  S* buf = reinterpret_cast<S*>(tc_smem) + warp * ((2 * kTcStages + 2) * Lt::TILE);  // stages x (K, V), its Q, dO
  S* sQ = buf + 2 * kTcStages * Lt::TILE;
  int g[3], L[3], first[3];
  const bool has_box = warp_box<NA>(p, p.box, int64_t(blockIdx.x) * block_warps<T, HD>() + warp, g, L, first);
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  // the head's bias table after the warps' tiles (all threads: before any warp returns)
  const float* bias_smem =
      stage_query_bias(p, reinterpret_cast<float*>(reinterpret_cast<S*>(tc_smem) + block_warps<T, HD>() *
                                                   ((2 * kTcStages + 2) * Lt::TILE)), h);
  if (!has_box) return;
  const Rows<NA, false> rw(p, first, L, lane);
  AxisRange u[3];
  box_union<NA, false>(p, p.box, first, L, u);
  int rmult[3];
  rpb_mults<NA>(p, rmult);

  // The rows' LSE and dLSE first, and dO and O for delta after chunk 0's copies are issued:
  // their global-load latencies overlap the staging (Nsight Compute, PERF.md fourteenth
  // session: waiting on them was ~15% of this pass's stall samples at DiNAT's 7x7).
  float lse_in[2], dlse[2];
  int64_t row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = (int64_t(b) * p.tokens + token_index<NA>(p, rw.ig[r], g)) * p.heads + h;
    lse_in[r] = rw.ok[r] ? p.lse[row[r]] : 0.f;
    dlse[r] = p.grad_lse && rw.ok[r] ? p.grad_lse[row[r]] : 0.f;
  }
  const T* D = head_base<const T>(p.grad_out, p.grad_out_s, b, h);
  {
    const T* Q = head_base<const T>(p.q, p.q_s, b, h);
    rw.template stage<T, HD>(sQ, p, Q, p.q_s, g, p.dim, lane);
    rw.template stage<T, HD>(sQ + Lt::TILE, p, D, p.grad_out_s, g, p.dim_v, lane);
    cp_async_commit();
  }
  RowWalk<T, NA, HD, kDrop> keys(p, rw, g, u, buf, lane, b, h, hkv, rmult);
  auto& walk = keys.walk;
  const float* rpb = keys.rpb;
  walk.prologue();

  float delta[2], lse2[2];
  {
    const T* O = head_base<const T>(p.out, p.out_s, b, h);
    // delta = rowsum(dO * O) - dLSE: this lane's channels of both rows, then its quad
    float dl[2] = {0.f, 0.f};
    if constexpr (Lt::kF32) {
      row_dots_f32<HD>(dl, D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[0], g),
                       D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[1], g),
                       O + spatial_offset<NA>(p, p.out_s, rw.ig[0], g), O + spatial_offset<NA>(p, p.out_s, rw.ig[1], g),
                       p.dim_v, tq);
    } else {
      unsigned da[KT][4];
      load_a<HD>(da, D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[0], g),
                 D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[1], g), p.dim_v, tq);
      unsigned oa[KT][4];
      load_a<HD>(oa, O + spatial_offset<NA>(p, p.out_s, rw.ig[0], g), O + spatial_offset<NA>(p, p.out_s, rw.ig[1], g),
                 p.dim_v, tq);
#pragma unroll
      for (int kt = 0; kt < KT; ++kt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float d0, d1, o0, o1;
          Mma<T>::unpack(da[kt][i], d0, d1);
          Mma<T>::unpack(oa[kt][i], o0, o1);
          dl[i & 1] += d0 * o0 + d1 * o1;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      delta[r] = quad_sum(dl[r]) - dlse[r];
      lse2[r] = rw.ok[r] ? lse_log2(lse_in[r]) : 0.f;
      if (tq == 0 && rw.ok[r]) p.delta[row[r]] = delta[r];
    }
  }

  float dq[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[nt][e] = 0.f;
  unsigned ds_max = 0;  // with RPB: the largest |dS| of the lane's scores, as float bits
  if constexpr (Lt::kF32) walk.template round_own_rows_tf32<2>(sQ, lane);  // the Q and dO rows
  for (int ci = 0; ci < walk.chunks; ++ci) {
    walk.arrive(ci);
    const S* sK = walk.tile(ci);
    Cols cl;
    uint32_t ktok[4];
    walk.template take<kDrop>(ci, cl, rmult, rpb != nullptr, ktok, g);
    unsigned keep = 0;
    if constexpr (kDrop) keep = keep_bits_query_rows(keys.drop, keys.qtok, ktok, p.drop_threshold);
    float s[2][4], dp[2][4];
    mma_tiles_t<T, HD>(s, sQ, sK, lane);
    mma_tiles_t<T, HD>(dp, sQ + Lt::TILE, sK + Lt::TILE, lane);
    bias_instanced(!rpb ? kNoBias : bias_smem ? kBiasShared : kBiasGlobal, [&](auto at) {
      constexpr bool kRpb = decltype(at)::value != kNoBias;
      for_each_score([&](int nt, int e, int r, int q) {
        const bool ok = rw.ok[r] && cl.ok[r][q];
        float v = s[nt][e] * p.scale_log2;
        if constexpr (decltype(at)::value == kBiasShared)  // as in the forward
          v = fmaf(s[nt][e], p.scale_log2, table_bias(bias_smem, ok, rpb_index<false>(keys.rrow[r], cl.rpb[q])));
        else if constexpr (decltype(at)::value == kBiasGlobal)
          v += table_bias(rpb, ok, rpb_index<false>(keys.rrow[r], cl.rpb[q])) * kLog2e;
        float dpe = dp[nt][e];
        if constexpr (kDrop) dpe = kept(keep, r, q) ? dpe * p.drop_scale : 0.f;  // m dP / (1 - p)
        s[nt][e] = ok ? fast_exp2(v - lse2[r]) * (dpe - delta[r]) : 0.f;  // dS
        if constexpr (kRpb) ds_max = drpb_abs_max(ds_max, s[nt][e]);
      });
    });
    unsigned dsa[Lt::AREGS];
    pack_a<T>(dsa, s);
    mma_rows<T, HD>(dq, dsa, sK, lane);
    __syncwarp();
  }
  if (p.drpb_max) {  // warp-uniform: every lane of a warp with a box gets here
    ds_max = __reduce_max_sync(0xffffffffu, ds_max);
    if (lane == 0) atomicMax(p.drpb_max + h, ds_max);
  }
  cp_async_wait<0>();
  T* DQ = head_base<T>(p.dq, p.dq_s, b, h);
  store_rows<T, HD>(DQ + spatial_offset<NA>(p, p.dq_s, rw.ig[0], g), DQ + spatial_offset<NA>(p, p.dq_s, rw.ig[1], g),
                    rw.ok[0], rw.ok[1], dq, p.scale, p.scale, p.dim, tq);
#endif
}

}  }  // namespace nattn::tc
