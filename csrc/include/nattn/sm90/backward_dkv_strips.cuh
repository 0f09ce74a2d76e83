// Hopper (sm_90a) NA backward for the strip pairs, dK/dV pass: the strips of the forward
// turned around (strip_geometry.cuh, "the strip dK/dV pass").
//
// A CTA owns a 64-key box of one (batch, KV head, dilation group): 8 x 8 keys (in 3-D of one
// frame: StripDkvKeyBox). Thread 0 loads its keys and values once and the union of their
// inverse neighbourhoods in slabs (the union's rows; in 3-D a frame of them at a time, the
// warps in step), 16 query columns wide (a second column pass where the union is wider), for
// each query head of the KV head in turn; every thread stages a slab's LSE and delta in
// shared memory (loaded a slab ahead). Each of the four warps owns two key rows of 8 columns
// (its 16 keys: the m16 rows) and walks the query lines (16 columns, one k16 step) of its
// keys' inverse rows:
//   S^T = K Q^T, dP^T = V dO^T     (mma.sync m16n8k16, two n8 tiles; K and V fragments
//                                   held in registers from the start)
//   P^T = exp2(S^T scale log2e + bias - LSE log2e) where the query's window holds the key
//   dS^T = P^T (dP^T - delta)
//   dV += P^T dO, dK += dS^T Q      (P^T / dS^T from the score fragments; dO and Q read
//                                   transposed, as the forward reads V)
// Where a warp's keys' inverse columns are all in the first 8 of the first pass (DiNAT's
// whole-group layers), a k16 step pairs two lines' first 8 columns instead (narrow steps).
// With an RPB, dRPB sums in fixed point in shared memory (one integer atomic per score,
// without a branch, into four table copies where they fit; a masked score's zero term goes
// to its own index, between guards: StripDrpbLayout; each head's
// scale from the dQ pass's largest |dS|: common/drpb_fixed.cuh), then one add per entry into
// the int64 table; without the workspace, float atomics into dRPB. At the end dK
// times the scale and dV go through the key and value tiles and out in bulk tensor stores
// (their own maps) or per lane. Deterministic: every key's gradients are one CTA's.
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/sm90/backward_dkv_common.cuh"
#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/forward_strips.cuh"
#include "nattn/tc/mma.cuh"

