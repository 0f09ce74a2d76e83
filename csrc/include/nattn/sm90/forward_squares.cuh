// Hopper (sm_90a) forward for 2-D windows of up to 13 x 13: the square CTA.
//
// A 64-query wgmma box walks the union of all its queries' windows: the 16 x 4 box with a
// 13 x 13 window walks 28 x 16 keys a query, 2.65x the window's 169. The strip CTAs
// (forward_strips.cuh) cut that with mma.sync on each warp's own strip of two query rows,
// which suits windows up to 7 x 9; on a 13 x 13 window a strip of 2 x 8 queries would still
// walk 14 x 20 keys. Here each of the four warps owns a square of 4 x 4 queries of the CTA's
// 8 x 8 box, whose windows span at most 16 x 16 keys (1.5x a 13 x 13 window): thread 0 loads
// the box and its whole window union (a 20 x 20 key box, in five parts of four key rows that
// complete on their own mbarriers: a warp waits for its chunk's parts only), and each warp
// walks its square's 16 columns in chunks of four key rows (64 keys, square_geometry.cuh),
// as the strips do: S = Q K^T with ldmatrix fragments from the
// swizzled tiles, the window mask (a bit test per score), the RPB from the head's table in
// shared memory, online softmax, O += P V with P from the score fragments. Epilogue as the
// strips' (O / l through the query tile, one bulk tensor store or per-lane stores).
//
// A key box row is 20 keys, 4 mod the swizzle's 8 rows, so the fragments' swizzle phase
// alternates with the walk row: each lane keeps one K and one V offset per parity.
// Stride 1, windows up to 13 x 13 (square_declines), head dims 32 and 64.
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/common/softmax.cuh"
#include "nattn/common/window.cuh"
#include "nattn/sm90/forward.cuh"
#include "nattn/sm90/forward_strips.cuh"
#include "nattn/sm90/square_geometry.cuh"
#include "nattn/tc/mma.cuh"

