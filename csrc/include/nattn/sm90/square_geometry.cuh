// The square CTA's geometry (forward_squares.cuh), for the device and the host:
// csrc/tests/sm90_squares_check.cu replays it against direct window tests.
//
// A CTA's 8 x 8 query box (2-D) has four squares of 4 x 4 queries: warp w owns box rows
// 4 (w / 2) .. + 3 and columns 4 (w % 2) .. + 3, and the m16 row m of its products is the
// square's row m / 4, column m % 4 (a lane's two rows g4 and g4 + 8: square rows g4 / 4 and
// 2 + g4 / 4, column g4 % 4). The key box holds the union of the box's windows from tile.lo
// (20 x 20 = 8 + 13 - 1 per axis: windows up to 13 x 13), loaded once. A square's windows
// span at most 4 + 13 - 1 = 16 key rows and 16 columns: it walks key rows sy .. in chunks of
// kStripChunkRows (64 keys), 16 columns from sx; score tile j (n8) of chunk ch is key row
// sy + 4 ch + j / 2, columns sx + 8 (j % 2) ..; a lane's score (j, e) of the m16n8
// accumulator is row e / 2 of its two, column sx + 8 (j % 2) + 2 (lane % 4) + e % 2.
// The strips' chunk layout (strip_geometry.cuh) with a walk twice as long and a column start.
#pragma once
#include <stdint.h>

#include "nattn/common/registry.h"
#include "nattn/common/window.cuh"
#include "nattn/sm90/forward_masks.cuh"
#include "nattn/sm90/strip_geometry.cuh"
#include "nattn/sm90/tiles.cuh"