namespace nattn { namespace sm90 {

// Shared memory of the strip dK/dV pass: the key box's K and V tiles, then kStages slots of
// query lines (Q, then dO), the barriers; after them (launch-time sizes) each query head's
// RPB table times log2(e), then the fixed-point dRPB tables (StripDrpbLayout).
template <int NA, int HD>
struct StripDkvSmem {
  using Keys = TileSmem<HD, kWgRows>;
  static constexpr int kLineRows = kStripDkvRows;
  using Lines = TileSmem<HD, kLineRows * kStripCols>;
  // One slab (at head dim 64: 86 KB; two CTAs an SM)
  static constexpr int kStages = 1;
  static constexpr int kK = 0;
  static constexpr int kV = kK + Keys::kBytes;
  static constexpr int kSlots = kV + Keys::kBytes;  // slot s: Q at kSlots + s kSlot, dO Lines::kBytes on
  static constexpr int kSlot = 2 * Lines::kBytes;
  static constexpr int kBars = kSlots + kStages * kSlot;  // keys_full, full[kStages]
  static constexpr int kSlabQueries = kLineRows * kStripCols;
  static constexpr int kLse = kBars + 64;  // two slabs' (LSE log2, delta) per query, float2
  static constexpr int kBytes = kLse + 2 * kSlabQueries * 8;
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  // (3-D at head dim 32 three: at four, 128 registers, it spilled 20 bytes)
  static constexpr int kMinBlocks = HD <= 32 ? (NA == 3 ? 3 : 4) : 2;
};

// The slab box: 2-D the union's rows x 16 columns, 3-D one frame of them.
template <int NA>
using StripLineBox = typename std::conditional<NA == 3, Box<1, kStripDkvRows, kStripCols>,
                                               Box<kStripDkvRows, kStripCols, 1>>::type;

// Build switch for A/B runs: 1 (the default) walks a warp's lines in pairs at head dim 64,
// both lines' S^T and dP^T before the first line's softmax, so that the second line's
// products run in the tensor pipe during the first's (the pass is latency-bound at two warps
// a scheduler). H100, forward + backward, GPU ms, off / on: video-3d 0.862 / 0.835-0.838,
// 8x64x64 3x7x7 0.578 / 0.562, the 2-D rows equal (PERF.md forty-fifth session).
#ifndef NATTN_SM90_STRIP_DKV_PIPELINE
#define NATTN_SM90_STRIP_DKV_PIPELINE 1
#endif

// Fraction bits of the fixed-point dRPB: a block's keys meet a table entry of a query head
// through one query each (the entry is the relative position), kWgRows terms at most.
constexpr int kStripDrpbBits = fixed_bits(kWgRows);

// kRpb: the instance for calls with an RPB (p.rpb set), else the one without. They are two
// kernels because ptxas allocates registers for a whole kernel: with the fixed-point walk in
// the same kernel (3-D head dim 64: 242 registers), the no-RPB line-pair loop lost its overlap
// of the two lines' products (4 of 8 LDSM ahead of the HMMAs, 10 NOPs a pair against 2); on
// its own it takes 236 registers and the schedule of before the fixed-point walk's change.
template <typename T, int NA, int HD, class Tl, bool kRpb>
__global__ void __launch_bounds__(128, StripDkvSmem<NA, HD>::kMinBlocks)
    backward_dkv_strips_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                               const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                               const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_dk,
                               const __grid_constant__ CUtensorMap map_dv) {
#if NATTN_SM90_ENABLED
  using KB = StripDkvKeyBox<NA>;
  using S = StripDkvSmem<NA, HD>;
  using Ck = typename S::Keys;
  using Cq = typename S::Lines;
  using M = tc::Mma<T>;
  constexpr int R = NA - 2, C = NA - 1;  // the lines' row and column axes
  constexpr int kStages = S::kStages;
  constexpr int kRowBytes = Cq::kRowBytes;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* keys_full = bars;
  uint64_t* full = bars + 1;

  CtaTile tile;  // q0: the first key; lo / nk: the union's first query and extent per axis
  if (!cta_tile_inverse<NA, KB, Box<1, 1, 1>>(p, blockIdx.x, tile)) {  // uniform
    griddep_wait();  // (NATTN_SM90_PDL: no CTA of this pass ends before the dQ pass)
    return;
  }
  const int hk = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;
  // Slabs per query head: column passes x frames (2-D: one frame); the walk runs them for
  // each query head of the KV head.
  const int passes = tile.nk[C] > kStripCols ? 2 : 1;
  const int frames = NA == 3 ? tile.nk[0] : 1;
  const int per_head = passes * frames;
  const int slabs = tile.tiles > 0 ? per_head * p.groups : 0;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(keys_full, 1);
    for (int s = 0; s < kStages; ++s) mbar_init(full + s, 1);
    fence_barrier_init();
  }
  __syncthreads();
  // Slab f (query head hk groups + f / per_head; column pass, then frame) into slot f % kStages.
  auto load_slab = [&](int f) {
    int c[5];
    const int h = hk * p.groups + f / per_head, within = f % per_head;
    const int cp = within / frames, ft = within % frames;
    int origin[3] = {tile.lo[0], tile.lo[1], NA > 2 ? tile.lo[2] : 0};
    if (NA == 3) origin[0] += ft;
    origin[C] += kStripCols * cp;
    const int slot = f % kStages;
    unsigned char* dst = smem + S::kSlots + slot * S::kSlot;
    mbar_expect_tx(full + slot, 2 * Cq::kBytes);
    load_box_blocks<NA, StripLineBox<NA>, Cq>(p, tile, origin, head_coords<HD>(p, kRowsQ, p.heads, h, b), dst, &map_q,
                                              full + slot, c);
    load_box_blocks<NA, StripLineBox<NA>, Cq>(p, tile, origin, head_coords<HD>(p, kRowsGradOut, p.heads, h, b),
                                              dst + Cq::kBytes, &map_do, full + slot, c);
  };
  if (threadIdx.x == 0) {  // the keys and values, then the first slabs
    int c[5];
    mbar_expect_tx(keys_full, 2 * Ck::kBytes);
    load_box_blocks<NA, KB, Ck>(p, tile, tile.q0, head_coords<HD>(p, kRowsK, p.heads_kv, hk, b), smem + S::kK, &map_k,
                                keys_full, c);
    load_box_blocks<NA, KB, Ck>(p, tile, tile.q0, head_coords<HD>(p, kRowsV, p.heads_kv, hk, b), smem + S::kV, &map_v,
                                keys_full, c);
    for (int f = 0; f < kStages && f < slabs; ++f) load_slab(f);
  }
  // A slab's queries' LSE (log2 units; +inf past the grid: no probability) and delta, in
  // line order: each thread loads kPer of them into registers (fetch, a slab ahead) and
  // stores them (stash) into the slab's half of the staging buffer before the barrier that
  // ends the slab before. The LSE's conversion waits for the stash: where fetch did it, the
  // loads' latency stalled the warps before the slab's lines (4% of the pass's samples). The
  // rows of the batch entry ([N, H]: an offset fits 32 bits, prepare_backward_strips checks).
  // The first slab's loads go out before the RPB staging and the wait for the keys.
  constexpr int kQueries = S::kSlabQueries, kPer = (kQueries + 127) / 128;
  const float* lse_b = p.lse + int64_t(b) * p.tokens * p.heads;
  const float* delta_b = p.delta + int64_t(b) * p.tokens * p.heads;
  float2* lse_buf = reinterpret_cast<float2*>(smem + S::kLse);
  float2 staged[kPer];
  auto fetch = [&](int f) {
    const int h = hk * p.groups + f / per_head, within = f % per_head;
    const int cp = within / frames, t = tile.lo[0] + within % frames;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int q = threadIdx.x + 128 * i;
      const int y = tile.lo[R] + q / kStripCols, x = tile.lo[C] + kStripCols * cp + q % kStripCols;
      const bool ok = q < kQueries && y < tile.len[R] && x < tile.len[C];
      const int idx = strip_query_token<NA>(p, tile, t, y, x) * p.heads + h;
      staged[i] = ok ? make_float2(__ldg(lse_b + idx), __ldg(delta_b + idx)) : make_float2(INFINITY, 0.f);
    }
  };
  auto stash = [&](int f) {
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (threadIdx.x + 128 * i < kQueries)
        lse_buf[(f % 2) * kQueries + threadIdx.x + 128 * i] = make_float2(lse_log2(staged[i].x), staged[i].y);
  };
  // (NATTN_SM90_PDL: the copies above read only the call's inputs; delta and the largest |dS|
  // come from the dQ pass)
  griddep_wait();
  if (slabs > 0) fetch(0);

  // The query heads' RPB tables times log2(e), and their fixed-point dRPB tables zeroed.
  constexpr bool has_rpb = kRpb;  // (the launcher's choice: p.rpb != nullptr)
  const int table = int(p.rpb_head_size);
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + kStripDrpbLead;
  int* dbias = reinterpret_cast<int*>(bias + p.groups * table) + kStripDrpbLead;
  const bool fixed = has_rpb && p.drpb_fixed != nullptr;
  const StripDrpbLayout dl = strip_drpb_layout(p.groups * table);
  if constexpr (has_rpb) stage_dkv_rpb(p, hk, table, bias, dbias, dl);

  StripKeyLane key_strip;
  strip_key_lane<NA, KB>(p, tile, warp, lane, key_strip);

  // ldmatrix row addresses: the warp's keys and values as the A operand (held in registers),
  // the lines' Q and dO as the B operand of S^T / dP^T (n8 tiles: eight rows, 32 channels an
  // x4) and, transposed, of dK / dV (sixteen rows, 16 channels an x4).
  int q_lane[HD / 32], qt_lane[HD / 16];