namespace nattn { namespace sm90 {

template <class Tl, int HD>
struct SquareCta {
  static constexpr int kThreads = 128;  // four warps, one square of 16 queries each
  // Shared memory bounds the CTAs per SM: at head dim 64 the tiles take 108 KB (two CTAs);
  // at 32, 54 KB (four, with <= 128 registers a thread).
  static constexpr int kMinBlocks = HD <= 32 ? 4 : 2;
  static_assert(Tl::Q::extent(0) == 8 && Tl::Q::extent(1) == 8 && Tl::Q::extent(2) == 1 &&
                    Tl::K::extent(0) == kSquareKeyBox && Tl::K::extent(1) == kSquareKeyBox,
                "the square pair: 8 x 8 queries, a 20 x 20 key box");
  // The RPB table sits between guards: a masked key of a square's walk lies at most 3 key
  // rows and 3 columns outside its row's window (rows of at most 25 entries: an index up
  // to 3 x 25 + 3 before the table or past its end; csrc/tests/sm90_squares_check.cu).
  static constexpr int kRpbGuard = 128;
};

// kRing: a ring of kSquareRingParts parts (kSquareForwardRing, kSquareDqRing; SquareRing) in
// place of the whole key box, three CTAs an SM.
template <class Tl, int HD, bool kRing = false>
struct SquareSmem {
  using Cta = SquareCta<Tl, HD>;
  static constexpr int kMinBlocks = kRing ? 3 : Cta::kMinBlocks;
  using Rows = TileSmem<HD, Tl::Q::kSize>;
  using Cols = TileSmem<HD, kRing ? kSquareRingParts * kSquarePartRows * kSquareKeyBox : Tl::K::kSize>;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + Rows::kBytes;
  static constexpr int kV = kK + Cols::kBytes;
  using Part = TileSmem<HD, kSquarePartRows * kSquareKeyBox>;  // a part of K or V
  // rows_full, parts_full[kSquareParts], grad_full (the dQ pass's dO rows, into Q's tile)
  static constexpr int kBars = kV + Cols::kBytes;
  static constexpr int kCounts = kBars + 8 * (2 + kSquareParts);  // ring: warps done with a slot's part
  // ring: the CTA's tile, read after the walk (square_late_tile)
  static constexpr int kTile = kCounts + (kRing ? 4 * kSquareRingParts : 0);
  static constexpr int kBytes = kTile + (kRing ? int(sizeof(CtaTile)) : 0);
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  static constexpr int kRpbFloats = kSmallRpbStageFloats + 2 * Cta::kRpbGuard;
  static_assert(kMinBlocks * (kAlloc + kSmemReservedPerCta) <= kSmemPerSm, "the CTAs per SM");
};

// Thread 0's copies (the barriers initialized): the query box's rows of one tensor (Q: kRowsQ,
// or dO) into Q's tile (or the tile at byte `at`, 1024-aligned), completing on `bar`.
template <int NA, int HD, class Tl>
__device__ __forceinline__ void load_square_rows(const Params& p, const CtaTile& tile, int rows, int h, int b,
                                                 unsigned char* smem, const CUtensorMap* map, uint64_t* bar,
                                                 int at = SquareSmem<Tl, HD>::kQ) {
  using R = typename SquareSmem<Tl, HD>::Rows;
  int c[5];
  mbar_expect_tx(bar, R::kBytes);
  load_box_blocks<NA, typename Tl::Q, R>(p, tile, tile.q0, head_coords<HD>(p, rows, p.heads, h, b), smem + at, map,
                                         bar, c);
}

// ... and parts first .. last - 1 of the union's keys and values, each completing on its own
// barrier (kRing: part i into slot (rot + i) mod kSquareRingParts; rot is the persistent
// form's, forward_squares_persistent.cuh).
template <int NA, int HD, class Tl, bool kRing = false>
__device__ __forceinline__ void load_square_parts(const Params& p, const CtaTile& tile, int h_kv, int b,
                                                  unsigned char* smem, const CUtensorMap* map_k,
                                                  const CUtensorMap* map_v, int first, int last, int rot = 0) {
  using S = SquareSmem<Tl, HD, kRing>;
  using P = typename S::Part;
  using PartBox = Box<kSquarePartRows, kSquareKeyBox, 1>;
  uint64_t* parts_full = reinterpret_cast<uint64_t*>(smem + S::kBars) + 1;
  int c[5];
  const HeadCoords hk = head_coords<HD>(p, kRowsK, p.heads_kv, h_kv, b);
  const HeadCoords hv = head_coords<HD>(p, kRowsV, p.heads_kv, h_kv, b);
  for (int i = first; i < last; ++i) {
    const int origin[3] = {tile.lo[0] + kSquarePartRows * i, tile.lo[1], 0};
    const int slot = kRing ? (rot + i) % kSquareRingParts : i;
    mbar_expect_tx(parts_full + i, 2 * P::kBytes);
    load_box_blocks<NA, PartBox, P>(p, tile, origin, hk, smem + S::kK + slot * P::kBytes, map_k, parts_full + i, c);
    load_box_blocks<NA, PartBox, P>(p, tile, origin, hv, smem + S::kV + slot * P::kBytes, map_v, parts_full + i, c);
  }
}

// The ring of kSquareRingParts slots (kSquareForwardRing, kSquareDqRing): part i lands in
// slot i mod kSquareRingParts, completing its own barrier (one phase each, as without the
// ring). Parts 0 .. kSquareParts - kSquareRingParts - 1 are the ones whose slot is refilled:
// each warp counts them done (in order, also those it never reads), and the fourth warp done
// with part q copies part q + kSquareRingParts into its slot, once part q itself has landed
// (a warp may count a part it never waited for).
template <int NA, int HD, class Tl>
struct SquareRing {
  using S = SquareSmem<Tl, HD, true>;
  static constexpr int kRefilled = kSquareParts - kSquareRingParts;
  int released = 0;  // the warp has counted parts 0 .. released - 1

  // The warp is done with the parts before `upto` (the whole warp calls it).
  __device__ __forceinline__ void release_upto(int upto, int lane, unsigned char* smem, uint64_t* parts_full,
                                               const Params& p, const CtaTile& tile, int h_kv, int b,
                                               const CUtensorMap* map_k, const CUtensorMap* map_v) {
    upto = nattn_min(upto, kRefilled);
    if (released >= upto) return;
    __syncwarp();  // (the warp's reads of the parts)
    if (lane == 0) {
      int* counts = reinterpret_cast<int*>(smem + S::kCounts);
      for (int q = released; q < upto; ++q) {
        __threadfence_block();  // (this warp's reads before its count)
        if (atomicAdd(counts + q % kSquareRingParts, 1) == SquareCta<Tl, HD>::kThreads / 32 - 1) {
          __threadfence_block();  // (every warp's reads before the copy)
          mbar_wait(parts_full + q, 0);
          fence_proxy_async_smem();
          load_square_parts<NA, HD, Tl, true>(p, tile, h_kv, b, smem, map_k, map_v, q + kSquareRingParts,
                                              q + kSquareRingParts + 1);
        }
      }
    }
    released = upto;
  }

