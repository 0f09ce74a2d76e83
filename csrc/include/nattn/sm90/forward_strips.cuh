// Hopper (sm_90a) forward for small 2-D and 3-D windows: the strip CTA.
//
// wgmma's 64-row operand makes every query of a 64-query box walk the union of the whole
// box's windows: an 8 x 8 box with a 7 x 7 window walks 14 x 16 keys a query, 4.6x its 49.
// Here a CTA still owns a 64-query box of one (batch, head, dilation group) (2-D: 8 x 8; 3-D:
// 2 x 4 x 8) and its thread 0 still loads the box and its window union with the copy engine
// (the forward's tensor maps: forward.cuh), but each of its four warps computes with
// mma.sync (m16n8k16) on its own strip of two query rows x 8 columns, which needs only 8 of
// the union's rows: 8 x 16 keys a query in 2-D (2.6x a 7 x 7 window), 8 x 16 per frame of
// the window in 3-D (5 x 8 x 16 for 5 x 7 x 7: 2.6x; the 4 x 4 x 8 wgmma CTAs walk 5.2x).
// 2-D loads the whole union (one 14 x 16 key box) once; 3-D loads it a frame at a time (10 x
// 16 keys) into a two-slot ring, each warp computing on the frames of its window; the last
// warp done with a slot refills it (strip_walk_slabs).
//
// A warp's 16 queries are the m16 rows (box rows 16 w .. 16 w + 15); it walks its key rows in
// chunks of kStripChunkRows (64 keys, eight n8 tiles: strip_geometry.cuh has the geometry), K
// and V fragments read with ldmatrix from the swizzled tiles the copy engine wrote (a tile
// row = a key; eight consecutive rows per n8 tile, so the swizzle of a lane's row does not
// depend on the chunk: one base address a lane per operand). Per chunk: S = Q K^T, the window
// mask (a bit test per score), the RPB from the head's table in shared memory, online
// softmax, O += P V with P from the S fragments. Epilogue as forward.cuh's 64-query CTAs:
// O / l through the query tile, one bulk tensor store (or per-lane stores).
//
// Windows up to 7 x 9 (2-D: the union's 14 = 8 + 7 - 1 rows, 16 = 8 + 9 - 1 columns) or
// 7 x 7 x 9 (3-D), stride 1 (strided windows' unions can be wider): prepare_forward declines
// the others (strip_declines).
#pragma once
#include <cuda.h>
#include <math.h>

#include <type_traits>

#include "nattn/common/registry.h"
#include "nattn/common/softmax.cuh"
#include "nattn/common/window.cuh"
#include "nattn/sm90/forward.cuh"
#include "nattn/sm90/strip_geometry.cuh"
#include "nattn/tc/mma.cuh"

// Build switch for A/B runs (benchmarks/build_variants.sh): the 3-D strip CTAs' ring slots
// (frames of keys and values in flight). Two let a frame's copy overlap the frame before; one
// leaves room for a third CTA per SM at head dim 64 (56 KB of tiles against 88).
#ifndef NATTN_SM90_STRIP_STAGES_3D
#define NATTN_SM90_STRIP_STAGES_3D 2
#endif

// Build switch for A/B runs: 1 (default) has warps whose windows lie in the first 8 of the
// key box's 16 columns take the narrow walk (strip_geometry.cuh); 0 walks every warp wide.
#ifndef NATTN_SM90_STRIP_NARROW
#define NATTN_SM90_STRIP_NARROW 1
#endif

