// Hopper (sm_90a) square dK/dV pass, persistent form (build switch
// NATTN_SM90_SQUARE_DKV_PERSIST, off by default; an experiment, not yet GPU-run).
//
// Why: the whole-box pass (backward_dkv_squares.cuh) spends about a fifth of its stall
// samples before its first slab, waiting for its keys, values, first slab and their LSE /
// delta (ncu on mid-2d, sixty-fifth session), and each CTA ends with its dK / dV stores.
// Here a CTA walks a run of consecutive key boxes of the flattened [batch, KV head, key box]
// order, and its slabs form one sequence over the run:
//  - keys and values: once every warp holds its K / V fragments (a count), the last of them
//    copies the next box's keys and values into the tiles (they are free: dK / dV go from
//    the registers to global memory), so they land during the current box's slabs;
//  - slabs: one stage, as the whole-box pass's default; at the end of a box's last slab
//    (the slab barrier) thread 0 copies the next box's first slab, and every thread fetches
//    and stashes its LSE / delta, as between two slabs of one box;
//  - each box starts at a CTA barrier, where thread 0 has written the next box's entry;
//  - with an RPB the tables are staged and, with the fixed point, flushed once a box (a
//    CTA's int32 sums hold one box's terms: common/drpb_fixed.cuh).
// Calls with a query range keep the whole-box pass (a box may then have no slab).
#pragma once
#include "nattn/sm90/backward_dkv_squares.cuh"
#include "nattn/sm90/square_runs.cuh"

