// Hopper (sm_90a) NA backward for the square pair, dK/dV pass: the strip dK/dV pass
// (backward_dkv_strips.cuh) walked by 4 x 4 key squares (square_geometry.cuh, "the square
// dK/dV pass").
//
// A CTA owns an 8 x 8 key box (or 4 x 16: kWide, square_dkv_wide; square_geometry.cuh) of
// one (batch, KV head, dilation group). Thread 0 loads its keys and values once and the union
// of their inverse neighbourhoods in slabs of whole union rows (slab_cols queries wide: the
// problem's widest union rounded up to 8, 16 to 32, or to 40 with the 4 x 16 box), for each
// query head of the KV head in turn; every thread stages a slab's LSE and delta in
// shared memory (loaded a slab ahead). Each of the four warps owns a 4 x 4 key square (its
// 16 keys: the m16 rows) and walks its lines of each slab in one or two k16 steps of 16 query
// columns from its keys' first inverse column:
//   S^T = K Q^T, dP^T = V dO^T     (mma.sync m16n8k16, two n8 tiles; K and V fragments
//                                   held in registers from the start)
//   P^T = exp2(S^T scale log2e + bias - LSE log2e) where the query's window holds the key
//   dS^T = P^T (dP^T - delta)
//   dV += P^T dO, dK += dS^T Q      (dO and Q read transposed)
// A 13 x 13 window's square walks 16 x 16 queries for its 16 keys away from the borders,
// where the strip pass's pair of key rows would walk 14 lines of two 16-column passes. With an
// RPB, dRPB sums in fixed point in shared memory (the strip pass's tables; a masked score's
// zero term goes to the sink: common/drpb_fixed.cuh), then one add per entry into the int64
// table; without the workspace, float atomics into dRPB. At the end dK times the scale and
// dV go through the key and value tiles and out in bulk tensor stores or per lane.
// Deterministic: every key's gradients are one CTA's.
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/sm90/backward_dkv_common.cuh"
#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/forward_squares.cuh"
#include "nattn/sm90/strip_geometry.cuh"
#include "nattn/tc/mma.cuh"