namespace nattn { namespace sm90 {

constexpr int kSquareSide = 4;      // a warp's queries per axis
constexpr int kSquareKeyBox = 20;   // the key box's rows and columns: 8 queries + 13 - 1
constexpr int kSquareWalk = 16;     // key rows and columns a square walks at most: 4 + 13 - 1
constexpr int kSquareMaxKernel = kSquareKeyBox - 8 + 1;
// The key box arrives in parts of four key rows (80 keys: whole 1024-byte swizzle atoms at
// head dims 32 and 64), each completing on its own mbarrier, so that a warp starts on its
// first chunk's rows while the rest are in flight.
constexpr int kSquarePartRows = 4;
constexpr int kSquareParts = kSquareKeyBox / kSquarePartRows;

// The box of the square pair's key and value tensor maps (kbox, in place): one part.
NATTN_HD void square_key_map_box(int* kbox) { kbox[0] = kSquarePartRows; }

// Build switch: 1 (the default) gives the square forward at head dim 64 a ring of three parts
// (12 key rows) in place of the whole key box: 68 KB of tiles, three CTAs an SM (the last
// warp done with part q copies part q + 3 into its slot; SquareRing, forward_squares.cuh); 0
// the whole box at two CTAs an SM (mid-2d forward 0.194 vs 0.188 ms, with an RPB 0.254 vs
// 0.212; H100, PERF.md sixty-seventh session).
#ifndef NATTN_SM90_SQUARE_RING
#define NATTN_SM90_SQUARE_RING 1
#endif
// NATTN_SM90_SQUARE_DQ_RING=1: the same ring for the square dQ pass (backward_dq_squares.cuh)
// at head dim 64 (its Q tile holds Q, then dO, as without it).
#ifndef NATTN_SM90_SQUARE_DQ_RING
#define NATTN_SM90_SQUARE_DQ_RING 1
#endif
// Build switch: 1 (the default) has the forward's chunks whose rows do not pass the ring's end
// (warp-uniform) address them from one base with immediate row offsets, the others each row
// at its slot (the per-row slot addresses cost the loop ~25 instructions a chunk; mid-2d
// forward 0.187 vs 0.191 ms with the lazy rescale, H100, PERF.md sixty-eighth session); 0
// every row at its slot. It follows NATTN_SM90_SQUARE_RING (no ring, no slots).
#ifndef NATTN_SM90_SQUARE_RING_ROWS
#define NATTN_SM90_SQUARE_RING_ROWS NATTN_SM90_SQUARE_RING
#endif
static_assert(!NATTN_SM90_SQUARE_RING_ROWS || NATTN_SM90_SQUARE_RING, "the per-chunk ring base needs the ring");
constexpr int kSquareRingParts = 3;
constexpr int kSquareRingRows = kSquareRingParts * kSquarePartRows;  // even: a row keeps its swizzle phase
// The ring's slot row of key box row r (r < 2 kSquareRingRows): part r / 4 sits in slot
// (r / 4) mod kSquareRingParts.
NATTN_HD int square_ring_row(int r) { return r >= kSquareRingRows ? r - kSquareRingRows : r; }
template <int HD>
constexpr bool kSquareForwardRing = NATTN_SM90_SQUARE_RING && HD >= 64;
template <int HD>
constexpr bool kSquareDqRing = NATTN_SM90_SQUARE_DQ_RING && HD >= 64;

// Parts the dQ pass (backward_dq_squares.cuh) loads before the dO rows, the rest after
// them: those of every square's chunk 0 (key rows up to 4 + 3).
constexpr int kSquareEarlyParts = 2;
// Build switch: 1 (the default) has the dQ pass with the ring (head dim 64) copy its dO rows
// with Q's at the start, into the K slot of part kSquareEarlyParts (the ring's last, refilled
// once every warp holds its dO fragments and delta), rather than into Q's tile after every
// warp has read Q: one copy's latency less before the walk. H100, bf16, GPU ms, forward +
// backward, two rounds against 0 (PERF.md sixty-ninth session): mid-2d 0.777 / 0.778 vs 0.779
// / 0.795, 128x128 11x11 0.738 / 0.736 vs 0.740 / 0.751, 56x56 9x9 0.506 / 0.506 vs 0.515 /
// 0.515, 64x64 13x13 0.426 / 0.424 vs 0.428 / 0.428.
#ifndef NATTN_SM90_SQUARE_DQ_EARLY_DO
#define NATTN_SM90_SQUARE_DQ_EARLY_DO 1
#endif
static_assert(kSquareEarlyParts == kSquareRingParts - 1, "the early dO rows borrow the ring's last slot");

// Build switch: 1 (the default) keeps the square kernels' lane offsets in registers (without it
// the compiler recomputes them from the thread index every chunk: ~40 instructions of a
// chunk's ~440, PERF.md sixty-seventh session) and finds a chunk's parts by shifts.
#ifndef NATTN_SM90_SQUARE_LEAN
#define NATTN_SM90_SQUARE_LEAN 1
#endif

// The parts holding walk rows 4 ch .. 4 ch + 3 of a square from key row sy: first and last.
#if NATTN_SM90_SQUARE_LEAN
static_assert(kStripChunkRows == kSquarePartRows, "a chunk starts sy mod 4 rows into a part");
NATTN_HD int square_first_part(int sy, int ch) { return (sy >> 2) + ch; }  // (sy >= 0)
NATTN_HD int square_last_part(int sy, int ch) { return ((sy + 3) >> 2) + ch; }
#else
NATTN_HD int square_first_part(int sy, int ch) { return (sy + kStripChunkRows * ch) / kSquarePartRows; }
NATTN_HD int square_last_part(int sy, int ch) { return (sy + kStripChunkRows * ch + kStripChunkRows - 1) / kSquarePartRows; }
#endif

// Whether a (query box, key box) pair is the square pair (Tile::kSquares in tiles.cuh).
NATTN_HD bool is_square_pair(int na_dim, const int* qbox, const int* kbox) {
  return na_dim == 2 && qbox[0] == 8 && qbox[1] == 8 && kbox[0] == kSquareKeyBox && kbox[1] == kSquareKeyBox;
}

// Why the square pair cannot take a problem, or null: stride 1 (strided windows' unions are
// wider) and windows up to 13 x 13 (the union must fit the key box); no split-KV.
inline const char* square_declines(const Params& p) {
  if (p.kv_splits > 1) return "split-KV (kv_splits > 1) is not built for the square pair";
  for (int a = 0; a < p.na_dim; ++a) {
    if (p.stride[a] != 1) return "the square pair takes stride 1 only (strided windows' unions are wider)";
    if (p.kernel[a] > kSquareMaxKernel)
      return "the square pair takes windows up to 13 x 13 (its 8 x 8 queries' union must fit its 20 x 20 key box)";
  }
  return nullptr;
}

// Box rows from a lane's first row (m16 row lane / 4) to its second (lane / 4 + 8): two
// square rows of the 8-wide box.
constexpr int kSquareLaneRowStep = 2 * 8;

// The box row (row-major over the 8 x 8 box) of m16 row m of warp w's products.
NATTN_HD int square_query_row(int warp, int m) {
  return (kSquareSide * (warp / 2) + m / kSquareSide) * 8 + kSquareSide * (warp % 2) + m % kSquareSide;
}

// Chunks a square walks where its windows span `rows` key rows.
NATTN_HD int square_chunks(int rows) { return (rows + kStripChunkRows - 1) / kStripChunkRows; }

// Keys a square walks per query: whole chunks of the rows its windows span (kernel + 3 at
// most) of kSquareWalk columns.
NATTN_HD int square_walked_keys(const Params& p) {
  return square_chunks(nattn_min(p.kernel[0] + kSquareSide - 1, kSquareWalk)) * kStripChunkRows * kSquareWalk;
}

// The box key (row-major over the 20 x 20 key box) of the first key of n8 tile j of chunk ch.
NATTN_HD int square_tile_key(int sy, int sx, int ch, int j) {
  return (sy + kStripChunkRows * ch + j / 2) * kSquareKeyBox + sx + 8 * (j % 2);
}

// The swizzle phase (box key mod 8) of the tiles on walk rows of parity `odd`: a key box row
// is 20 keys (4 mod 8), so the phase of a square's tiles alternates with the row, and K / V
// fragment addresses are a lane offset per parity plus the tile's first key.
NATTN_HD int square_phase(int sy, int sx, int odd) { return ((sy + odd) * kSquareKeyBox + sx) & 7; }

// A lane's ldmatrix offsets into a swizzled tile (C, a TileSmem) for fragments whose first
// row is at swizzle phase ph (row mod 8): k_off for rows as the B operand of a product over
// the channels (n8 tiles of eight rows, 32 channels an x4), t_off for rows read transposed
// (sixteen rows, 16 channels an x4), from t_base (the tile's offset from the first one's).
// They hold the swizzle of the lane's row at that phase, less the phase: added to (first row)
// x row bytes they address the fragment (the swizzle repeats every 8 rows).
template <class C, int HD>
NATTN_HD void phase_fragment_offsets(int ph, int lane, int t_base, int (&k_off)[HD / 32], int (&t_off)[HD / 16]) {
#pragma unroll
  for (int x = 0; x < HD / 32; ++x) k_off[x] = C::offset(ph + lane % 8, 8 * (lane / 8) + 32 * x) - ph * C::kRowBytes;
#pragma unroll
  for (int x = 0; x < HD / 16; ++x)
    t_off[x] = t_base + C::offset(ph + lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16) + 16 * x) - ph * C::kRowBytes;
}

// Makes a lane's offsets opaque to the compiler (NATTN_SM90_SQUARE_LEAN), so that it keeps them
// in registers rather than recompute them from the thread index in every loop step.
template <int HD>
NATTN_HD void pin_fragment_offsets(int (&k_off)[HD / 32], int (&t_off)[HD / 16]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int x = 0; x < HD / 32; ++x) asm volatile("" : "+r"(k_off[x]));
#pragma unroll
  for (int x = 0; x < HD / 16; ++x) asm volatile("" : "+r"(t_off[x]));
#endif
}