  // After chunk ch of a square walking `chunks` chunks from key row sy (ch = -1: before the
  // walk) the warp is done with the parts before chunk ch + 1's first (all after the last).
  __device__ __forceinline__ void release_after(int ch, int chunks, int sy, int lane, unsigned char* smem,
                                                uint64_t* parts_full, const Params& p, const CtaTile& tile,
                                                int h_kv, int b, const CUtensorMap* map_k, const CUtensorMap* map_v) {
    release_upto(ch + 1 < chunks ? square_first_part(sy, ch + 1) : kSquareParts, lane, smem, parts_full, p, tile, h_kv,
                 b, map_k, map_v);
  }

  // Before the CTA ends (thread 0 waits): the refills landed (every warp counted every refilled part).
  __device__ __forceinline__ static void drain(uint64_t* parts_full) {
    if (threadIdx.x == 0)
      for (int q = kSquareRingParts; q < kSquareParts; ++q) mbar_wait(parts_full + q, 0);
  }
};

// The CTA's tile after the walk: with the ring (three CTAs an SM, 168 registers) from thread
// 0's copy in shared memory (square_keep_tile), so that its 13 fields do not stay in registers
// through the walk (they spilled to local memory), else the registers' copy.
template <bool kRing, class S>
__device__ __forceinline__ const CtaTile& square_late_tile(const CtaTile& tile, const unsigned char* smem) {
  if constexpr (kRing)
    return *reinterpret_cast<const CtaTile*>(smem + S::kTile);
  else
    return tile;
}
template <bool kRing, class S>
__device__ __forceinline__ void square_keep_tile(const CtaTile& tile, unsigned char* smem) {  // thread 0
  if constexpr (kRing) *reinterpret_cast<CtaTile*>(smem + S::kTile) = tile;
}

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(SquareCta<Tl, HD>::kThreads, SquareSmem<Tl, HD, kSquareForwardRing<HD>>::kMinBlocks)
    forward_squares_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                           const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                           const __grid_constant__ CUtensorMap map_o) {
#if NATTN_SM90_ENABLED
  static_assert(NA == 2, "the square pair is 2-D");
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  using Cta = SquareCta<Tl, HD>;
  constexpr bool kRing = kSquareForwardRing<HD>;
  using S = SquareSmem<Tl, HD, kRing>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  constexpr int kKeyRowBytes = kSquareKeyBox * kRowBytes;  // a key box row's keys
  unsigned char* smem = aligned_smem();
  uint64_t* rows_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* parts_full = rows_full + 1;

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
    mbar_init(rows_full, 1);
    for (int i = 0; i < kSquareParts; ++i) mbar_init(parts_full + i, 1);
#if NATTN_SM90_SQUARE_RING  // (the ring's code under #if: switched off, the whole-box kernel's SASS is the one measured before it)
    if constexpr (kRing)
      for (int i = 0; i < kSquareRingParts; ++i) reinterpret_cast<int*>(smem + S::kCounts)[i] = 0;
    square_keep_tile<kRing, S>(tile, smem);
#endif
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the query box, then the union's keys and values, part by part
    load_square_rows<NA, HD, Tl>(p, tile, kRowsQ, h, b, smem, &map_q, rows_full);
#if NATTN_SM90_SQUARE_RING
    load_square_parts<NA, HD, Tl, kRing>(p, tile, h_kv, b, smem, &map_k, &map_v, 0,
                                         kRing ? kSquareRingParts : kSquareParts);
#else
    load_square_parts<NA, HD, Tl>(p, tile, h_kv, b, smem, &map_k, &map_v, 0, kSquareParts);
#endif
  }
  // The head's RPB table times log2(e), between guards (behind the copies).
  const bool has_rpb = p.rpb != nullptr;
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + Cta::kRpbGuard;
  stage_strip_rpb<Cta>(p, h, bias);

  // The lane's rows, their windows and mask words, the square's walk (square_geometry.cuh).
  SquareLane sq;
  square_lane<QB>(p, tile, warp, lane, sq);
  const int chunks = sq.chunks, row_mult = sq.row_mult;