namespace nattn { namespace sm90 {

// Shared memory of the square dK/dV pass: the key box's K and V tiles, kStages slabs' Q and dO
// tiles (with their pads), the barriers, two slabs' (LSE log2, delta) per query; after them
// (launch-time sizes) the strip pass's RPB and fixed-point dRPB tables (StripDrpbLayout).
template <int HD>
struct SquareDkvSmem {
  static constexpr int kStages = NATTN_SM90_SQUARE_DKV_STAGES;  // slabs in flight
  static constexpr int kTokens = kSquareDkvSlabTokensAt<HD>;  // a slab's queries
  static constexpr int kTileRows = kTokens + kSquareDkvPad;         // the Q and dO tiles' rows
  using Keys = TileSmem<HD, kWgRows>;
  using Lines = TileSmem<HD, kTileRows>;
  static_assert(Lines::kBlocks == 1, "head dims up to 64: a slab copy per tensor");
  static_assert(Lines::kBytes % 1024 == 0, "each stage's tiles start at the swizzle's 1024-byte period");
  static constexpr int kK = 0;
  static constexpr int kV = kK + Keys::kBytes;
  static constexpr int kQ = kV + Keys::kBytes;  // stage s's Q tile at kQ + s kStageBytes
  static constexpr int kDo = kQ + Lines::kBytes;
  static constexpr int kStageBytes = 2 * Lines::kBytes;
  static constexpr int kBars = kQ + kStages * kStageBytes;  // keys_full, full[kStages]
  static constexpr int kLse = kBars + 64;
  static constexpr int kBytes = kLse + 2 * kTileRows * 8;
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  // (head dim 64: 72 KB with slabs of 192 queries, 89 KB with 256)
};

// CTAs an SM the registers must allow (kRpb: the instance with an RPB, which at head dim 64
// would spill at three; it runs there only when named, NATTN_SM90_SQUARE_DKV=own).
template <int HD, bool kRpb>
struct SquareDkvMinBlocks {
  static constexpr int value = HD <= 32 ? 4 : NATTN_SM90_SQUARE_DKV_THREE_CTAS && !kRpb ? 3 : 2;
};

// Build switch for A/B runs: 1 runs a warp's steps in pairs at head dim 64, both steps' S^T
// and dP^T before the first one's softmax (backward_dkv_strips.cuh's
// NATTN_SM90_STRIP_DKV_PIPELINE): 226 registers, two CTAs an SM, the default only with
// NATTN_SM90_SQUARE_DKV_THREE_CTAS=0.
#ifndef NATTN_SM90_SQUARE_DKV_PIPELINE
#define NATTN_SM90_SQUARE_DKV_PIPELINE (!NATTN_SM90_SQUARE_DKV_THREE_CTAS)
#endif

// kRpb: the instance for calls with an RPB (p.rpb set), else the one without (ptxas
// allocates registers for a whole kernel: backward_dkv_strips.cuh); kWide: the 4 x 16 key box
// (SquareDkvBox).
template <typename T, int HD, bool kRpb, bool kWide>
__global__ void __launch_bounds__(128, SquareDkvMinBlocks<HD, kRpb>::value)
    backward_dkv_squares_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                                const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                                const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_dk,
                                const __grid_constant__ CUtensorMap map_dv, int slab_cols) {
#if NATTN_SM90_ENABLED
  using Sq = SquareDkvBox<kWide>;
  using KB = typename Sq::Keys;
  using S = SquareDkvSmem<HD>;
  using Ck = typename S::Keys;
  using Cq = typename S::Lines;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = Cq::kRowBytes;
  constexpr int kGradOut = S::kDo - S::kQ;  // dO's tile from Q's
  unsigned char* smem = aligned_smem();
  uint64_t* keys_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* full = keys_full + 1;  // full[s]: stage s's slab landed

  CtaTile tile;  // q0: the first key; lo / nk: the union's first query and extent per axis
  if (!cta_tile_inverse<2, KB, Box<1, 1, 1>>(p, blockIdx.x, tile)) {  // uniform
    griddep_wait();  // (NATTN_SM90_PDL: no CTA of this pass ends before the dQ pass)
    return;
  }
  const int hk = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;
  const int W = slab_cols, rows = square_dkv_slab_rows(W, S::kTokens), slab_queries = rows * W;
  // Slabs per query head (the union's rows, `rows` a slab); the walk runs them for each query
  // head of the KV head.
  const int per_head = (tile.nk[0] + rows - 1) / rows;
  const int slabs = tile.tiles > 0 ? per_head * p.groups : 0;
  float2* lse_buf = reinterpret_cast<float2*>(smem + S::kLse);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(keys_full, 1);
#pragma unroll
    for (int s = 0; s < S::kStages; ++s) mbar_init(full + s, 1);
    fence_barrier_init();
  }
  // The pads past a slab (a line's second step reads into them, masked: they must hold
  // finite values, since 0 x NaN is NaN in the products) and their LSE / delta slots.
  {
    const int pad_bytes = (S::kTileRows - slab_queries) * kRowBytes;
    for (int s = 0; s < S::kStages; ++s)
      for (int i = threadIdx.x; i < pad_bytes / 16; i += 128) {
        unsigned char* stage = smem + S::kQ + s * S::kStageBytes + slab_queries * kRowBytes;
        reinterpret_cast<uint4*>(stage)[i] = make_uint4(0u, 0u, 0u, 0u);
        reinterpret_cast<uint4*>(stage + kGradOut)[i] = make_uint4(0u, 0u, 0u, 0u);
      }
    for (int i = slab_queries + threadIdx.x; i < S::kTileRows; i += 128)
      lse_buf[i] = lse_buf[S::kTileRows + i] = make_float2(INFINITY, 0.f);
  }
  __syncthreads();
  // Slab f (query head hk groups + f / per_head, union rows from rows x (f % per_head)) into
  // stage f % kStages: one copy per tensor (the maps' box: a slab).
  auto load_slab = [&](int f) {
    int c[5];
    const int h = hk * p.groups + f / per_head;
    const int origin[3] = {tile.lo[0] + rows * (f % per_head), tile.lo[1], 0};
    uint64_t* bar = full + f % S::kStages;
    unsigned char* stage = smem + S::kQ + f % S::kStages * S::kStageBytes;
    mbar_expect_tx(bar, 2 * slab_queries * kRowBytes);
    const HeadCoords hq = head_coords<HD>(p, kRowsQ, p.heads, h, b);
    box_coords<2>(p, tile, origin, hq.channel, hq.outer, c);
    tma_load<4>(stage, &map_q, bar, c);
    const HeadCoords hd = head_coords<HD>(p, kRowsGradOut, p.heads, h, b);
    box_coords<2>(p, tile, origin, hd.channel, hd.outer, c);
    tma_load<4>(stage + kGradOut, &map_do, bar, c);
  };
  if (threadIdx.x == 0) {  // the keys and values, then the first slab
    int c[5];
    mbar_expect_tx(keys_full, 2 * Ck::kBytes);
    load_box_blocks<2, KB, Ck>(p, tile, tile.q0, head_coords<HD>(p, kRowsK, p.heads_kv, hk, b), smem + S::kK, &map_k,
                               keys_full, c);
    load_box_blocks<2, KB, Ck>(p, tile, tile.q0, head_coords<HD>(p, kRowsV, p.heads_kv, hk, b), smem + S::kV, &map_v,
                               keys_full, c);
    if (slabs > 0) load_slab(0);
    if (S::kStages > 1 && slabs > 1) load_slab(1);
  }
  // A slab's queries' LSE (log2 units; +inf past the grid: no probability) and delta, in
  // slab order (union rows from the slab's first, slab_cols a row): each thread loads kPer of them into registers (fetch, a slab ahead) and
  // stores them (stash) into the slab's half of the staging buffer before the barrier that
  // ends the slab before (backward_dkv_strips.cuh). Rows of the batch entry ([N, H]: an
  // offset fits 32 bits, prepare_backward_squares checks).
  constexpr int kPer = (S::kTokens + 127) / 128;
  const float* lse_b = p.lse + int64_t(b) * p.tokens * p.heads;
  const float* delta_b = p.delta + int64_t(b) * p.tokens * p.heads;
  float2 staged[kPer];
  const int w_recip = kWide ? square_dkv_row_recip(W) : 0;
  auto fetch = [&](int f) {
    const int h = hk * p.groups + f / per_head, y0 = tile.lo[0] + rows * (f % per_head);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int q = threadIdx.x + 128 * i;
      const int qy = Sq::slot_row(q, W, w_recip);
      const int y = y0 + qy, x = tile.lo[1] + q - qy * W;
      const bool ok = q < slab_queries && y < tile.len[0] && x < tile.len[1];
      const int idx = strip_query_token<2>(p, tile, 0, y, x) * p.heads + h;
      staged[i] = ok ? make_float2(__ldg(lse_b + idx), __ldg(delta_b + idx)) : make_float2(INFINITY, 0.f);
    }
  };
  auto stash = [&](int f) {
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (threadIdx.x + 128 * i < slab_queries)
        lse_buf[(f % 2) * S::kTileRows + threadIdx.x + 128 * i] = make_float2(lse_log2(staged[i].x), staged[i].y);
  };
  // (NATTN_SM90_PDL: the copies above read only the call's inputs; delta and the largest |dS|
  // come from the dQ pass)
  griddep_wait();
  if (slabs > 0) fetch(0);

  // The query heads' RPB tables times log2(e), and their fixed-point dRPB tables zeroed (the
  // strip pass's layout).
  constexpr bool has_rpb = kRpb;
  const int table = int(p.rpb_head_size);
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + kStripDrpbLead;
  int* dbias = reinterpret_cast<int*>(bias + p.groups * table) + kStripDrpbLead;
  const bool fixed = has_rpb && p.drpb_fixed != nullptr;
  const StripDrpbLayout dl = strip_drpb_layout(p.groups * table);
  if constexpr (has_rpb) stage_dkv_rpb(p, hk, table, bias, dbias, dl);

  SquareKeyLane ks;
  square_key_lane<kWide>(p, tile, warp, lane, ks);
  const int cshift = ks.steps - 1;  // a line's steps: 1 << cshift
  // ldmatrix offsets at the warp's swizzle phase: Q and dO as the B operand of S^T / dP^T,
  // and transposed as that of dK / dV.
  int q_off[HD / 32], qt_off[HD / 16];
  phase_fragment_offsets<Cq, HD>(ks.sx & 7, lane, 0, q_off, qt_off);
  uint32_t ka[HD / 16][4], va[HD / 16][4];
  mbar_wait(keys_full, 0);
  const int key_row = Sq::key_row(warp, lane % 16);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    tc::ldmatrix_x4(ka[kk], smem + S::kK + Ck::offset(key_row, 16 * kk + 8 * (lane / 16)));
    tc::ldmatrix_x4(va[kk], smem + S::kV + Ck::offset(key_row, 16 * kk + 8 * (lane / 16)));
  }
  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  const float scale_log2 = p.scale_log2;
  float* drpb_kv = has_rpb ? p.drpb + int64_t(hk) * p.groups * table : nullptr;  // (without the fixed point)
  const uint32_t drpb_copy = smem_addr(dbias + (dl.copies == 4 ? t4 : 0) * dl.stride);
  const uint32_t drpb_sink = smem_addr(drpb_sink_at(dbias + dl.copies * dl.stride));
  // A step: line y, its step c (columns sx + 16 c ..), q0 its first query's slab slot
  // ((y - the slab's first row) slab_cols + sx + 16 c).
  struct Step {
    int y, c, q0;
  };
  using StepTiles = float[2][4];
  // (stage: the slab's stage's byte offset from stage 0's tiles)
  auto products = [&](int stage, const Step& st, StepTiles& sc, StepTiles& dp) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const unsigned char* at = smem + S::kQ + stage + (st.q0 + 8 * j) * kRowBytes;
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = dp[j][e] = 0.f;
#pragma unroll
      for (int x = 0; x < HD / 32; ++x) {
        uint32_t qb[4], db[4];
        tc::ldmatrix_x4(qb, at + q_off[x]);
        M::run(sc[j], ka[2 * x], qb);
        M::run(sc[j], ka[2 * x + 1], qb + 2);
        tc::ldmatrix_x4(db, at + kGradOut + q_off[x]);
        M::run(dp[j], va[2 * x], db);
        M::run(dp[j], va[2 * x + 1], db + 2);
      }
    }
  };
  // The rest of a step for head h: P^T and dS^T, dRPB, then dV and dK. kWithRpb: with the RPB;
  // kFixed: dRPB in the fixed-point table (else float atomics into dRPB).
  auto finish_step = [&](auto rpb_tag, auto fixed_tag, int stage, StepTiles& sc, StepTiles& dp,
                         const float2* ld0, const Step& st, int h, float fscale) {
    constexpr bool kWithRpb = decltype(rpb_tag)::value, kFixed = decltype(fixed_tag)::value;
    bool row_in[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) row_in[r] = st.y >= ks.y_lo[r] && st.y <= ks.y_hi[r];
    const unsigned cols = ks.cols >> (4 * st.c);
    float lse2[2][2], dlt[2][2];  // the lane's four query columns (tile j's 2 (lane % 4) + e)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float2 v = ld0[st.q0 + 8 * j + 2 * t4 + e];
        lse2[j][e] = v.x;
        dlt[j][e] = v.y;
      }
    int line_bias[2] = {0, 0};
    if constexpr (kWithRpb) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        line_bias[r] = (h - hk * p.groups) * table + square_key_bias(ks, st.y, st.c, 0, 2 * r, lane);
    }
    auto in_window = [&](int j, int e) { return row_in[e / 2] && ((cols >> (2 * j + e % 2)) & 1u); };
    auto at_table = [&](int j, int e) { return line_bias[e / 2] - 8 * j - e % 2; };  // (outside the table if masked)
    int terms[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool in = in_window(j, e);
        float x = sc[j][e] * scale_log2;
        if constexpr (kWithRpb) x += bias[in ? at_table(j, e) : 0];
        const float pr = HD <= 32 ? kept(in, fast_exp2(x - lse2[j][e % 2])) : in ? fast_exp2(x - lse2[j][e % 2]) : 0.f;
        const float ds = pr * (dp[j][e] - dlt[j][e % 2]);
        if constexpr (kFixed) terms[j][e] = __float2int_rn(ds * fscale);
        else if constexpr (kWithRpb) {
          if (in) atomicAdd(drpb_kv + at_table(j, e), ds);
        }
        sc[j][e] = pr;
        dp[j][e] = ds;
      }
    if constexpr (kFixed) {  // (after all the step's bias reads: backward_dkv_strips.cuh)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) drpb_add_or_sink(in_window(j, e), drpb_copy, drpb_sink, at_table(j, e), terms[j][e]);
    }
    // dV += P^T dO, dK += dS^T Q: the step's 16 queries are the k16 step (written out here
    // and in the strip pass: as a shared function it changed ptxas's allocation of both
    // passes, the measured strip kernels' SASS included)
    const unsigned char* at_t = smem + S::kQ + stage + st.q0 * kRowBytes;
    const uint32_t pa[4] = {M::pack(sc[0][0], sc[0][1]), M::pack(sc[0][2], sc[0][3]), M::pack(sc[1][0], sc[1][1]),
                            M::pack(sc[1][2], sc[1][3])};
    const uint32_t da[4] = {M::pack(dp[0][0], dp[0][1]), M::pack(dp[0][2], dp[0][3]), M::pack(dp[1][0], dp[1][1]),
                            M::pack(dp[1][2], dp[1][3])};
