// The tensor-core forward: S = Q K^T, online softmax, O += P V over a warp's window union;
// writes O and the LSE (kernels.cuh has the family's overview).
#pragma once
#include <math.h>

#include "nattn/common/softmax.cuh"
#include "nattn/tc/walk.cuh"

namespace nattn { namespace tc {

// ------------------------------------------------------------------------- forward
template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(block_warps<T, HD>() * 32, fwd_blocks<T, NA, HD, kDrop>())
    forward_kernel(const Params p) {
#if NATTN_TC_ENABLED
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  constexpr int NT = Lt::NT;
  extern __shared__ __align__(16) uint16_t tc_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  S* buf = reinterpret_cast<S*>(tc_smem) + warp * ((2 * kTcStages + 1) * Lt::TILE);  // stages x (K, V), its Q rows
  S* sQ = buf + 2 * kTcStages * Lt::TILE;
  int g[3], L[3], first[3];
  const bool has_box = warp_box<NA>(p, p.box, int64_t(blockIdx.x) * block_warps<T, HD>() + warp, g, L, first);
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  // the head's bias table after the warps' tiles (all threads: before any warp returns)
  const float* bias_smem =
      stage_query_bias(p, reinterpret_cast<float*>(reinterpret_cast<S*>(tc_smem) + block_warps<T, HD>() *
                                                   ((2 * kTcStages + 1) * Lt::TILE)), h);
  if (!has_box) return;
  const Rows<NA, false> rw(p, first, L, lane);
  AxisRange u[3];
  box_union<NA, false>(p, p.box, first, L, u);
  int rmult[3];
  rpb_mults<NA>(p, rmult);
  {
    const T* Q = head_base<const T>(p.q, p.q_s, b, h);
    rw.template stage<T, HD>(sQ, p, Q, p.q_s, g, p.dim, lane);
    cp_async_commit();  // completes with the first chunk (groups retire in order)
  }
  RowWalk<T, NA, HD, kDrop> keys(p, rw, g, u, buf, lane, b, h, hkv, rmult);
  auto& walk = keys.walk;
  const float* rpb = keys.rpb;

  float o[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  walk.prologue();
  if constexpr (Lt::kF32) walk.template round_own_rows_tf32<1>(sQ, lane);  // the Q rows
  for (int ci = 0; ci < walk.chunks; ++ci) {
    walk.arrive(ci);  // (its __syncwarp also orders the rounding before any lane's reads)
    const S* sK = walk.tile(ci);
    Cols cl;
    uint32_t ktok[4];
    walk.template take<kDrop>(ci, cl, rmult, rpb != nullptr, ktok, g);
    unsigned keep = 0;
    if constexpr (kDrop) keep = keep_bits_query_rows(keys.drop, keys.qtok, ktok, p.drop_threshold);
    float s[2][4];
    mma_tiles_t<T, HD>(s, sQ, sK, lane);
    float mx[2] = {-INFINITY, -INFINITY};
    bias_instanced(!rpb ? kNoBias : bias_smem ? kBiasShared : kBiasGlobal, [&](auto at) {
      for_each_score([&](int nt, int e, int r, int q) {
        const bool ok = cl.ok[r][q];
        float v = s[nt][e] * p.scale_log2;
        // unconditional (entry 0 outside the window, whose score is masked below): a
        // conditional load compiled to a branch per score
        if constexpr (decltype(at)::value == kBiasShared)  // the staged copy holds the bias times log2(e)
          v = fmaf(s[nt][e], p.scale_log2, table_bias(bias_smem, ok, rpb_index<false>(keys.rrow[r], cl.rpb[q])));
        else if constexpr (decltype(at)::value == kBiasGlobal)
          v += table_bias(rpb, ok, rpb_index<false>(keys.rrow[r], cl.rpb[q])) * kLog2e;
        s[nt][e] = ok ? v : -INFINITY;
        mx[r] = fmaxf(mx[r], s[nt][e]);
      });
    });
    float ref[2];
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], quad_max(mx[r]));
      ref[r] = mn == -INFINITY ? 0.f : mn;
      corr[r] = fast_exp2(m[r] - ref[r]);  // 0 while nothing was seen, 1 while the max holds
      m[r] = mn;
      l[r] *= corr[r];
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {  // rescale only when a max grew
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] *= corr[e >> 1];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = fast_exp2(s[nt][e] - ref[e >> 1]);
        l[e >> 1] += s[nt][e];  // the row sum (and so the LSE) without dropout
        if constexpr (kDrop) s[nt][e] = kept(keep, e >> 1, nt * 2 + (e & 1)) ? s[nt][e] : 0.f;
      }
    unsigned pa[Lt::AREGS];
    pack_a<T>(pa, s);
    mma_rows<T, HD>(o, pa, sK + Lt::TILE, lane);
    __syncwarp();  // this slot is refilled kTcStages chunks on
  }
  cp_async_wait<0>();  // no copy may land after the block's shared memory is gone
  const float l0 = quad_sum(l[0]), l1 = quad_sum(l[1]);
  const float keep_scale = kDrop ? p.drop_scale : 1.f;  // kept weights meet V times 1 / (1 - p)
  T* O = head_base<T>(p.out, p.out_s, b, h);
  store_rows<T, HD>(O + spatial_offset<NA>(p, p.out_s, rw.ig[0], g), O + spatial_offset<NA>(p, p.out_s, rw.ig[1], g),
                    rw.ok[0], rw.ok[1], o, inv_row_sum(l0) * keep_scale, inv_row_sum(l1) * keep_scale, p.dim_v, tq);
  if (tq == 0) {
    if (rw.ok[0]) p.lse[(int64_t(b) * p.tokens + token_index<NA>(p, rw.ig[0], g)) * p.heads + h] = row_lse(m[0], l0);
    if (rw.ok[1]) p.lse[(int64_t(b) * p.tokens + token_index<NA>(p, rw.ig[1], g)) * p.heads + h] = row_lse(m[1], l1);
  }
#endif
}

}  }  // namespace nattn::tc
