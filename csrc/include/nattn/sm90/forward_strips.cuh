// Hopper (sm_90a) forward for small 2-D windows: the strip CTA.
//
// wgmma's 64-row operand makes every query of a 64-query box walk the union of the whole
// box's windows: an 8 x 8 box with a 7 x 7 window walks 14 x 16 keys a query, 4.6x its 49.
// Here a CTA still owns an 8 x 8 query box of one (batch, head, dilation group) and its
// thread 0 still loads the box and its whole window union (one 14 x 16 key box, the
// tensor maps of the forward: forward.cuh) with the copy engine, but each of its four warps
// computes with mma.sync (m16n8k16) on its own strip of two query rows x 8 columns, which
// needs only 8 of the union's 14 key rows: 8 x 16 keys a query, 2.6x a 7 x 7 window.
//
// A warp's 16 queries are the m16 rows (box rows 16 w .. 16 w + 15: strip row 0 then 1); it
// walks its key rows in chunks of kStripChunkRows (64 keys, eight n8 tiles: strip_geometry.cuh
// has the geometry), K and V fragments read with ldmatrix from the swizzled tiles the copy
// engine wrote (a tile row = a key; eight consecutive rows per n8 tile, so the swizzle of a
// lane's row does not depend on the chunk: one base address a lane per operand). Per chunk:
// S = Q K^T, the window mask (a bit test per score), the RPB from the head's table in shared
// memory, online softmax, O += P V with P from the S fragments. Epilogue as forward.cuh's
// 64-query CTAs: O / l through the query tile, one bulk tensor store (or per-lane stores).
//
// Windows up to 7 rows (the union's 14 = 8 + 7 - 1) x 9 columns (16 = 8 + 9 - 1), stride 1
// (strided windows' unions can be wider): prepare_forward declines the others.
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