namespace nattn { namespace sm90 {

template <class Tl, int HD>
struct StripCta {
  static constexpr int kNa = Tl::Q::extent(2) > 1 ? 3 : 2;
  static constexpr int kThreads = 128;  // four warps, one strip of 16 queries each
  // Ring slots: 2-D loads its union once; 3-D a frame a slot.
  static constexpr int kStages = kNa == 3 ? NATTN_SM90_STRIP_STAGES_3D : 1;
  // One slot's keys: 2-D the whole key box, 3-D one frame of it.
  static constexpr int kSlabKeys = kNa == 3 ? Tl::K::extent(1) * Tl::K::extent(2) : Tl::K::kSize;
  // Registers (126 a thread at head dim 32) and shared memory (at head dim 64: 64 KB of tiles
  // in 2-D, 88 KB in 3-D with two slots) bound the CTAs per SM.
  static constexpr int kMinBlocks = HD <= 32 ? 4 : kNa == 3 && kStages > 1 ? 2 : 3;
  static_assert(kNa == 2 ? Tl::Q::extent(0) == 8 && Tl::Q::extent(1) == 8
                          : Tl::Q::extent(0) == 2 && Tl::Q::extent(1) == 4 && Tl::Q::extent(2) == 8,
                "strip pairs: 8 x 8 (2-D) or 2 x 4 x 8 (3-D) query boxes (four strips of 2 x 8)");
  static_assert(Tl::K::extent(kNa - 1) == kStripCols && (kNa == 3 ? Tl::K::extent(1) == kStripSlabRows
                                                                   : Tl::K::extent(0) >= 6 + kStripWalkRows),
                "strip pairs: key boxes of 16 columns, holding the strips' rows");
  // The RPB table sits in shared memory between guards of kRpbGuard floats: a walk's keys
  // outside a row's window (masked) index up to 3 table rows + 23 entries past its end, or a
  // row + 7 before its start (rows of at most 17 entries; csrc/tests/sm90_strips_check.cu).
  static constexpr int kRpbGuard = 128;
};

// kRowTiles: the query box's tiles before the key slots (the forward: Q; the dQ pass,
// backward_dq_strips.cuh: Q, then dO at kDo).
template <class Tl, int HD, int kRowTiles = 1>
struct StripSmem {
  using Cta = StripCta<Tl, HD>;
  using Rows = TileSmem<HD, Tl::Q::kSize>;
  using Cols = TileSmem<HD, Cta::kSlabKeys>;
  static constexpr int kQ = 0;
  static constexpr int kDo = kQ + Rows::kBytes;
  static constexpr int kK = kQ + kRowTiles * Rows::kBytes;  // slot s: K at kK + s kSlot, V kSlot / 2 on
  static constexpr int kSlot = 2 * Cols::kBytes;
  static constexpr int kBars = kK + Cta::kStages * kSlot;  // rows_full, full[kStages]
  static constexpr int kDone = kBars + 8 * (1 + Cta::kStages);  // per slot: warps done with it (strip_walk_slabs)
  static constexpr int kBytes = kDone + 4 * Cta::kStages;
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  static constexpr int kRpbFloats = kSmallRpbStageFloats + 2 * Cta::kRpbGuard;
};

// One slot's keys: the 2-D key box, or one frame of the 3-D one.
template <class Tl, int NA>
using StripSlab = typename std::conditional<NA == 3, Box<1, Tl::K::extent(1), Tl::K::extent(2)>, typename Tl::K>::type;

// The slabs of a strip CTA's walk: in 3-D the union's frames, from its box's first frame's
// window to its last's; in 2-D one.
template <int NA, class QB>
__device__ __forceinline__ int strip_slabs(const Params& p, const CtaTile& tile) {
  if constexpr (NA == 3) {
    const int last = nattn_min(tile.q0[0] + QB::extent(0) - 1, tile.len[0] - 1);
    const AxisRange w = query_window(last, tile.len[0], p.kernel[0], 1, p.causal[0] != 0);
    return w.start + w.count - tile.lo[0];
  }
  return 1;
}

// Slab f (frame tile.lo[0] + f of the union in 3-D) into ring slot f % kStages at `slots`
// (slot s: keys at s slot_bytes, values C::kBytes on): one bulk tensor copy per channel block
// each, completing on full[slot] (thread 0).
template <int NA, int HD, class Tl, class C>
__device__ __forceinline__ void load_strip_slab(const Params& p, const CtaTile& tile, int f, int h_kv, int b,
                                                unsigned char* slots, uint64_t* full, const CUtensorMap* map_k,
                                                const CUtensorMap* map_v) {
  constexpr int kStages = StripCta<Tl, HD>::kStages;
  int c[5];
  const int slot = f % kStages;
  int origin[3] = {tile.lo[0], tile.lo[1], NA > 2 ? tile.lo[2] : 0};
  origin[0] += NA == 3 ? f : 0;
  mbar_expect_tx(full + slot, 2 * C::kBytes);
  unsigned char* dst = slots + slot * 2 * C::kBytes;
  load_box_blocks<NA, StripSlab<Tl, NA>, C>(p, tile, origin, head_coords<HD>(p, kRowsK, p.heads_kv, h_kv, b), dst,
                                            map_k, full + slot, c);
  load_box_blocks<NA, StripSlab<Tl, NA>, C>(p, tile, origin, head_coords<HD>(p, kRowsV, p.heads_kv, h_kv, b),
                                            dst + C::kBytes, map_v, full + slot, c);
}

// The head's RPB table times log2(e) into shared memory at `bias` (between the guards),
// behind the copies; every thread calls it (it synchronises when there is a table).
template <class Cta>
__device__ __forceinline__ void stage_strip_rpb(const Params& p, int h, float* bias) {
  if (p.rpb == nullptr) return;
  const float* src = p.rpb + int64_t(h) * p.rpb_head_size;
  for (int i = threadIdx.x; i < int(p.rpb_head_size); i += Cta::kThreads) bias[i] = __ldg(src + i) * kLog2e;
  __syncthreads();
}

// Zeroes the walk's counts (thread 0, before the CTA's first barrier).
template <class Cta>
__device__ __forceinline__ void strip_walk_init(int* done) {
  for (int s = 0; s < Cta::kStages; ++s) done[s] = 0;
}

// The walk over the slabs: each warp runs body(slot, fi) on the slabs of its window (fi: the
// strip's frame index, 0 in 2-D) and skips the others; the last warp done with a slot refills
// it (refill(f), from its lane 0), counted in done[slot] (it grows by the warps each use, so
// it needs no reset). The warps are not in step: in 3-D the box's two frames need 5 of the
// union's 6 frames each, and a pair that skips a slab goes on to the next while the other
// computes on it (with a CTA barrier a slab the pairs idled a slab in six: 8.6% of video-3d's
// dQ pass's stall samples, PERF.md forty-fourth session).
template <class Cta, class Body, class Refill>
__device__ __forceinline__ void strip_walk_slabs(int slabs, const StripLane& lane_strip, uint64_t* full, int* done,
                                                 Body&& body, Refill&& refill) {
  constexpr int kStages = Cta::kStages, kWarps = Cta::kThreads / 32;
  for (int f = 0; f < slabs; ++f) {
    mbar_wait(full + f % kStages, (f / kStages) & 1);
    const int fi = f - lane_strip.ft;
    if (fi >= 0 && fi < lane_strip.frames) body(f % kStages, fi);
    if (f + kStages < slabs) {
      __syncwarp();  // the warp's reads of the slot are done
      if (threadIdx.x % 32 == 0) {
        __threadfence_block();  // ... before its count
        if (atomicAdd(done + f % kStages, 1) == kWarps * (f / kStages + 1) - 1) {
          __threadfence_block();  // every warp's count before the copy
          refill(f + kStages);
        }
      }
      __syncwarp();
    }
  }
}

// Runs f(std::true_type{}) where `cond` holds, else f(std::false_type{}): an instance each,
// chosen by a branch uniform per warp, not per score.
template <class F>
__device__ __forceinline__ void instanced(bool cond, F&& f) {
  if (cond) f(std::true_type{});
  else f(std::false_type{});
}

// Runs walk(rpb_tag, step_tag) for the call's RPB (std::true_type / std::false_type) and the
// warp's walk (step 2: narrow where every lane's windows allow, strip_lane_narrow; else 1):
// four instances.
template <class Walk>
__device__ __forceinline__ void strip_walk_instances(bool has_rpb, const StripLane& lane_strip, Walk&& walk) {
  using Wide = std::integral_constant<int, 1>;
  using Narrow = std::integral_constant<int, 2>;
  const bool narrow = NATTN_SM90_STRIP_NARROW && __all_sync(0xffffffffu, strip_lane_narrow(lane_strip));
  instanced(has_rpb, [&](auto rpb_tag) {
    if (narrow) walk(rpb_tag, Narrow{});
    else walk(rpb_tag, Wide{});
  });
}

// The softmax of a walk chunk's scores sc (eight n8 tiles; the strips' walks and the square
// CTAs', forward_squares.cuh): the scale unless it folds into the exponent (fold, mul: the
// kernel's), the mask words w and, with kRpb, the bias from the head's table at bias_at plus
// the score's offset (tile j numbered kStep j), then the online softmax of the lane's two
// rows: O rescaled unless `first`; sc holds P after it.
template <bool kRpb, int kStep, int HD>
__device__ __forceinline__ void strip_chunk_softmax(float (&sc)[2 * kStripChunkRows][4], const uint32_t (&w)[2],
                                                    const int (&bias_at)[2], const float* bias, int row_mult,
                                                    float scale_log2, bool fold, float mul, float (&m)[2],
                                                    float (&l)[2], float (&o)[HD / 8][4], bool first) {
  if (!kRpb && !fold) {
#pragma unroll
    for (int j = 0; j < 2 * kStripChunkRows; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] *= scale_log2;
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 2 * kStripChunkRows; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      float x = sc[j][e];
      if constexpr (kRpb)  // (the guards keep a masked key's index inside shared memory)
        x = fmaf(x, scale_log2, bias[bias_at[r] + strip_bias_offset(row_mult, kStep * j, e)]);
      x = strip_kept(w[r], kStep * j, e) ? x : -INFINITY;
      sc[j][e] = x;
      mx[r] = fmaxf(mx[r], x);
    }
  float m_use[2], alpha[2];
#if NATTN_SM90_LAZY_RESCALE
  if (lazy_max_step(m, l, mx, mul, m_use, alpha) && !first) {  // (forward.cuh)
#else
  online_max_step(m, l, mx, mul, m_use, alpha);
  if (!first) {
#endif
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e / 2];
  }
#pragma unroll
  for (int j = 0; j < 2 * kStripChunkRows; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[j][e] = fast_exp2(fmaf(sc[j][e], mul, -m_use[e / 2]));
      l[e / 2] += sc[j][e];
    }
}

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(StripCta<Tl, HD>::kThreads, StripCta<Tl, HD>::kMinBlocks)
    forward_strips_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                          const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                          const __grid_constant__ CUtensorMap map_o) {
#if NATTN_SM90_ENABLED
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  using Cta = StripCta<Tl, HD>;
  static_assert(Cta::kNa == NA, "a strip pair's NA dim");
  using S = StripSmem<Tl, HD>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  constexpr int kStages = Cta::kStages;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* q_full = bars;
  uint64_t* full = bars + 1;
  int* done = reinterpret_cast<int*>(smem + S::kDone);

  CtaTile tile;
  if (!cta_tile<NA, QB, KB>(p, blockIdx.x, tile)) return;  // uniform
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = kv_head(p, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;
  const int slabs = strip_slabs<NA, QB>(p, tile);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) mbar_init(full + s, 1);
    strip_walk_init<Cta>(done);
    fence_barrier_init();
  }
  __syncthreads();
  auto load_slab = [&](int f) {
    load_strip_slab<NA, HD, Tl, C>(p, tile, f, h_kv, b, smem + S::kK, full, &map_k, &map_v);
  };
  if (threadIdx.x == 0) {  // the query box, then the first slabs
    int c[5];
    mbar_expect_tx(q_full, R::kBytes);
    load_box_blocks<NA, QB, R>(p, tile, tile.q0, head_coords<HD>(p, kRowsQ, p.heads, h, b), smem + S::kQ, &map_q,
                               q_full, c);
    for (int f = 0; f < kStages && f < slabs; ++f) load_slab(f);
  }
  // The head's RPB table times log2(e), between guards (behind the copies).
  const bool has_rpb = p.rpb != nullptr;
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + Cta::kRpbGuard;
  stage_strip_rpb<Cta>(p, h, bias);