  // ldmatrix addresses: the square's first key, plus a tile's first key, plus the lane's
  // offset for the tile's walk-row parity (K; V transposed, in the V tile).
#if NATTN_SM90_SQUARE_RING
  // (ring: key row r of the union at slot row square_ring_row(r), with its swizzle phase)
  const unsigned char* keys_at = smem + S::kK + ((kRing ? 0 : sq.sy * kSquareKeyBox) + sq.sx) * kRowBytes;
#if NATTN_SM90_SQUARE_RING_ROWS
  // walk row 4 ch + i's keys: from the chunk's base (chunk_at_of) where its rows do not pass
  // the ring's end (kWrap false: immediate row offsets), else each row's slot
  auto row_at = [&](auto wrap_tag, const unsigned char* chunk_at, int ch, int i) {
    if constexpr (kRing && decltype(wrap_tag)::value)
      return keys_at + square_ring_row(sq.sy + kStripChunkRows * ch + i) * kKeyRowBytes;
    else
      return chunk_at + i * kKeyRowBytes;
  };
  auto chunk_at_of = [&](int ch) {  // chunk ch's first key: in the whole box, or its first row's in the ring
    if constexpr (kRing)
      return keys_at + square_ring_row(sq.sy + kStripChunkRows * ch) * kKeyRowBytes;
    else
      return keys_at + kStripChunkRows * ch * kKeyRowBytes;
  };
#else
  // walk row 4 ch + i's keys (chunk_at: the whole box's chunk ch)
  auto row_at = [&](const unsigned char* chunk_at, int ch, int i) {
    if constexpr (kRing) {
      return keys_at + square_ring_row(sq.sy + kStripChunkRows * ch + i) * kKeyRowBytes;
    } else {
      return chunk_at + i * kKeyRowBytes;
    }
  };
#endif
#else
  const unsigned char* keys_at = smem + S::kK + (sq.sy * kSquareKeyBox + sq.sx) * kRowBytes;
#endif
  int k_off[2][HD / 32], v_off[2][HD / 16];
  square_fragment_offsets<C, HD>(sq.sy, sq.sx, lane, C::kBytes, k_off, v_off);

