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

// Parts the dQ pass (backward_dq_squares.cuh) loads before the dO rows, the rest after
// them: those of every square's chunk 0 (key rows up to 4 + 3).
constexpr int kSquareEarlyParts = 2;

// The parts holding walk rows 4 ch .. 4 ch + 3 of a square from key row sy: first and last.
NATTN_HD int square_first_part(int sy, int ch) { return (sy + kStripChunkRows * ch) / kSquarePartRows; }
NATTN_HD int square_last_part(int sy, int ch) { return (sy + kStripChunkRows * ch + kStripChunkRows - 1) / kSquarePartRows; }

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

// A lane's ldmatrix offsets into a 20 x 20 key tile (C, a TileSmem) for each walk-row parity,
// added to the square's first key and a score tile's first key: k_off for K (or V) as the B
// operand of S = Q K^T (n8 tiles of eight keys, 32 channels an x4), t_off for a tile read
// transposed (sixteen keys, 16 channels an x4: V of O += P V, K of dQ += dS K), from t_base
// (the tile's offset from K's). They hold the swizzle of the lane's row at that parity's
// phase (square_phase), less the phase.
template <class C, int HD>
NATTN_HD void square_fragment_offsets(int sy, int sx, int lane, int t_base, int (&k_off)[2][HD / 32],
                                      int (&t_off)[2][HD / 16]) {
#pragma unroll
  for (int odd = 0; odd < 2; ++odd) {
    const int ph = square_phase(sy, sx, odd);
#pragma unroll
    for (int x = 0; x < HD / 32; ++x)
      k_off[odd][x] = C::offset(ph + lane % 8, 8 * (lane / 8) + 32 * x) - ph * C::kRowBytes;
#pragma unroll
    for (int x = 0; x < HD / 16; ++x)
      t_off[odd][x] =
          t_base + C::offset(ph + lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16) + 16 * x) - ph * C::kRowBytes;
  }
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

}  }  // namespace nattn::sm90