// The same into a 20 x 20 key tile for each walk-row parity, added to the square's first key
// and a score tile's first key: k_off for K (or V) as the B operand of S = Q K^T, t_off for a
// tile read transposed (V of O += P V, K of dQ += dS K). A key box row is 20 keys (4 mod 8),
// so the phase of a square's tiles alternates with the walk row (square_phase).
template <class C, int HD>
NATTN_HD void square_fragment_offsets(int sy, int sx, int lane, int t_base, int (&k_off)[2][HD / 32],
                                      int (&t_off)[2][HD / 16]) {
#pragma unroll
  for (int odd = 0; odd < 2; ++odd)
    phase_fragment_offsets<C, HD>(square_phase(sy, sx, odd), lane, t_base, k_off[odd], t_off[odd]);
#if NATTN_SM90_SQUARE_LEAN
#pragma unroll
  for (int odd = 0; odd < 2; ++odd) pin_fragment_offsets<HD>(k_off[odd], t_off[odd]);
#endif
}

// A lane's part of its warp's square: its two query rows (box rows square_query_row(warp,
// lane / 4) and (.., lane / 4 + 8)), their windows and validity; the square's first key row
// and column in the key box and its walk chunks (warp-uniform); one mask word per row (bit
// 4 i + 2 h + e: walk row i, column sx + 8 h + 2 (lane % 4) + e in the row's window); the
// RPB index of walk row 0, column sx + 2 (lane % 4) (a key row adds row_mult).
struct SquareLane {
  RowWindow row[2];
  bool row_ok[2];
  int sy, sx, chunks;
  uint64_t word[2];
  int bias_at[2];
  int row_mult;
};