namespace nattn { namespace sm90 {

#ifndef NATTN_SM90_SQUARE_DKV_PERSIST
#define NATTN_SM90_SQUARE_DKV_PERSIST 0
#endif
static_assert(!NATTN_SM90_SQUARE_DKV_PERSIST || NATTN_SM90_SQUARE_DKV_STAGES == 1,
              "the persistent square dK/dV pass runs one slab stage");
constexpr bool kSquareDkvPersist = NATTN_SM90_SQUARE_DKV_PERSIST;

// The run's next key box (square_run_box over the whole-box pass's key boxes; its h is the KV
// head).
template <bool kWide>
NATTN_HD void square_dkv_run_box(const Params& p, int index, int end, SquareRunBox& out) {
  square_run_box<2, typename SquareDkvBox<kWide>::Keys, Box<1, 1, 1>, true>(p, index, end, out);
}

// The whole-box pass's shared memory, then the run's two entries and the count of the warps
// holding their K / V fragments; the RPB tables after them (launch-time sizes).
template <int HD>
struct SquareDkvRunSmem : SquareDkvSmem<HD> {
  using Base = SquareDkvSmem<HD>;
  static constexpr int kRun = (Base::kBytes + 15) / 16 * 16;  // SquareRunBox[2]
  static constexpr int kCount = kRun + 2 * int(sizeof(SquareRunBox));
  static constexpr int kBytes = kCount + 16;
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
};

template <typename T, int HD, bool kRpb, bool kWide>
__global__ void __launch_bounds__(128, SquareDkvMinBlocks<HD, kRpb>::value)
    backward_dkv_squares_run_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                                    const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                                    const __grid_constant__ CUtensorMap map_v, int slab_cols) {
#if NATTN_SM90_ENABLED
  using Sq = SquareDkvBox<kWide>;
  using KB = typename Sq::Keys;
  using S = SquareDkvRunSmem<HD>;
  using Ck = typename S::Keys;
  using Cq = typename S::Lines;
  using M = tc::Mma<T>;
  static_assert(S::kStages == 1, "one slab stage");
  constexpr int kRowBytes = Cq::kRowBytes;
  constexpr int kGradOut = S::kDo - S::kQ;  // dO's tile from Q's
  unsigned char* smem = aligned_smem();
  uint64_t* keys_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* full = keys_full + 1;  // the slab landed
  SquareRunBox* run = reinterpret_cast<SquareRunBox*>(smem + S::kRun);
  int* count = reinterpret_cast<int*>(smem + S::kCount);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;
  const int W = slab_cols, rows = square_dkv_slab_rows(W, S::kTokens), slab_queries = rows * W;
  float2* lse_buf = reinterpret_cast<float2*>(smem + S::kLse);
  // The run: key boxes [begin, end) of the flattened order.
  const int begin = int(blockIdx.x) * p.cta_run;
  const int end = nattn_min(begin + p.cta_run, p.cta_tiles * p.heads_kv * p.batch);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(keys_full, 1);
    mbar_init(full, 1);
    *count = 0;
    square_dkv_run_box<kWide>(p, begin, end, run[0]);
    fence_barrier_init();
  }
  // The pads past a slab (finite values: a line's second step reads into them, masked) and
  // their LSE / delta slots: the slab width is the problem's, so once a run.
  {
    const int pad_bytes = (S::kTileRows - slab_queries) * kRowBytes;
    unsigned char* stage = smem + S::kQ + slab_queries * kRowBytes;
    for (int i = threadIdx.x; i < pad_bytes / 16; i += 128) {
      reinterpret_cast<uint4*>(stage)[i] = make_uint4(0u, 0u, 0u, 0u);
      reinterpret_cast<uint4*>(stage + kGradOut)[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    for (int i = slab_queries + threadIdx.x; i < S::kTileRows; i += 128)
      lse_buf[i] = lse_buf[S::kTileRows + i] = make_float2(INFINITY, 0.f);
  }
  __syncthreads();
  if (run[0].index < 0) {  // uniform
    griddep_wait();  // (NATTN_SM90_PDL: no CTA of this pass ends before the dQ pass)
    return;
  }
  // A box's slabs per query head (its union's rows, `rows` a slab); the walk runs them for
  // each query head of the KV head.
  auto per_head_of = [&](const SquareRunBox& bx) { return (bx.tile.nk[0] + rows - 1) / rows; };
  // Slab f of box bx (query head bx.h groups + f / per_head, union rows from rows x (f %
  // per_head)) into the stage: one copy per tensor (the maps' box: a slab).
  auto load_slab = [&](const SquareRunBox& bx, int per_head, int f) {
    int c[5];
    const int h = bx.h * p.groups + f / per_head;
    const int origin[3] = {bx.tile.lo[0] + rows * (f % per_head), bx.tile.lo[1], 0};
    mbar_expect_tx(full, 2 * slab_queries * kRowBytes);
    const HeadCoords hq = head_coords<HD>(p, kRowsQ, p.heads, h, bx.b);
    box_coords<2>(p, bx.tile, origin, hq.channel, hq.outer, c);
    tma_load<4>(smem + S::kQ, &map_q, full, c);
    const HeadCoords hd = head_coords<HD>(p, kRowsGradOut, p.heads, h, bx.b);
    box_coords<2>(p, bx.tile, origin, hd.channel, hd.outer, c);
    tma_load<4>(smem + S::kQ + kGradOut, &map_do, full, c);
  };
  auto load_keys = [&](const SquareRunBox& bx) {
    int c[5];
    mbar_expect_tx(keys_full, 2 * Ck::kBytes);
    load_box_blocks<2, KB, Ck>(p, bx.tile, bx.tile.q0, head_coords<HD>(p, kRowsK, p.heads_kv, bx.h, bx.b),
                               smem + S::kK, &map_k, keys_full, c);
    load_box_blocks<2, KB, Ck>(p, bx.tile, bx.tile.q0, head_coords<HD>(p, kRowsV, p.heads_kv, bx.h, bx.b),
                               smem + S::kV, &map_v, keys_full, c);
  };
  if (threadIdx.x == 0) {
    load_keys(run[0]);
    load_slab(run[0], per_head_of(run[0]), 0);
  }
  // (NATTN_SM90_PDL: the copies above read only the call's inputs; delta and the largest |dS|
  // come from the dQ pass)
  griddep_wait();
  // A slab's queries' LSE (log2 units; +inf past the grid) and delta in slab order, a slab
  // ahead (the whole-box pass's fetch / stash, with the box as an argument); stash into half
  // `half` of the staging buffer.
  constexpr int kPer = (S::kTokens + 127) / 128;
  float2 staged[kPer];
  const int w_recip = kWide ? square_dkv_row_recip(W) : 0;
  auto fetch = [&](const SquareRunBox& bx, int per_head, int f) {
    const float* lse_b = p.lse + int64_t(bx.b) * p.tokens * p.heads;
    const float* delta_b = p.delta + int64_t(bx.b) * p.tokens * p.heads;
    const int h = bx.h * p.groups + f / per_head, y0 = bx.tile.lo[0] + rows * (f % per_head);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int q = threadIdx.x + 128 * i;
      const int qy = Sq::slot_row(q, W, w_recip);
      const int y = y0 + qy, x = bx.tile.lo[1] + q - qy * W;
      const bool ok = q < slab_queries && y < bx.tile.len[0] && x < bx.tile.len[1];
      const int idx = strip_query_token<2>(p, bx.tile, 0, y, x) * p.heads + h;
      staged[i] = ok ? make_float2(__ldg(lse_b + idx), __ldg(delta_b + idx)) : make_float2(INFINITY, 0.f);
    }
  };
  auto stash = [&](int half) {
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (threadIdx.x + 128 * i < slab_queries)
        lse_buf[half * S::kTileRows + threadIdx.x + 128 * i] = make_float2(lse_log2(staged[i].x), staged[i].y);
  };
  fetch(run[0], per_head_of(run[0]), 0);
  stash(0);  // (visible after the first box's barrier)

  constexpr bool has_rpb = kRpb;
  const int table = int(p.rpb_head_size);
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + kStripDrpbLead;
  int* dbias = reinterpret_cast<int*>(bias + p.groups * table) + kStripDrpbLead;
  const bool fixed = has_rpb && p.drpb_fixed != nullptr;
  const StripDrpbLayout dl = strip_drpb_layout(p.groups * table);
  const float scale_log2 = p.scale_log2;

  int g = 0;  // slabs walked in the run (the stage barrier's phase, the staging half)
  for (int k = 0;; ++k) {
    const int phase = k & 1;
    // The next box's entry (box k - 1's slot: every thread holds that box in registers).
    if (threadIdx.x == 0 && run[phase].index >= 0)
      square_dkv_run_box<kWide>(p, run[phase].index + 1, end, run[phase ^ 1]);
    __syncthreads();  // (the entry, the box's first slab's LSE / delta stash)
    if (run[phase].index < 0) break;  // uniform
    const CtaTile tile = run[phase].tile;
    const int hk = run[phase].h, b = run[phase].b;
    const SquareRunBox& next = run[phase ^ 1];
    const int per_head = per_head_of(run[phase]);
    const int slabs = per_head * p.groups;  // (> 0 without a query range)
    if constexpr (has_rpb) stage_dkv_rpb(p, hk, table, bias, dbias, dl);

    SquareKeyLane ks;
    square_key_lane<kWide>(p, tile, warp, lane, ks);
    const int cshift = ks.steps - 1;  // a line's steps: 1 << cshift
    int q_off[HD / 32], qt_off[HD / 16];
    phase_fragment_offsets<Cq, HD>(ks.sx & 7, lane, 0, q_off, qt_off);
    uint32_t ka[HD / 16][4], va[HD / 16][4];
    mbar_wait(keys_full, phase);
    const int key_row = Sq::key_row(warp, lane % 16);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      tc::ldmatrix_x4(ka[kk], smem + S::kK + Ck::offset(key_row, 16 * kk + 8 * (lane / 16)));
      tc::ldmatrix_x4(va[kk], smem + S::kV + Ck::offset(key_row, 16 * kk + 8 * (lane / 16)));
    }
    // Every warp holds its K / V fragments: the next box's keys and values replace them.
    square_run_count(count, lane, [&] {
      if (next.index >= 0) {
        fence_proxy_async_smem();  // (the tiles' reads before the copy engine's writes)
        load_keys(next);
      }
    });
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

    float* drpb_kv = has_rpb ? p.drpb + int64_t(hk) * p.groups * table : nullptr;  // (without the fixed point)
    const uint32_t drpb_copy = smem_addr(dbias + (dl.copies == 4 ? t4 : 0) * dl.stride);
    const uint32_t drpb_sink = smem_addr(drpb_sink_at(dbias + dl.copies * dl.stride));
    struct Step {
      int y, c, q0;
    };
    using StepTiles = float[2][4];
    // (backward_dkv_squares.cuh's products and finish_step, on the one stage)
    auto products = [&](const Step& st, StepTiles& sc, StepTiles& dp) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const unsigned char* at = smem + S::kQ + (st.q0 + 8 * j) * kRowBytes;
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
    auto finish_step = [&](auto rpb_tag, auto fixed_tag, StepTiles& sc, StepTiles& dp, const float2* ld0,
                           const Step& st, int h, float fscale) {
      constexpr bool kWithRpb = decltype(rpb_tag)::value, kFixed = decltype(fixed_tag)::value;
      bool row_in[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) row_in[r] = st.y >= ks.y_lo[r] && st.y <= ks.y_hi[r];
      const unsigned cols = ks.cols >> (4 * st.c);
      float lse2[2][2], dlt[2][2];
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
      auto at_table = [&](int j, int e) { return line_bias[e / 2] - 8 * j - e % 2; };
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
      if constexpr (kFixed) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            drpb_add_or_sink(in_window(j, e), drpb_copy, drpb_sink, at_table(j, e), terms[j][e]);
      }
      const unsigned char* at_t = smem + S::kQ + st.q0 * kRowBytes;
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
    // The box's slabs; after each, the next slab of the run (this box's, or the next box's
    // first) is fetched, stashed and copied once every warp is done with the stage.
    auto walk = [&](auto rpb_tag, auto fixed_tag) {
      float fscale = 0.f;
      for (int f = 0; f < slabs; ++f, ++g) {
        const int h = hk * p.groups + f / per_head, within = f % per_head;
        const int y0 = tile.lo[0] + rows * within;
        if (decltype(fixed_tag)::value && within == 0) fscale = drpb_fixed_scale(p.drpb_max[h], kStripDrpbBits);
        const bool more = f + 1 < slabs, then = more || next.index >= 0;
        if (more)
          fetch(run[phase], per_head, f + 1);
        else if (then)
          fetch(next, per_head_of(next), 0);
        mbar_wait(full, g & 1);
        const int y_first = nattn_max(ks.w_lo, y0), y_last = nattn_min(ks.w_hi, y0 + rows - 1);
        const float2* ld0 = lse_buf + (g & 1) * S::kTileRows;
        const int n = y_last >= y_first ? (y_last - y_first + 1) << cshift : 0;
        auto step_at = [&](int i) {
          const int y = y_first + (i >> cshift), c = i & cshift;
          return Step{y, c, (y - y0) * W + ks.sx + 16 * c};
        };
        for (int i = 0; i < n; ++i) {
          StepTiles sc, dp;
          const Step st = step_at(i);
          products(st, sc, dp);
          finish_step(rpb_tag, fixed_tag, sc, dp, ld0, st, h, fscale);
        }
        if (then) {  // the stage and the other staging half are free
          stash((g + 1) & 1);
          named_sync(2, 128);
          if (threadIdx.x == 0) {
            fence_proxy_async_smem();  // (the tiles' reads before the copy engine's writes)
            if (more)
              load_slab(run[phase], per_head, f + 1);
            else
              load_slab(next, per_head_of(next), 0);
          }
        }
      }
    };
    if constexpr (!has_rpb) {
      walk(std::false_type{}, std::false_type{});
    } else if (fixed) {
      walk(std::true_type{}, std::true_type{});
      flush_dkv_drpb(p, hk, table, dbias, dl);  // (a box's sums: int32 holds one box's terms)
    } else {
      walk(std::true_type{}, std::false_type{});
    }

    // dK times the scale and dV from the registers to their rows.
    T* dk_head = head_base<T>(p.dk, p.dk_s, b, hk);
    T* dv_head = head_base<T>(p.dv, p.dv_s, b, hk);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = Sq::key_row(warp, g4) + Sq::kLaneRowStep * r;
      int64_t off_k, off_v;
      const bool ok = box_row_offset<2, KB>(p, tile, tile.q0, row, p.dk_s, off_k);
      box_row_offset<2, KB>(p, tile, tile.q0, row, p.dv_s, off_v);
      store_square_row<T, HD>(dk_head + off_k, ok, dk, r, p.scale, t4);
      store_square_row<T, HD>(dv_head + off_v, ok, dv, r, 1.f, t4);
    }
  }
#endif
}

}  }  // namespace nattn::sm90