  uint32_t qa[HD / 16][4];
  mbar_wait(rows_full, 0);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    tc::ldmatrix_x4(qa[kk], smem + S::kQ + R::offset(square_query_row(warp, lane % 16), 16 * kk + 8 * (lane / 16)));

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
  using Scores = float[2 * kStripChunkRows][4];
  // Chunk ch's scores S = Q K^T (score tile j: walk row 4 ch + j / 2, columns 8 (j % 2) ..).
#if NATTN_SM90_SQUARE_RING_ROWS
  auto scores = [&](auto wrap_tag, int ch, Scores& sc) {
    const unsigned char* chunk_at = chunk_at_of(ch);
#else
  auto scores = [&](int ch, Scores& sc) {
    const unsigned char* chunk_at = keys_at + kStripChunkRows * ch * kKeyRowBytes;
#endif
#pragma unroll
    for (int j = 0; j < 2 * kStripChunkRows; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
#if NATTN_SM90_SQUARE_RING_ROWS
      const unsigned char* at = row_at(wrap_tag, chunk_at, ch, j / 2) + 8 * (j % 2) * kRowBytes;
#elif NATTN_SM90_SQUARE_RING
      const unsigned char* at = row_at(chunk_at, ch, j / 2) + 8 * (j % 2) * kRowBytes;
#else
      const unsigned char* at = chunk_at + (j / 2) * kKeyRowBytes + 8 * (j % 2) * kRowBytes;
#endif
#pragma unroll
      for (int x = 0; x < HD / 32; ++x) {
        uint32_t kb[4];
        tc::ldmatrix_x4(kb, at + k_off[(j / 2) % 2][x]);
        M::run(sc[j], qa[2 * x], kb);
        M::run(sc[j], qa[2 * x + 1], kb + 2);
      }
    }
  };
  // Then the mask, the RPB and online softmax (the strips' chunk softmax), O += P V.
#if NATTN_SM90_SQUARE_RING_ROWS
  auto consume = [&](auto rpb_tag, auto wrap_tag, Scores& sc, int ch, bool first) {
#else
  auto consume = [&](auto rpb_tag, Scores& sc, int ch, bool first) {
#endif
    constexpr bool kRpb = decltype(rpb_tag)::value;
    const uint32_t w[2] = {square_chunk_word(sq.word[0], ch), square_chunk_word(sq.word[1], ch)};
    const int bias_at[2] = {sq.bias_at[0] + strip_chunk_bias(row_mult, ch), sq.bias_at[1] + strip_chunk_bias(row_mult, ch)};
    strip_chunk_softmax<kRpb, 1, HD>(sc, w, bias_at, bias, row_mult, p.scale_log2, fold, mul, m, l, o, first);  // (forward_strips.cuh)
#if NATTN_SM90_SQUARE_RING_ROWS
    const unsigned char* chunk_at = chunk_at_of(ch);
#else
    const unsigned char* chunk_at = keys_at + kStripChunkRows * ch * kKeyRowBytes;
#endif
#pragma unroll
    for (int i = 0; i < kStripChunkRows; ++i) {  // tiles 2 i and 2 i + 1 (walk row 4 ch + i): a k16 step of P V
      const uint32_t pa[4] = {M::pack(sc[2 * i][0], sc[2 * i][1]), M::pack(sc[2 * i][2], sc[2 * i][3]),
                              M::pack(sc[2 * i + 1][0], sc[2 * i + 1][1]),
                              M::pack(sc[2 * i + 1][2], sc[2 * i + 1][3])};
#if NATTN_SM90_SQUARE_RING_ROWS
      const unsigned char* at = row_at(wrap_tag, chunk_at, ch, i);
#elif NATTN_SM90_SQUARE_RING
      const unsigned char* at = row_at(chunk_at, ch, i);
#else
      const unsigned char* at = chunk_at + i * kKeyRowBytes;
#endif
#pragma unroll
      for (int x = 0; x < HD / 16; ++x) {
        uint32_t vb[4];
        tc::ldmatrix_x4_trans(vb, at + v_off[i % 2][x]);
        M::run(o[2 * x], pa, vb);
        M::run(o[2 * x + 1], pa, vb + 2);
      }
    }
  };
  auto wait_parts = [&](int ch) {  // the chunk's rows: one or two parts
    mbar_wait(parts_full + square_first_part(sq.sy, ch), 0);
    mbar_wait(parts_full + square_last_part(sq.sy, ch), 0);
  };
#if NATTN_SM90_SQUARE_RING
  SquareRing<NA, HD, Tl> ring;
  auto release_after = [&](int ch) {  // (ch = -1: before the walk)
    if constexpr (kRing)
      ring.release_after(ch, chunks, sq.sy, lane, smem, parts_full, p, square_late_tile<kRing, S>(tile, smem), h_kv, b,
                         &map_k, &map_v);
  };
#endif
  // (Issuing chunk ch + 1's S = Q K^T before chunk ch's softmax at head dim 64, 220 registers,
  // was slower: mid-2d 0.200 vs 0.193 ms, H100; PERF.md sixty-fourth session.)
  instanced(has_rpb, [&](auto rpb_tag) {
#if NATTN_SM90_SQUARE_RING
    release_after(-1);
#endif
    for (int ch = 0; ch < chunks; ++ch) {
      wait_parts(ch);
#if NATTN_SM90_SQUARE_RING_ROWS
      auto chunk = [&](auto wrap_tag) {
        Scores sc;
        scores(wrap_tag, ch, sc);
        consume(rpb_tag, wrap_tag, sc, ch, ch == 0);
      };
      // (a chunk whose rows pass the ring's end, warp-uniform: the per-row slot addresses)
      if (kRing && square_ring_row(sq.sy + kStripChunkRows * ch) > kSquareRingRows - kStripChunkRows)
        chunk(std::true_type{});
      else
        chunk(std::false_type{});
#else
      Scores sc;
      scores(ch, sc);
      consume(rpb_tag, sc, ch, ch == 0);
#endif
#if NATTN_SM90_SQUARE_RING
      release_after(ch);
#endif
    }
  });
#if NATTN_SM90_SQUARE_RING
  if constexpr (kRing) SquareRing<NA, HD, Tl>::drain(parts_full);
#endif

  // O / l into the warp's own rows of the query tile (only this warp read them), the LSE
  // from the lanes holding column 0, then the box's rows out (forward.cuh's epilogue).
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    inv[r] = inv_row_sum(l[r]);
  }
  unsigned char* stage = smem + S::kQ;
  const int row0 = square_query_row(warp, g4);  // (the lane's second row: two square rows on)
#if NATTN_SM90_SQUARE_RING
  const CtaTile& late = square_late_tile<kRing, S>(tile, smem);
#else
  const CtaTile& late = tile;
#endif
  __syncwarp();  // every lane's Q fragments are read
  stage_output<T, HD, R, kSquareLaneRowStep>(stage, &o[0][0], inv, row0, t4);
  if (t4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (sq.row_ok[r]) p.lse[lse_row<NA, QB>(p, late, row0 + kSquareLaneRowStep * r, b, h)] = row_lse(m[r], l[r]);
  }
  store_output_rows<T, NA, HD, QB, R, true>(p, late, &map_o, stage, 0, QB::extent(0), h, b,
                                            RowsOut{p.out, p.out_s, p.heads, kRowsOut});  // (forward.cuh)
#endif
}

}  }  // namespace nattn::sm90