// The square's windows (warp-uniform): its first row's and column's start its walk, its
// last's end it (windows move forward with the query).
NATTN_HD void square_span(const Params& p, const CtaTile& tile, int warp, int& sy, int& sx, int& chunks) {
  int start[2], rows = 0;
  for (int a = 0; a < 2; ++a) {
    const int first = tile.q0[a] + kSquareSide * (a == 0 ? warp / 2 : warp % 2);
    const int last = first + kSquareSide - 1;
    const AxisRange w0 = query_window(nattn_min(first, tile.len[a] - 1), tile.len[a], p.kernel[a], 1, p.causal[a] != 0);
    const AxisRange w1 = query_window(nattn_min(last, tile.len[a] - 1), tile.len[a], p.kernel[a], 1, p.causal[a] != 0);
    start[a] = w0.start - tile.lo[a];
    if (a == 0) rows = w1.start + w1.count - w0.start;
  }
  sy = start[0];
  sx = start[1];
  chunks = square_chunks(rows);
}

template <class QB>
NATTN_HD void square_lane(const Params& p, const CtaTile& tile, int warp, int lane, SquareLane& s) {
  const int t4 = lane % 4;
  int rpb_mult[3] = {p.rpb_size[1], 1, 1};
  s.row_mult = rpb_mult[0];
  square_span(p, tile, warp, s.sy, s.sx, s.chunks);
  const int first_row = tile.lo[0] + s.sy, first_col = tile.lo[1] + s.sx;
  for (int r = 0; r < 2; ++r) {
    s.row[r].rpb = 0;
    s.row_ok[r] = row_window<2, QB>(p, tile.q0, tile.len, square_query_row(warp, lane / 4 + 8 * r), rpb_mult, s.row[r]);
    uint64_t cols = 0;
    for (int q = 0; q < 4; ++q) {
      const int kx = first_col + 8 * (q / 2) + 2 * t4 + q % 2;
      cols |= uint64_t(kx >= s.row[r].lo[1] && kx <= s.row[r].hi[1]) << q;
    }
    // walk rows lo .. hi of the row's window (inside the walk: the square's span holds it)
    static_assert(kSquareWalk == 16, "a 64-bit mask word holds 16 walk rows");
    s.word[r] = nibble_rows<uint64_t>(s.row[r].lo[0] - first_row, s.row[r].hi[0] - first_row) &
                (cols * 0x1111111111111111ull);
    s.bias_at[r] = s.row[r].rpb + first_row * s.row_mult + first_col + 2 * t4;
  }
}

// A row's mask word for chunk ch (bit 2 j + e: score (j, e) of the chunk; strip_kept reads it).
NATTN_HD uint32_t square_chunk_word(uint64_t word, int ch) { return uint32_t(word >> (4 * kStripChunkRows * ch)); }