#pragma unroll
    for (int x = 0; x < HD / 16; ++x) {
      uint32_t ob[4], qb[4];
      tc::ldmatrix_x4_trans(ob, at_t + kGradOut + qt_off[x]);
      M::run(dv[2 * x], pa, ob);
      M::run(dv[2 * x + 1], pa, ob + 2);
      tc::ldmatrix_x4_trans(qb, at_t + qt_off[x]);
      M::run(dk[2 * x], da, qb);
      M::run(dk[2 * x + 1], da, qb + 2);
    }
  };
  // The slabs in step: each warp walks its lines of each slab; the slab's tiles are refilled
  // once every warp is done with them (named barrier 2).
  auto walk = [&](auto rpb_tag, auto fixed_tag) {
    float fscale = 0.f;
    if (slabs > 0) {  // (fetch(0) went out before the keys' wait)
      stash(0);
      __syncthreads();
    }
    for (int f = 0; f < slabs; ++f) {
      const int h = hk * p.groups + f / per_head, within = f % per_head;
      const int y0 = tile.lo[0] + rows * within;
      if (decltype(fixed_tag)::value && within == 0) fscale = drpb_fixed_scale(p.drpb_max[h], kStripDrpbBits);
      if (f + 1 < slabs) fetch(f + 1);  // (waited for at the stash, after this slab's lines)
      mbar_wait(full + f % S::kStages, (f / S::kStages) & 1);
      const int stage = f % S::kStages * S::kStageBytes;
      const int y_first = nattn_max(ks.w_lo, y0), y_last = nattn_min(ks.w_hi, y0 + rows - 1);
      const float2* ld0 = lse_buf + (f % 2) * S::kTileRows;
      // the warp's steps of the slab: its lines from y_first, 1 << cshift steps each
      const int n = y_last >= y_first ? (y_last - y_first + 1) << cshift : 0;
      auto step_at = [&](int i) {
        const int y = y_first + (i >> cshift), c = i & cshift;
        return Step{y, c, (y - y0) * W + ks.sx + 16 * c};
      };
      int i = 0;
      if (NATTN_SM90_SQUARE_DKV_PIPELINE && HD >= 64) {  // steps in pairs: both steps' products first
        for (; i + 1 < n; i += 2) {
          StepTiles sa, da, sb, db;
          const Step s0 = step_at(i), s1 = step_at(i + 1);
          products(stage, s0, sa, da);
          products(stage, s1, sb, db);
          finish_step(rpb_tag, fixed_tag, stage, sa, da, ld0, s0, h, fscale);
          finish_step(rpb_tag, fixed_tag, stage, sb, db, ld0, s1, h, fscale);
        }
      }
      for (; i < n; ++i) {
        StepTiles sc, dp;
        const Step st = step_at(i);
        products(stage, st, sc, dp);
        finish_step(rpb_tag, fixed_tag, stage, sc, dp, ld0, st, h, fscale);
      }
      if (f + 1 < slabs) {  // slab f's stage and staging half are free, slab f + 1's LSE visible
        stash(f + 1);
        named_sync(2, 128);
        if (threadIdx.x == 0 && (S::kStages == 1 || f + S::kStages < slabs)) {
          fence_proxy_async_smem();  // (the tiles' reads before the copy engine's writes)
          load_slab(f + S::kStages);
        }
      }
    }
  };
  if constexpr (!has_rpb) {
    walk(std::false_type{}, std::false_type{});
  } else if (fixed) {
    walk(std::true_type{}, std::true_type{});
    flush_dkv_drpb(p, hk, table, dbias, dl);  // (each entry's sum over the copies)
  } else {  // (no fixed-point workspace)
    walk(std::true_type{}, std::false_type{});
  }

  // dK times the scale and dV into the warp's own rows of the key and value tiles (only this
  // warp read them), then the box's rows out (dK's and dV's maps, or per lane).
  const float scale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  const int row0 = Sq::key_row(warp, g4);
  __syncwarp();
  stage_output<T, HD, Ck, Sq::kLaneRowStep>(smem + S::kK, &dk[0][0], scale, row0, t4);
  stage_output<T, HD, Ck, Sq::kLaneRowStep>(smem + S::kV, &dv[0][0], one, row0, t4);
  store_output_rows<T, 2, HD, KB, Ck, true>(p, tile, &map_dk, smem + S::kK, 0, KB::extent(0), hk, b,
                                            RowsOut{p.dk, p.dk_s, p.heads_kv, kRowsGradK});
  store_output_rows<T, 2, HD, KB, Ck, true>(p, tile, &map_dv, smem + S::kV, 0, KB::extent(0), hk, b,
                                            RowsOut{p.dv, p.dv_s, p.heads_kv, kRowsGradV});
#endif
}

}  }  // namespace nattn::sm90