#pragma unroll
  for (int x = 0; x < HD / 32; ++x) q_lane[x] = Cq::offset(lane % 8, 8 * (lane / 8) + 32 * x);
#pragma unroll
  for (int x = 0; x < HD / 16; ++x) qt_lane[x] = Cq::offset(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16) + 16 * x);
  uint32_t ka[HD / 16][4], va[HD / 16][4];
  mbar_wait(keys_full, 0);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    tc::ldmatrix_x4(ka[kk], smem + S::kK + Ck::offset(16 * warp + lane % 16, 16 * kk + 8 * (lane / 16)));
    tc::ldmatrix_x4(va[kk], smem + S::kV + Ck::offset(16 * warp + lane % 16, 16 * kk + 8 * (lane / 16)));
  }
  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  const float scale_log2 = p.scale_log2;

  float* drpb_kv = has_rpb ? p.drpb + int64_t(hk) * p.groups * table : nullptr;  // (without the fixed point)
  // The lane's copy of the fixed-point tables and the sink (StripDrpbLayout; the guard form
  // has none), as 32-bit shared-memory addresses.
  const uint32_t drpb_copy = smem_addr(dbias + (dl.copies == 4 ? t4 : 0) * dl.stride);
  const uint32_t drpb_sink = smem_addr(drpb_sink_at(dbias + dl.copies * dl.stride));
  // A k16 step: its two n8 tiles of 8 queries each. Wide: line y's 16 columns (tile j:
  // columns 8 j ..). Narrow: the first 8 columns of lines y (tile 0) and y + 1 (tile 1; l1
  // is its line in the slab: line y again, masked, past the warp's last line).
  struct Step {
    int y, l1;
  };
  // Slab rows (16 a line) of tile j's queries: its first row; of the transposed reads (the
  // step's 16 queries): the row their lanes' qt_lane rows start from (narrow: the lanes
  // that read rows 8-15 step back 8 rows into line l1; the swizzle repeats every 8 rows).
  auto tile_row = [&](auto narrow_tag, const Step& st, int j) {
    const int l0 = st.y - tile.lo[R];
    return decltype(narrow_tag)::value ? (j ? st.l1 : l0) * kStripCols : l0 * kStripCols + 8 * j;
  };
  auto trans_row = [&](auto narrow_tag, const Step& st) {
    const int l0 = st.y - tile.lo[R];
    return decltype(narrow_tag)::value && (lane / 8) % 2 ? st.l1 * kStripCols - 8 : l0 * kStripCols;
  };
  // A step's products S^T and dP^T (products), then the rest of it (finish_step), for frame
  // t, column pass cp, head h. kRpb: with the RPB; kFixed: dRPB in the fixed-point table
  // (else float atomics into dRPB); kNarrow: a narrow step.
  using LineTiles = float[2][4];
  auto products = [&](auto narrow_tag, const unsigned char* at0, const Step& st, LineTiles& sc, LineTiles& dp) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const unsigned char* at = at0 + tile_row(narrow_tag, st, j) * kRowBytes;
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = dp[j][e] = 0.f;
#pragma unroll
      for (int x = 0; x < HD / 32; ++x) {
        uint32_t qb[4], db[4];
        tc::ldmatrix_x4(qb, at + q_lane[x]);
        M::run(sc[j], ka[2 * x], qb);
        M::run(sc[j], ka[2 * x + 1], qb + 2);
        tc::ldmatrix_x4(db, at + Cq::kBytes + q_lane[x]);
        M::run(dp[j], va[2 * x], db);
        M::run(dp[j], va[2 * x + 1], db + 2);
      }
    }
  };
  auto finish_step = [&](auto rpb_tag, auto fixed_tag, auto narrow_tag, LineTiles& sc, LineTiles& dp,
                         const unsigned char* at0, const float2* ld0, const Step& st, int h, int t, int cp, unsigned cols, float fscale) {
    constexpr bool kRpb = decltype(rpb_tag)::value, kFixed = decltype(fixed_tag)::value;
    constexpr bool kNarrow = decltype(narrow_tag)::value;
    const int y = st.y;
    // tile j's line: y + j narrow (past the keys' rows: no row holds it), else y
    bool row_in[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int yj = kNarrow ? y + j : y;
        row_in[j][r] = yj >= key_strip.y_lo[r] && yj <= key_strip.y_hi[r];
      }
    // the lane's four query columns (tile j's columns 2 (lane % 4) + e)
    float lse2[2][2], dlt[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float2 v = ld0[tile_row(narrow_tag, st, j) + 2 * t4 + e];
        lse2[j][e] = v.x;
        dlt[j][e] = v.y;
      }
    // P^T into sc, dS^T into dp (rows: the lane's keys e / 2; columns: queries (j, e % 2)).
    // With an RPB, score (j, e)'s index is line y's for its key (the head's table, query
    // column 2 (lane % 4) of tile 0: strip_key_bias) minus e % 2 and, for tile 1, 8 columns
    // (wide) or one row (narrow: line y + 1).
    int line_bias[2] = {0, 0};
    if constexpr (kRpb) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        line_bias[r] = (h - hk * p.groups) * table + strip_key_bias(key_strip, tile, NA, t, y, cp, 0, 2 * r, lane);
    }
    auto in_window = [&](int j, int e) {
      return row_in[j][e / 2] && ((cols >> (kNarrow ? e % 2 : 2 * j + e % 2)) & 1u);
    };
    auto at_table = [&](int j, int e) {  // (outside the table if masked)
      return line_bias[e / 2] - (kNarrow ? j * key_strip.row_mult : 8 * j) - e % 2;
    };
    int terms[2][4];  // the fixed-point dRPB terms, added after the step's bias reads
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool in = in_window(j, e);
        float x = sc[j][e] * scale_log2;
        // (the guard form reads a masked score's bias at its own index: inside the guards)
        const int at_bias = kStripDkvGuarded || in ? at_table(j, e) : 0;
        if constexpr (kRpb) x += bias[at_bias];
        // (computed, then selected at head dim 32: 2% faster on dinat-s1; at 64 the
        // predicated form was 4-6% faster, PERF.md forty-seventh session)
        const float pr = HD <= 32 ? kept(in, fast_exp2(x - lse2[j][e % 2])) : in ? fast_exp2(x - lse2[j][e % 2]) : 0.f;
        const float ds = pr * (dp[j][e] - dlt[j][e % 2]);
        if constexpr (kFixed) terms[j][e] = kStripDkvGuarded && !in ? 0 : __float2int_rn(ds * fscale);
        else if constexpr (kRpb) {
          if (in) atomicAdd(drpb_kv + at_bias, ds);
        }
        sc[j][e] = pr;
        dp[j][e] = ds;
      }
    // dRPB: every score's add, without a branch (common/drpb_fixed.cuh), after all the
    // step's bias reads (a read after an atomic waits for the atomic's operands, which
    // chained each score's bias read to the whole computation of the score before).
    if constexpr (kFixed) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // (the guard form: a masked score's zero term at its own index, the sink's bank)
          if constexpr (kStripDkvGuarded) red_add_shared(drpb_copy + 4u * uint32_t(at_table(j, e)), terms[j][e]);
          else drpb_add_or_sink(in_window(j, e), drpb_copy, drpb_sink, at_table(j, e), terms[j][e]);
        }
    }
    // dV += P^T dO, dK += dS^T Q: the step's 16 queries are the k16 step
    const unsigned char* at_t = at0 + trans_row(narrow_tag, st) * kRowBytes;
    const uint32_t pa[4] = {M::pack(sc[0][0], sc[0][1]), M::pack(sc[0][2], sc[0][3]), M::pack(sc[1][0], sc[1][1]),
                            M::pack(sc[1][2], sc[1][3])};
    const uint32_t da[4] = {M::pack(dp[0][0], dp[0][1]), M::pack(dp[0][2], dp[0][3]), M::pack(dp[1][0], dp[1][1]),
                            M::pack(dp[1][2], dp[1][3])};