// ------------------------------------------------------------------ the square dK/dV pass
// (backward_dkv_squares.cuh) A CTA owns a key box of 64 keys of one (batch, KV head,
// dilation group): 8 x 8 (SquareDkvBox<false>, squares two by two, each warp's square split
// like the forward's query box) or 4 x 16 (SquareDkvBox<true>, the four squares side by
// side); warp w owns a 4 x 4 key square whose m16 row m is box row key_row(w, m), so a
// lane's two keys are rows g4 / 4 and 2 + g4 / 4 of the square, both in column g4 % 4. It
// walks the union of its keys' inverse neighbourhoods (cta_tile_inverse with unit query
// boxes: tile.lo / nk) in slabs of whole union rows, `cols` queries wide from the union's
// first column (a multiple of 8 from 16: the problem's widest union, square_dkv_slab_cols)
// and kSquareDkvSlabTokens / cols rows. A warp walks the lines of its keys' inverse rows,
// each in one or two k16 steps of 16 query columns from the first inverse column of its
// keys (sx): a square's union spans up to 28 queries per axis (16 at a 13 x 13 window away
// from the borders), counted over every grid up to 200 for windows up to 13, causal or not.
// The slab width is a multiple of 8, so a warp's steps all start at the same swizzle phase
// (sx mod 8). A second step may read up to 15 queries past its line (into the next line, or
// past the slab into the tile's zeroed pad): masked there.
// In the 8 x 8 box the top squares' lines start 4 rows before the bottom ones' (away from the
// borders), so a slab of 10 rows gives the top warps 10 lines and the bottom ones 6 (the
// second the other way round), and each slab waits for its slowest warp. An order of the rows
// that gave every warp the same share of each slab (rows seen by the top squares only and by
// the bottom ones only in turn, then the shared ones, copied a row a copy) was slower on an
// H100 (mid-2d's pass 0.510 ms against 0.446; PERF.md sixty-fifth session). In the 4 x 16
// box every warp walks the same union rows, so none waits for another at a slab's end; a
// 13 x 13 window's union is 16 x 28 queries against 20 x 20, and up to 34 wide where the
// box's last keys are near the grid's end (their clamped windows' inverse reaches it).
// square_dkv_wide (sm90/kernels.cuh) picks the box per call.
constexpr int kSquareDkvSlabTokens = 256;
constexpr int kSquareDkvPad = 16;

// The row of slot q of a slab of width W (16, 24, 32 or 40: square_dkv_slab_cols), for q of at
// most kSquareDkvSlabTokens: q / W as q times recip = ceil(2^16 / W), then a shift (exact:
// the product's excess over q / W is below q / 2^16 < 1 / W). recip: square_dkv_row_recip.
NATTN_HD int square_dkv_row_recip(int W) { return ((1 << 16) + W - 1) / W; }
NATTN_HD int square_dkv_slot_row(int q, int recip) { return (q * recip) >> 16; }

// The pass's key box: kWide false the 8 x 8 box, true the 4 x 16 one (above).
template <bool kWide>
struct SquareDkvBox {
  static constexpr int kCols = kWide ? 16 : 8;         // the box's columns
  static constexpr int kMaxSlabCols = kWide ? 40 : 32;  // the widest slab its unions need
  static constexpr int kSquaresPerRow = kCols / kSquareSide;
  using Keys = Box<4 * kSquareSide * kSquareSide / kCols, kCols, 1>;  // (four squares)
  // Box rows (row-major) from a lane's first key (m16 row lane / 4) to its second (+ 8): two
  // square rows.
  static constexpr int kLaneRowStep = 2 * kCols;
  // Warp w's square's first key row and column in the box.
  NATTN_HD static int square_row(int warp) { return kSquareSide * (warp / kSquaresPerRow); }
  NATTN_HD static int square_col(int warp) { return kSquareSide * (warp % kSquaresPerRow); }
  // The box row (row-major) of m16 row m of warp w's keys: square row m / 4, column m % 4.
  NATTN_HD static int key_row(int warp, int m) {
    return (square_row(warp) + m / kSquareSide) * kCols + square_col(warp) + m % kSquareSide;
  }
  // The slab row of slot q at width W (slab_cols): the 8 x 8 box's widths (16, 24, 32) by a
  // shift or a division by 24, the 4 x 16 box's (up to 40) by the reciprocal (recip:
  // square_dkv_row_recip(W)).
  NATTN_HD static int slot_row(int q, int W, int recip) {
    if constexpr (kWide)
      return square_dkv_slot_row(q, recip);
    else
      return W == 16 ? q >> 4 : W == 32 ? q >> 5 : q / 24;
  }
};

