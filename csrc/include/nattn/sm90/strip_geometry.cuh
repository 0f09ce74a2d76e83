// The strip CTA's geometry (forward_strips.cuh), for the device and the host:
// csrc/tests/sm90_strips_check.cu replays it against direct window tests.
//
// A CTA's 8 x 8 query box has four strips of two query rows (warp w: box rows 2 w, 2 w + 1,
// the m16 rows 16 w .. 16 w + 15 of its products). Its key box (14 x 16, loaded once) holds
// the union of the box's windows from tile.lo; a strip's keys are 8 of its rows from the
// strip's first window row (sy) and all 16 columns: score tile j (n8) of walk chunk ch is key
// row kStripChunkRows ch + j / 2, columns 8 (j % 2) ..; a lane's score (j, e) of the m16n8
// accumulator is row e / 2 of its two, column 8 (j % 2) + 2 (lane % 4) + e % 2.
#pragma once
#include <stdint.h>

#include "nattn/common/registry.h"
#include "nattn/common/window.cuh"
#include "nattn/sm90/forward_masks.cuh"
#include "nattn/sm90/tiles.cuh"

namespace nattn { namespace sm90 {

constexpr int kStripChunkRows = 4;  // key rows per softmax step: 64 keys, 32 score registers
constexpr int kStripWalkRows = 8;   // key rows a strip walks at most: 2 query rows + 7 - 1
constexpr int kStripCols = 16;      // key columns (the key box's last axis)

// Whether a (query box, key box) pair is a strip pair (Tile::kStrips in tiles.cuh), from its
// extents (host: the kernel table's rows).
NATTN_HD bool is_strip_pair(int na_dim, const int* qbox, const int* kbox) {
  return na_dim == 2 && qbox[0] * qbox[1] == kWgRows && kbox[0] * kbox[1] > 160;
}

// Why a strip pair (query box qbox, key box kbox) cannot take a problem, or null: its box's
// window union must fit the key box (stride 1, whose windows move one key a query; strided
// windows' unions are wider) and it has no split-KV. prepare_forward and the host's listing
// (sm90_pair_declines) both ask it.
inline const char* strip_declines(const Params& p, const int* qbox, const int* kbox) {
  if (p.kv_splits > 1) return "split-KV (kv_splits > 1) is not built for the strip pairs";
  for (int a = 0; a < 2; ++a) {
    if (p.stride[a] != 1) return "the strip pairs take stride 1 only (strided windows' unions are wider)";
    if (qbox[a] + p.kernel[a] - 1 > kbox[a])
      return "the strip pair takes windows up to 7 x 9 (its queries' union must fit its 14 x 16 key box)";
  }
  return nullptr;
}

// Keys a strip walks per query: whole chunks of key rows (the rows its two query rows'
// windows span, kernel[0] + 1 at most) of kStripCols.
NATTN_HD int strip_walked_keys(const Params& p) {
  return (p.kernel[0] + 1 > kStripChunkRows ? 2 : 1) * kStripChunkRows * kStripCols;
}

// Bits 4 a .. 4 b + 3 (key rows a..b of a walk, four column bits each); none when b < a.
NATTN_HD uint32_t nibble_rows(int a, int b) {
  const uint32_t hi = b >= 7 ? 0xffffffffu : (1u << (4 * b + 4)) - 1u;
  return hi & ~((1u << (4 * a)) - 1u);
}

// A lane's part of its warp's strip: its two query rows (box rows 16 warp + lane / 4 and
// + 8), their windows and validity; the strip's first key row (from the key box's) and walk
// chunks (warp-uniform: 1, or 2 when the strip's windows span more than 4 key rows); one mask
// word per row (bit 4 i + 2 h + e: key row i of the walk, column 8 h + 2 (lane % 4) + e in the
// row's window); the RPB index of the walk's first key row, column 2 (lane % 4) (a key row
// adds the table's row length, rpb_size[1]).
struct StripLane {
  RowWindow row[2];
  bool row_ok[2];
  int sy, chunks;
  uint32_t word[2];
  int bias_at[2];
};

template <class QB>
NATTN_HD void strip_lane(const Params& p, const CtaTile& tile, int warp, int lane, StripLane& s) {
  const int t4 = lane % 4;
  const int rpb_mult[3] = {p.rpb_size[1], 1, 1};
  for (int r = 0; r < 2; ++r) {
    s.row[r].rpb = 0;
    s.row_ok[r] = row_window<2, QB>(p, tile.q0, tile.len, 16 * warp + lane / 4 + 8 * r, rpb_mult, s.row[r]);
  }
  // windows only move forward with the query: row 0's starts the strip, row 1's ends it
  s.sy = s.row[0].lo[0] - tile.lo[0];
  s.chunks = s.row[1].hi[0] - s.row[0].lo[0] + 1 > kStripChunkRows ? 2 : 1;
  const int first = tile.lo[0] + s.sy;
  for (int r = 0; r < 2; ++r) {
    uint32_t cols = 0;
    for (int q = 0; q < 4; ++q) {
      const int kx = tile.lo[1] + 8 * (q / 2) + 2 * t4 + q % 2;
      cols |= uint32_t(kx >= s.row[r].lo[1] && kx <= s.row[r].hi[1]) << q;
    }
    s.word[r] = nibble_rows(s.row[r].lo[0] - first, nattn_min(s.row[r].hi[0] - first, kStripWalkRows - 1)) &
                (cols * 0x11111111u);
    s.bias_at[r] = s.row[r].rpb + first * p.rpb_size[1] + tile.lo[1] + 2 * t4;
  }
}

// The key box row (key row x 16 + column) of the first key of n8 tile j of chunk ch.
NATTN_HD int strip_tile_row(int sy, int ch, int j) {
  return (sy + kStripChunkRows * ch + j / 2) * kStripCols + 8 * (j % 2);
}
// A row's mask word for chunk ch (bit 2 j + e: score (j, e) of the chunk).
NATTN_HD uint32_t strip_chunk_word(uint32_t word, int ch) { return word >> (4 * kStripChunkRows * ch); }
NATTN_HD bool strip_kept(uint32_t chunk_word, int j, int e) { return (chunk_word >> (2 * j + e % 2)) & 1u; }
// Score (j, e)'s RPB index: the row's bias_at, plus the chunk's rows, plus this.
NATTN_HD int strip_bias_offset(int mult0, int j, int e) { return (j / 2) * mult0 + 8 * (j % 2) + e % 2; }
NATTN_HD int strip_chunk_bias(int mult0, int ch) { return kStripChunkRows * ch * mult0; }

}  }  // namespace nattn::sm90
