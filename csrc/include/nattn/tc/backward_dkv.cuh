// The tensor-core backward's dK/dV pass: per box of 16 keys over their inverse
// neighbourhoods, for every query head of the KV head: S^T = K Q^T, dP^T = V dO^T,
// dV += P^T dO, dK += dS^T Q, and dRPB (staged per block in fixed point, common/drpb_fixed.cuh,
// where its table fits; else float32 atomics on global memory).
#pragma once
#include "nattn/common/drpb.cuh"
#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/tc/walk.cuh"

namespace nattn { namespace tc {

// ------------------------------------------------------ backward: dK, dV, dRPB per key
template <typename T, int HD>
constexpr int dkv_warp_bytes() {
  // stages x (Q, dO), own K, V; stages x (lse, delta)
  return (2 * kTcStages + 2) * Layout<T, HD>::TILE * int(sizeof(typename Layout<T, HD>::S)) + kTcStages * 2 * CW * 4;
}

// Fraction bits of the fixed-point dRPB: a block's keys bound a table entry's terms.
template <typename T, int HD>
constexpr int dkv_fixed_bits() {
  return fixed_bits(block_warps<T, HD>() * QW);
}

template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(block_warps<T, HD>() * 32, dkv_blocks_as<T, NA, HD, kDrop>())
    backward_dkv_kernel(const Params p) {
#if NATTN_TC_ENABLED
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  constexpr int NT = Lt::NT, W = block_warps<T, HD>();
  extern __shared__ __align__(16) uint16_t tc_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  S* buf = reinterpret_cast<S*>(tc_smem) + warp * ((2 * kTcStages + 2) * Lt::TILE);
  S* sK = buf + 2 * kTcStages * Lt::TILE;  // the warp's K and V rows
  float* past_tiles = reinterpret_cast<float*>(reinterpret_cast<S*>(tc_smem) + W * (2 * kTcStages + 2) * Lt::TILE);
  float* sLD = past_tiles + warp * kTcStages * 2 * CW;  // [stage][lse | delta]
  float* drpb_smem = past_tiles + W * kTcStages * 2 * CW;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const bool stage_rpb = p.rpb != nullptr && p.rpb_in_smem;
  const int64_t smem_len = int64_t(p.groups) * p.rpb_head_size;
  // p.rpb_in_smem == 2: the bias table of the KV head's query heads is copied beside dRPB's,
  // so the score loop reads it from shared memory (32-bit addresses, shorter latency).
  const bool stage_bias = stage_rpb && p.rpb_in_smem == 2;
  // A staged dRPB is summed in fixed point (32-bit integers; the launcher stages it only with
  // the workspace); otherwise float32 atomics on global memory.
  float* const bias_smem = drpb_smem + smem_len;
  if (stage_bias) {  // pre-scaled to log2 units: the score's FFMA adds it
    const float* src = p.rpb + int64_t(hkv) * smem_len;
    for (int64_t i = threadIdx.x; i < smem_len; i += blockDim.x) bias_smem[i] = src[i] * kLog2e;
  }
  if (stage_rpb) drpb_stage_begin(drpb_smem, smem_len);
  // the staged dRPB's sink (past the bias copy where there is one; kDrpbSinkBytes at launch)
  int* const drpb_sink = drpb_sink_at(reinterpret_cast<int*>(drpb_smem) + smem_len * (stage_bias ? 2 : 1));
  int g[3], L[3], first[3];
  // no early return: the block meets again at the dRPB flush
  if (warp_box<NA>(p, p.box, int64_t(blockIdx.x) * W + warp, g, L, first)) {
    const Rows<NA, true> rw(p, first, L, lane);
    AxisRange u[3];
    box_union<NA, true>(p, p.box, first, L, u);
    int rmult[3];
    rpb_mults<NA>(p, rmult);
    {
      const T* K = head_base<const T>(p.k, p.k_s, b, hkv);
      const T* V = head_base<const T>(p.v, p.v_s, b, hkv);
      rw.template stage<T, HD>(sK, p, K, p.k_s, g, p.dim, lane);
      rw.template stage<T, HD>(sK + Lt::TILE, p, V, p.v_s, g, p.dim_v, lane);
      cp_async_commit();
    }
    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dk[nt][e] = 0.f;
        dv[nt][e] = 0.f;
      }
    const int rrow[2] = {rw.rpb_part(p, rmult, 0), rw.rpb_part(p, rmult, 1)};
    int64_t rst[4];  // row strides of the [B, N, H] LSE and delta: the token strides times H
    token_strides<NA>(p, rst);
#pragma unroll
    for (int a = 0; a < NA; ++a) rst[1 + a] *= p.heads;
    uint32_t ktok[2];  // dropout: the rows' key tokens
    if constexpr (kDrop) {
      ktok[0] = token_word<NA>(p, rw.ig[0], g);
      ktok[1] = token_word<NA>(p, rw.ig[1], g);
    }
    for (int hg = 0; hg < p.groups; ++hg) {  // GQA: every query head of this KV head
      const int h = hkv * p.groups + hg;
      const T* Qb = head_base<const T>(p.q, p.q_s, b, h);
      const T* Db = head_base<const T>(p.grad_out, p.grad_out_s, b, h);
      const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
      // The staged tables of head h: the instance reading the bias from shared memory adds
      // dRPB there too (a staged bias implies a staged dRPB), from per-head bases.
      const float* const bias_head = bias_smem + hg * p.rpb_head_size;
      int* const fixed_head = reinterpret_cast<int*>(drpb_smem) + hg * p.rpb_head_size;
      const int fixed_bank = int(smem_addr(fixed_head) / 4u);
      const float fixed_scale = stage_rpb ? drpb_fixed_scale(p.drpb_max[h], dkv_fixed_bits<T, HD>()) : 0.f;
      const int bias_at = !rpb ? kNoBias : stage_bias ? kBiasShared : kBiasGlobal;
      DropKeys drop;  // the mask of query head h
      if constexpr (kDrop) drop.init(p, b, h);
      Walk<T, NA, HD, true, true> walk(p, rw, g, u, buf, lane, Qb, p.q_s, p.dim, Db, p.grad_out_s, p.dim_v,
                                       all_token_rows(p, kRowsQ | kRowsGradOut), sLD,
                                       int64_t(b) * p.tokens, h, rst);
      walk.prologue();
      if constexpr (Lt::kF32) {  // first head: the own K and V rows
        if (hg == 0) walk.template round_own_rows_tf32<2>(sK, lane);
      }
      for (int ci = 0; ci < walk.chunks; ++ci) {
        walk.arrive(ci);
        const S* sQ = walk.tile(ci);
        const float* sL = walk.side_tile(ci);
        Cols cl;
        uint32_t qtok[4];
        walk.template take<kDrop>(ci, cl, rmult, rpb != nullptr, qtok, g);
        unsigned keep = 0;
        if constexpr (kDrop) keep = keep_bits_key_rows(drop, ktok, qtok, p.drop_threshold);
        float s[2][4], dp[2][4];
        mma_tiles_t<T, HD>(s, sK, sQ, lane);                          // S^T: keys x queries
        mma_tiles_t<T, HD>(dp, sK + Lt::TILE, sQ + Lt::TILE, lane);   // dP^T
        // The LSE (log2 units) and delta of the lane's 4 query columns, read once per chunk:
        // read per score, dRPB's shared-memory atomics made the compiler reload them.
        float lse2[4], delta[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          lse2[q] = lse_log2(sL[col_token(q, tq)]);
          delta[q] = sL[CW + col_token(q, tq)];
        }
        // P^T and dS^T in place of S^T and dP^T (bias_instanced: no bias loads or dRPB atomics
        // without RPB; the bias from shared memory where it is staged).
        int terms[2][4];  // the staged dRPB's fixed-point terms
        bias_instanced(bias_at, [&](auto at) {
          constexpr bool kRpb = decltype(at)::value != kNoBias;
          constexpr bool kShared = decltype(at)::value == kBiasShared;
          for_each_score([&](int nt, int e, int r, int q) {
            const bool ok = rw.ok[r] && cl.ok[r][q];
            float v = s[nt][e] * p.scale_log2;
            int ridx = 0;
            if constexpr (kRpb) {
              ridx = rpb_index<true>(rrow[r], cl.rpb[q]);
              // as in the forward: no branch per score (the same rounding either way: the
              // staged copy holds the product with kLog2e)
              if constexpr (kShared) v = fmaf(s[nt][e], p.scale_log2, table_bias(bias_head, ok, ridx));
              else v += table_bias(rpb, ok, ridx) * kLog2e;
            }
            const float pr = ok ? fast_exp2(v - lse2[q]) : 0.f;
            float dpe = dp[nt][e];
            if constexpr (kDrop) dpe = kept(keep, r, q) ? dpe * p.drop_scale : 0.f;  // m dP / (1 - p)
            const float ds = pr * (dpe - delta[q]);
            s[nt][e] = kDrop && !kept(keep, r, q) ? 0.f : pr;  // dV takes the masked P (1 / (1 - p) at the store)
            dp[nt][e] = ds;
            if constexpr (kRpb) {
              if (kShared || stage_rpb) terms[nt][e] = __float2int_rn(ds * fixed_scale);  // (added below)
              else if (ok) atomicAdd(p.drpb + int64_t(h) * p.rpb_head_size + ridx, ds);
            }
          });
        });
        // The staged dRPB's adds after the step's bias reads (a read after an atomic waits for
        // its operands: each score's bias read waited for the score before), one per score,
        // without a branch (common/drpb_fixed.cuh); native integer atomics.
        if (stage_rpb) {  // (a staged dRPB implies an RPB)
          for_each_score([&](int nt, int e, int r, int q) {
            drpb_add_or_sink(rw.ok[r] && cl.ok[r][q], fixed_head, drpb_sink, fixed_bank,
                             rpb_index<true>(rrow[r], cl.rpb[q]), terms[nt][e]);
          });
        }
        unsigned pa[Lt::AREGS], dsa[Lt::AREGS];
        pack_a<T>(pa, s);
        pack_a<T>(dsa, dp);
        mma_rows<T, HD>(dv, pa, sQ + Lt::TILE, lane);
        mma_rows<T, HD>(dk, dsa, sQ, lane);
        __syncwarp();
      }
    }
    cp_async_wait<0>();  // the own rows, when no query sees these keys
    T* DK = head_base<T>(p.dk, p.dk_s, b, hkv);
    T* DV = head_base<T>(p.dv, p.dv_s, b, hkv);
    store_rows<T, HD>(DK + spatial_offset<NA>(p, p.dk_s, rw.ig[0], g), DK + spatial_offset<NA>(p, p.dk_s, rw.ig[1], g),
                      rw.ok[0], rw.ok[1], dk, p.scale, p.scale, p.dim, tq);
    const float keep_scale = kDrop ? p.drop_scale : 1.f;
    store_rows<T, HD>(DV + spatial_offset<NA>(p, p.dv_s, rw.ig[0], g), DV + spatial_offset<NA>(p, p.dv_s, rw.ig[1], g),
                      rw.ok[0], rw.ok[1], dv, keep_scale, keep_scale, p.dim_v, tq);
  }
  if (stage_rpb) drpb_fixed_flush(p, hkv, reinterpret_cast<const int*>(drpb_smem), smem_len);
#endif
}

}  }  // namespace nattn::tc