// Build switch for A/B runs: 1 (the default) gives the head-dim-64 pass three CTAs an SM
// (slabs of 192 queries, 168 registers without the step pairs, NATTN_SM90_SQUARE_DKV_PIPELINE
// 0); 0 two (slabs of 256 queries, step pairs, 226 registers). Three hide more of each CTA's
// start and slab copies: mid-2d forward + backward 0.818 ms against 0.895 (H100, PERF.md
// sixty-sixth session).
#ifndef NATTN_SM90_SQUARE_DKV_THREE_CTAS
#define NATTN_SM90_SQUARE_DKV_THREE_CTAS 1
#endif
// Build switch for A/B runs: 2 splits the slab buffer into a ring of two slabs of half the
// queries each (slab f + 1's copy runs during slab f's lines); 1 (the default) one slab,
// copied once every warp is done with the one before. The ring was slower without an RPB
// (mid-2d f+b 0.911 ms against 0.895 at two CTAs an SM, 0.869 against 0.818 at three; H100,
// PERF.md sixty-sixth session): half-size slabs double the slab barriers.
#ifndef NATTN_SM90_SQUARE_DKV_STAGES
#define NATTN_SM90_SQUARE_DKV_STAGES 1
#endif
static_assert(NATTN_SM90_SQUARE_DKV_STAGES == 1 || NATTN_SM90_SQUARE_DKV_STAGES == 2, "one or two slab stages");
// The slab's queries at head dim HD (per stage).
template <int HD>
constexpr int kSquareDkvSlabTokensAt =
    (HD >= 64 && NATTN_SM90_SQUARE_DKV_THREE_CTAS ? 192 : kSquareDkvSlabTokens) / NATTN_SM90_SQUARE_DKV_STAGES;

// Union rows a slab of `tokens` queries holds at width cols.
NATTN_HD int square_dkv_slab_rows(int cols, int tokens = kSquareDkvSlabTokens) { return tokens / cols; }

// The box's shape for a choice made at run time (host: square_dkv_wide).
struct SquareDkvShape {
  int rows, cols, max_slab_cols;
};
inline SquareDkvShape square_dkv_shape(bool wide) {
  using W = SquareDkvBox<true>;
  using E = SquareDkvBox<false>;
  return wide ? SquareDkvShape{W::Keys::extent(0), W::kCols, W::kMaxSlabCols}
              : SquareDkvShape{E::Keys::extent(0), E::kCols, E::kMaxSlabCols};
}

// The slab width of a problem (stride 1) for the key box kCols columns wide: the widest union
// of a key box row's inverse columns over the column axis' groups (two lengths at most),
// rounded up to a multiple of 8, at least 16. Host only (a loop over the axis' key boxes).
inline int square_dkv_slab_cols(const Params& p, int kCols) {
  const int d = p.dilation[1], causal = p.causal[1] != 0;
  int widest = 1;
  for (int g = 0; g < (d > 1 ? 2 : 1); ++g) {
    const int len = group_len(p.spatial[1], g == 0 ? 0 : d - 1, d);
    for (int k0 = 0; k0 < len; k0 += kCols) {
      const AxisRange first = key_inverse(k0, len, p.kernel[1], 1, causal);
      const AxisRange last = key_inverse(nattn_min(k0 + kCols - 1, len - 1), len, p.kernel[1], 1, causal);
      widest = nattn_max(widest, last.start + last.count - first.start);
    }
  }
  return nattn_max(16, (widest + 7) / 8 * 8);
}

// The inverse range along axis a of the key box's keys kb .. kb + 3 (a square's row or
// column of keys, group coordinates), clipped to the CTA's union (which a query range
// narrows: the queries outside it add nothing); empty (lo > hi) where kb is past the grid.
NATTN_HD void square_keys_inverse(const Params& p, const CtaTile& tile, int a, int kb, int& lo, int& hi) {
  const bool c = p.causal[a] != 0;
  const AxisRange first = key_inverse(nattn_min(kb, tile.len[a] - 1), tile.len[a], p.kernel[a], 1, c);
  const AxisRange last = key_inverse(nattn_min(kb + kSquareSide - 1, tile.len[a] - 1), tile.len[a], p.kernel[a], 1, c);
  lo = nattn_max(first.start, tile.lo[a]);
  hi = kb < tile.len[a] ? nattn_min(last.start + last.count - 1, tile.lo[a] + tile.nk[a] - 1) : lo - 1;
}