namespace nattn { namespace sm90 {

template <class Tl, int HD>
struct StripCta {
  static constexpr int kThreads = 128;  // four warps, one strip of 16 queries each
  // Shared memory bounds the CTAs per SM (at head dim 64: 64 KB of tiles a CTA).
  static constexpr int kMinBlocks = HD <= 32 ? 4 : 3;
  static_assert(Tl::Q::extent(0) == 8 && Tl::Q::extent(1) == 8 && Tl::K::extent(1) == kStripCols &&
                    Tl::K::extent(0) >= 6 + kStripWalkRows,
                "strip pairs: an 8 x 8 query box, a key box of 16 columns and the strips' rows");
  // The RPB table sits in shared memory between guards of kRpbGuard floats: a walk's keys
  // outside a row's window (masked) index up to 3 table rows + 23 entries past its end, or a
  // row + 7 before its start (rows of at most 17 entries; csrc/tests/sm90_strips_check.cu).
  static constexpr int kRpbGuard = 128;
};

template <class Tl, int HD>
struct StripSmem {
  using Rows = TileSmem<HD, Tl::Q::kSize>;
  using Cols = TileSmem<HD, Tl::K::kSize>;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + Rows::kBytes;
  static constexpr int kV = kK + Cols::kBytes;
  static constexpr int kBars = kV + Cols::kBytes;  // q_full, k_full, v_full
  static constexpr int kBytes = kBars + 8 * 3;
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  static constexpr int kRpbFloats = kSmallRpbStageFloats + 2 * StripCta<Tl, HD>::kRpbGuard;
};

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(StripCta<Tl, HD>::kThreads, StripCta<Tl, HD>::kMinBlocks)
    forward_strips_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                          const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                          const __grid_constant__ CUtensorMap map_o) {
#if NATTN_SM90_ENABLED
  static_assert(NA == 2, "strip CTAs are 2-D");
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  using Cta = StripCta<Tl, HD>;
  using S = StripSmem<Tl, HD>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = bars + 2;

  CtaTile tile;
  if (!cta_tile<NA, QB, KB>(p, blockIdx.x, tile)) return;  // uniform
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = kv_head(p, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(q_full, 1);
    mbar_init(k_full, 1);
    mbar_init(v_full, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the query box, then the union's keys and values (one box each)
    int c[5];
    const HeadCoords hq = head_coords<HD>(p, kRowsQ, p.heads, h, b);
    mbar_expect_tx(q_full, R::kBytes);
    for (int cb = 0; cb < R::kBlocks; ++cb) {
      box_coords<NA>(p, tile, tile.q0, hq.channel + cb * R::kChannels, hq.outer, c);
      tma_load_box<NA, QB, R::kRowBytes>(p, smem + S::kQ + cb * R::kBlockBytes, &map_q, q_full, c);
    }
    load_kv_box<NA, KB, C, 1>(p, tile, tile.lo, 0, head_coords<HD>(p, kRowsK, p.heads_kv, h_kv, b),
                              head_coords<HD>(p, kRowsV, p.heads_kv, h_kv, b), smem + S::kK, smem + S::kV, &map_k,
                              &map_v, k_full, v_full, c);
  }
  // The head's RPB table times log2(e), between guards (behind the copies).
  const bool has_rpb = p.rpb != nullptr;
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + Cta::kRpbGuard;
  if (has_rpb) {
    const float* src = p.rpb + int64_t(h) * p.rpb_head_size;
    for (int i = threadIdx.x; i < int(p.rpb_head_size); i += Cta::kThreads) bias[i] = __ldg(src + i) * kLog2e;
    __syncthreads();
  }

  // The lane's rows, their windows and mask words, the strip's key rows (strip_geometry.cuh).
  StripLane lane_strip;
  strip_lane<QB>(p, tile, warp, lane, lane_strip);
  const int sy = lane_strip.sy, chunks = lane_strip.chunks, rpb_mult0 = p.rpb_size[1];

  // ldmatrix row addresses: K (n8 tiles: eight tile rows, 32 channels an x4), V (transposed:
  // sixteen rows, 16 channels an x4), Q (the warp's sixteen rows). The swizzle of a row
  // depends only on its place within 8 (16) rows, so the walk adds whole-row offsets.
  const unsigned char* k_tile = smem + S::kK + strip_tile_row(sy, 0, 0) * kRowBytes;
  const unsigned char* v_tile = smem + S::kV + strip_tile_row(sy, 0, 0) * kRowBytes;
  int k_lane[HD / 32], v_lane[HD / 16];
#pragma unroll
  for (int x = 0; x < HD / 32; ++x) k_lane[x] = C::offset(lane % 8, 8 * (lane / 8) + 32 * x);
#pragma unroll
  for (int x = 0; x < HD / 16; ++x) v_lane[x] = C::offset(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16) + 16 * x);

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
  mbar_wait(k_full, 0);
  mbar_wait(v_full, 0);
  // One instance of the walk with the RPB and one without (a uniform branch per call, not
  // per score).
  auto walk = [&](auto rpb_tag) {
    constexpr bool kRpb = decltype(rpb_tag)::value;
    for (int ch = 0; ch < chunks; ++ch) {
      float sc[2 * kStripChunkRows][4];
#pragma unroll
      for (int j = 0; j < 2 * kStripChunkRows; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
        const unsigned char* at = k_tile + strip_tile_row(0, ch, j) * kRowBytes;
#pragma unroll
        for (int x = 0; x < HD / 32; ++x) {
          uint32_t kb[4];
          tc::ldmatrix_x4(kb, at + k_lane[x]);
          M::run(sc[j], qa[2 * x], kb);
          M::run(sc[j], qa[2 * x + 1], kb + 2);
        }
      }
      if (!kRpb && !fold) {
#pragma unroll
        for (int j = 0; j < 2 * kStripChunkRows; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[j][e] *= p.scale_log2;
      }
      float mx[2] = {-INFINITY, -INFINITY};
      const uint32_t w[2] = {strip_chunk_word(lane_strip.word[0], ch), strip_chunk_word(lane_strip.word[1], ch)};
      const int bias_at[2] = {lane_strip.bias_at[0] + strip_chunk_bias(rpb_mult0, ch),
                              lane_strip.bias_at[1] + strip_chunk_bias(rpb_mult0, ch)};
#pragma unroll
      for (int j = 0; j < 2 * kStripChunkRows; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2;
          float x = sc[j][e];
          if constexpr (kRpb)  // (the guards keep a masked key's index inside shared memory)
            x = fmaf(x, p.scale_log2, bias[bias_at[r] + strip_bias_offset(rpb_mult0, j, e)]);
          x = strip_kept(w[r], j, e) ? x : -INFINITY;
          sc[j][e] = x;
          mx[r] = fmaxf(mx[r], x);
        }
      float m_use[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], quad_max(mx[r] * mul));
        m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing seen yet stays at zero
        alpha[r] = fast_exp2(m[r] - m_use[r]);
        m[r] = m_new;
        l[r] *= alpha[r];
      }
      if (ch > 0) {
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
#pragma unroll
      for (int i = 0; i < kStripChunkRows; ++i) {  // key row i: a k16 step of P V
        const uint32_t pa[4] = {M::pack(sc[2 * i][0], sc[2 * i][1]), M::pack(sc[2 * i][2], sc[2 * i][3]),
                                M::pack(sc[2 * i + 1][0], sc[2 * i + 1][1]),
                                M::pack(sc[2 * i + 1][2], sc[2 * i + 1][3])};
        const unsigned char* at = v_tile + strip_tile_row(0, ch, 2 * i) * kRowBytes;
#pragma unroll
        for (int x = 0; x < HD / 16; ++x) {
          uint32_t vb[4];
          tc::ldmatrix_x4_trans(vb, at + v_lane[x]);
          M::run(o[2 * x], pa, vb);
          M::run(o[2 * x + 1], pa, vb + 2);
        }
      }
    }
  };
  if (has_rpb) walk(std::true_type{});
  else walk(std::false_type{});

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
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      *reinterpret_cast<uint32_t*>(stage + R::offset(16 * warp + g4 + 8 * r, 8 * n + 2 * t4)) =
          pack2<T>(o[n][2 * r] * inv[r], o[n][2 * r + 1] * inv[r]);
  if (t4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t token;
      box_row_token<NA, QB>(p, tile, tile.q0, 16 * warp + g4 + 8 * r, token);
      if (lane_strip.row_ok[r]) p.lse[(int64_t(b) * p.tokens + token) * p.heads + h] = row_lse(m[r], l[r]);
    }
  }
  if (p.out_map) {
    fence_proxy_async_smem();
    named_sync(1, Cta::kThreads);
    if (threadIdx.x == 0) {
      const HeadCoords ho = head_coords<HD>(p, kRowsOut, p.heads, h, b);
      int c[5];
      for (int cb = 0; cb < R::kBlocks; ++cb) {
        box_coords<NA>(p, tile, tile.q0, ho.channel + cb * R::kChannels, ho.outer, c);
        tma_store<NA + 2>(&map_o, stage + cb * R::kBlockBytes, c);
      }
      bulk_commit();
      bulk_wait_read<0>();  // the CTA's shared memory must outlive the copy's reads
    }
    return;
  }
  named_sync(1, Cta::kThreads);
  T* out = head_base<T>(p.out, p.out_s, b, h);
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x; idx < QB::kSize * kChunks; idx += Cta::kThreads) {
    const int qr = idx / kChunks, cc = idx % kChunks;
    int64_t off;
    if (box_row_offset<NA, QB>(p, tile, tile.q0, qr, p.out_s, off))
      *reinterpret_cast<uint4*>(out + off + cc * 8) = *reinterpret_cast<const uint4*>(stage + R::offset(qr, cc * 8));
  }
#endif
}

}  }  // namespace nattn::sm90