#pragma unroll
    for (int x = 0; x < HD / 16; ++x) {
      uint32_t ob[4], qb[4];
      tc::ldmatrix_x4_trans(ob, at_t + Cq::kBytes + qt_lane[x]);
      M::run(dv[2 * x], pa, ob);
      M::run(dv[2 * x + 1], pa, ob + 2);
      tc::ldmatrix_x4_trans(qb, at_t + qt_lane[x]);
      M::run(dk[2 * x], da, qb);
      M::run(dk[2 * x + 1], da, qb + 2);
    }
  };
  // A warp walks narrow where each of its lanes does (strip_key_lane_narrow): two lines a
  // step halve the steps on DiNAT's whole-group layers, whose query columns are the first 8
  // of one pass.
  const bool narrow = NATTN_SM90_STRIP_NARROW && __all_sync(0xffffffffu, strip_key_lane_narrow(key_strip));
  // The slabs in step: each warp walks its lines of the slabs of its frames; a slot is
  // refilled once every warp is done with it (named barrier 2).
  // (kNarrow: the warp's steps; an instance each, so that neither loop's registers and
  // predicates are the other's: one loop nest with both cost the wide loop 5% more instructions)
  auto walk = [&](auto rpb_tag, auto fixed_tag, auto narrow_tag) {
    constexpr bool kNarrow = decltype(narrow_tag)::value;
    float fscale = 0.f;
    if (slabs > 0) {  // (fetch(0) went out before the keys' wait)
      stash(0);
      __syncthreads();
    }
    for (int f = 0; f < slabs; ++f) {
      const int h = hk * p.groups + f / per_head, within = f % per_head;
      const int cp = within / frames, t = tile.lo[0] + within % frames;
      // the lane's column bits of pass cp (narrow: 0), shifted once a slab: shifted in each
      // step by 4 cp + 2 j + e % 2, they cost 3-D D64's single-line loop 7 instructions a line
      const unsigned cols = kNarrow ? key_strip.cols : key_strip.cols >> (4 * cp);
      if (decltype(fixed_tag)::value && within == 0) fscale = drpb_fixed_scale(p.drpb_max[h], kStripDrpbBits);
      if (f + 1 < slabs) fetch(f + 1);  // (waited for at the stash, after this slab's lines)
      mbar_wait(full + f % kStages, (f / kStages) & 1);
      if ((NA == 2 || (t >= key_strip.t_lo && t <= key_strip.t_hi)) && !(kNarrow && cp > 0)) {
        const unsigned char* at0 = smem + S::kSlots + (f % kStages) * S::kSlot;
        const float2* ld0 = lse_buf + (f % 2) * kQueries;
        const int y_end = nattn_min(key_strip.w_hi, tile.lo[R] + S::kLineRows - 1), tt = NA == 3 ? t : 0;
        int y = nattn_max(key_strip.w_lo, tile.lo[R]);
        if constexpr (kNarrow) {  // (a narrow warp's columns are all in the first pass)
          for (; y <= y_end; y += 2) {
            LineTiles sc, dp;
            const Step st{y, nattn_min(y + 1, y_end) - tile.lo[R]};
            products(narrow_tag, at0, st, sc, dp);
            finish_step(rpb_tag, fixed_tag, narrow_tag, sc, dp, at0, ld0, st, h, tt, cp, cols, fscale);
          }
        } else {
          if (NATTN_SM90_STRIP_DKV_PIPELINE && HD >= 64) {  // lines in pairs: both lines' products first
            for (; y + 1 <= y_end; y += 2) {
              LineTiles sa, da, sb, db;
              const Step s0{y, 0}, s1{y + 1, 0};
              products(narrow_tag, at0, s0, sa, da);
              products(narrow_tag, at0, s1, sb, db);
              finish_step(rpb_tag, fixed_tag, narrow_tag, sa, da, at0, ld0, s0, h, tt, cp, cols, fscale);
              finish_step(rpb_tag, fixed_tag, narrow_tag, sb, db, at0, ld0, s1, h, tt, cp, cols, fscale);
            }
          }
          for (; y <= y_end; ++y) {
            LineTiles sc, dp;
            const Step st{y, 0};
            products(narrow_tag, at0, st, sc, dp);
            finish_step(rpb_tag, fixed_tag, narrow_tag, sc, dp, at0, ld0, st, h, tt, cp, cols, fscale);
          }
        }
      }
      if (f + 1 < slabs) {  // slab f's slot and staging half are free, slab f + 1's LSE visible
        stash(f + 1);
        named_sync(2, 128);
        if (threadIdx.x == 0 && f + kStages < slabs) load_slab(f + kStages);
      }
    }
  };
  if constexpr (!has_rpb) {
    instanced(narrow, [&](auto narrow_tag) { walk(std::false_type{}, std::false_type{}, narrow_tag); });
  } else if (fixed) {
    instanced(narrow, [&](auto narrow_tag) { walk(std::true_type{}, std::true_type{}, narrow_tag); });
    flush_dkv_drpb(p, hk, table, dbias, dl);  // (each entry's sum over the copies)
  } else {  // (no fixed-point workspace)
    instanced(narrow, [&](auto narrow_tag) { walk(std::true_type{}, std::false_type{}, narrow_tag); });
  }

  // dK times the scale and dV into the warp's own rows of the key and value tiles (only this
  // warp read them), then the box's rows out (forward.cuh's epilogue, dK's and dV's maps).
  const float scale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  __syncwarp();
  stage_output<T, HD, Ck>(smem + S::kK, &dk[0][0], scale, 16 * warp + g4, t4);
  stage_output<T, HD, Ck>(smem + S::kV, &dv[0][0], one, 16 * warp + g4, t4);
  store_output_rows<T, NA, HD, KB, Ck, true>(p, tile, &map_dk, smem + S::kK, 0, KB::extent(0), hk, b,
                                             RowsOut{p.dk, p.dk_s, p.heads_kv, kRowsGradK});
  store_output_rows<T, NA, HD, KB, Ck, true>(p, tile, &map_dv, smem + S::kV, 0, KB::extent(0), hk, b,
                                             RowsOut{p.dv, p.dv_s, p.heads_kv, kRowsGradV});
#endif
}

}  }  // namespace nattn::sm90