// A lane's keys and their inverse ranges, and its warp's walk (all clipped to the CTA's
// union, which a query range narrows: the queries outside it add nothing).
struct SquareKeyLane {
  int y_lo[2], y_hi[2];  // each key's inverse query rows (group coordinates, inclusive; empty past the grid)
  int w_lo, w_hi;        // the warp's lines: its square's keys' inverse rows (warp-uniform; empty: none)
  int sx, steps;         // its first query column from the union's, and k16 steps a line (1 or 2; warp-uniform)
  uint32_t cols;         // bit 4 c + 2 j + e: query column tile.lo + sx + 16 c + 8 j + 2 (lane % 4) + e in the key column's inverse
  int rpb_key[2];        // each key's RPB index at query (0, tile.lo + sx): (key + kernel - 1) per axis, row-major, less the column
  int row_mult;
};

template <bool kWide>
NATTN_HD void square_key_lane(const Params& p, const CtaTile& tile, int warp, int lane, SquareKeyLane& s) {
  using KB = SquareDkvBox<kWide>;
  const int g4 = lane / 4, t4 = lane % 4;
  s.row_mult = p.rpb_size[1];
  // the square's first key per axis
  const int k0[2] = {tile.q0[0] + KB::square_row(warp), tile.q0[1] + KB::square_col(warp)};
  int lo[2], hi[2];
  for (int a = 0; a < 2; ++a) square_keys_inverse(p, tile, a, k0[a], lo[a], hi[a]);
  const bool any = hi[0] >= lo[0] && hi[1] >= lo[1];
  s.w_lo = any ? lo[0] : 1;
  s.w_hi = any ? hi[0] : 0;
  s.sx = lo[1] - tile.lo[1];
  s.steps = hi[1] - lo[1] + 1 > 16 ? 2 : 1;
  const int kx = k0[1] + g4 % 4;
  const bool x_ok = kx < tile.len[1];
  const AxisRange ix = key_inverse(nattn_min(kx, tile.len[1] - 1), tile.len[1], p.kernel[1], 1, p.causal[1] != 0);
  s.cols = 0;
  for (int bit = 0; bit < 8; ++bit) {
    const int qx = lo[1] + 16 * (bit / 4) + 8 * ((bit / 2) % 2) + 2 * t4 + bit % 2;
    s.cols |= uint32_t(x_ok && qx >= ix.start && qx < ix.start + ix.count && qx <= hi[1]) << bit;
  }
  for (int r = 0; r < 2; ++r) {
    const int ky = k0[0] + g4 / 4 + 2 * r;
    const bool ok = ky < tile.len[0] && x_ok && any;
    const AxisRange iy = key_inverse(nattn_min(ky, tile.len[0] - 1), tile.len[0], p.kernel[0], 1, p.causal[0] != 0);
    s.y_lo[r] = ok ? nattn_max(iy.start, lo[0]) : 1;
    s.y_hi[r] = ok ? nattn_min(iy.start + iy.count - 1, hi[0]) : 0;
    s.rpb_key[r] = (ky + p.kernel[0] - 1) * s.row_mult + kx + p.kernel[1] - 1 - lo[1];
  }
}

// Score (j, e) of step c of line y: whether it is kept (the line in key e / 2's inverse
// rows, the query column in the key column's), and its RPB index where it is.
NATTN_HD bool square_key_kept(const SquareKeyLane& s, int y, int c, int j, int e) {
  const int r = e / 2;
  return y >= s.y_lo[r] && y <= s.y_hi[r] && ((s.cols >> (4 * c + 2 * j + e % 2)) & 1u);
}
NATTN_HD int square_key_bias(const SquareKeyLane& s, int y, int c, int j, int e, int lane) {
  return s.rpb_key[e / 2] - y * s.row_mult - (16 * c + 8 * j + 2 * (lane % 4) + e % 2);
}

}  }  // namespace nattn::sm90