  // The lane's rows, their windows and mask words, the strip's key rows and frames
  // (strip_geometry.cuh).
  StripLane lane_strip;
  strip_lane<NA, QB>(p, tile, warp, lane, lane_strip);
  const int chunks = lane_strip.chunks, row_mult = lane_strip.row_mult;

  // ldmatrix row addresses: K (n8 tiles: eight tile rows, 32 channels an x4), V (transposed:
  // sixteen rows, 16 channels an x4), Q (the warp's sixteen rows). The swizzle of a row
  // depends only on its place within 8 rows, so the walk adds whole-row offsets.
  const int strip_at = S::kK + strip_tile_row(lane_strip.sy, 0, 0) * kRowBytes;
  int k_lane[HD / 32], v_lane[HD / 16];
#pragma unroll
  for (int x = 0; x < HD / 32; ++x) k_lane[x] = C::offset(lane % 8, 8 * (lane / 8) + 32 * x);
#pragma unroll
  for (int x = 0; x < HD / 16; ++x)
    v_lane[x] = C::kBytes + C::offset(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16) + 16 * x);
  // A narrow walk's P V step reads its second eight keys 16 box rows on (8 more than v_lane).
  const int v_pair_shift = ((lane / 8) % 2) * 8 * kRowBytes;

  uint32_t qa[HD / 16][4];
  mbar_wait(q_full, 0);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    tc::ldmatrix_x4(qa[kk], smem + S::kQ + R::offset(16 * warp + lane % 16, 16 * kk + 8 * (lane / 16)));

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // Without RPB (and with a positive scale) the scores stay raw: the max is taken on them and
  // the scale folds into the exponent (as forward.cuh).
  const bool fold = !has_rpb && p.scale_log2 > 0.f;
  const float mul = fold ? p.scale_log2 : 1.f;
  // Chunk ch of the strip's walk over the slot at `slot_at` (the strip's first row): its
  // scores S = Q K^T, then (consume) the mask, the RPB (frame part `frame_bias` of its index),
  // online softmax and O += P V; `first`: the walk's first chunk (no O to rescale). kStep 1:
  // the wide walk (score tile j of the chunk is strip_tile_row's tile j); 2: the narrow walk
  // (strip_geometry.cuh: one chunk whose tile j is the wide numbering's 2 j, key row j).
  using Scores = float[2 * kStripChunkRows][4];
  auto scores = [&](auto step_tag, const unsigned char* slot_at, int ch, Scores& sc) {
    constexpr int kStep = decltype(step_tag)::value;
#pragma unroll
    for (int j = 0; j < 2 * kStripChunkRows; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
      const unsigned char* at = slot_at + strip_tile_row(0, ch, kStep * j) * kRowBytes;
#pragma unroll
      for (int x = 0; x < HD / 32; ++x) {
        uint32_t kb[4];
        tc::ldmatrix_x4(kb, at + k_lane[x]);
        M::run(sc[j], qa[2 * x], kb);
        M::run(sc[j], qa[2 * x + 1], kb + 2);
      }
    }
  };
  auto consume = [&](auto rpb_tag, auto step_tag, Scores& sc, const unsigned char* slot_at, int ch, int frame_bias,
                     bool first) {
    constexpr bool kRpb = decltype(rpb_tag)::value;
    constexpr int kStep = decltype(step_tag)::value;
    const uint32_t w[2] = {strip_chunk_word(lane_strip.word[0], ch), strip_chunk_word(lane_strip.word[1], ch)};
    const int bias_at[2] = {lane_strip.bias_at[0] + frame_bias + strip_chunk_bias(row_mult, ch),
                            lane_strip.bias_at[1] + frame_bias + strip_chunk_bias(row_mult, ch)};
    strip_chunk_softmax<kRpb, kStep, HD>(sc, w, bias_at, bias, row_mult, p.scale_log2, fold, mul, m, l, o, first);
#pragma unroll
    for (int i = 0; i < kStripChunkRows; ++i) {  // tiles 2 i and 2 i + 1: a k16 step of P V
      const uint32_t pa[4] = {M::pack(sc[2 * i][0], sc[2 * i][1]), M::pack(sc[2 * i][2], sc[2 * i][3]),
                              M::pack(sc[2 * i + 1][0], sc[2 * i + 1][1]),
                              M::pack(sc[2 * i + 1][2], sc[2 * i + 1][3])};
      // (narrow: the second tile's keys are the next key row's, 16 box rows on)
      const unsigned char* at = slot_at + strip_tile_row(0, ch, kStep * 2 * i) * kRowBytes + (kStep - 1) * v_pair_shift;
#pragma unroll
      for (int x = 0; x < HD / 16; ++x) {
        uint32_t vb[4];
        tc::ldmatrix_x4_trans(vb, at + v_lane[x]);
        M::run(o[2 * x], pa, vb);
        M::run(o[2 * x + 1], pa, vb + 2);
      }
    }
  };
  // The walk over the slabs: each warp computes on the frames of its window; a slot is
  // refilled once every warp is done with it (strip_walk_instances: its four instances).
  auto walk = [&](auto rpb_tag, auto step_tag) {
    constexpr int kStep = decltype(step_tag)::value;
    const int steps = kStep == 2 ? 1 : chunks;
    strip_walk_slabs<Cta>(
        slabs, lane_strip, full, done,
        [&](int slot, int fi) {
          const unsigned char* at = smem + strip_at + slot * S::kSlot;
          const int frame_bias = fi * lane_strip.frame_mult;
          for (int ch = 0; ch < steps; ++ch) {
            Scores sc;
            scores(step_tag, at, ch, sc);
            consume(rpb_tag, step_tag, sc, at, ch, frame_bias, fi == 0 && ch == 0);
          }
        },
        load_slab);
  };
  strip_walk_instances(has_rpb, lane_strip, walk);

  // O / l into the warp's own rows of the query tile (only this warp read them), the LSE
  // from the lanes holding column 0, then the box's rows out (forward.cuh's epilogue).
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    inv[r] = inv_row_sum(l[r]);
  }
  unsigned char* stage = smem + S::kQ;
  __syncwarp();  // every lane's Q fragments are read
  stage_output<T, HD, R>(stage, &o[0][0], inv, 16 * warp + g4, t4);  // (o[n][e]: the m16n8 layout)
  if (t4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (lane_strip.row_ok[r]) p.lse[lse_row<NA, QB>(p, tile, 16 * warp + g4 + 8 * r, b, h)] = row_lse(m[r], l[r]);
  }
  store_output_rows<T, NA, HD, QB, R, true>(p, tile, &map_o, stage, 0, QB::extent(0), h, b,
                                            RowsOut{p.out, p.out_s, p.heads, kRowsOut});  // (forward.cuh)
#endif
}

}  }  // namespace nattn::sm90
