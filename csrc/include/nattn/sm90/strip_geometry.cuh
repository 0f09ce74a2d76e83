// The strip CTA's geometry (forward_strips.cuh), for the device and the host:
// csrc/tests/sm90_strips_check.cu replays it against direct window tests.
//
// A CTA's 64-query box (2-D: 8 x 8; 3-D: 2 x 4 x 8) has four strips of two query rows x 8
// columns (warp w: the m16 rows 16 w .. 16 w + 15 of its products, box rows 2 w and 2 w + 1
// in 2-D; in 3-D frame w / 2, rows 2 (w % 2) and + 1). The rows are axis NA - 2, the columns
// axis NA - 1 and, in 3-D, the frames axis 0. Its key box holds the union of the box's
// windows from tile.lo (2-D: 14 x 16, loaded once; 3-D: one frame of 10 x 16 a ring slot,
// frame after frame). A strip walks the key rows from its first window row (sy), 8 at most,
// and all 16 columns (in 3-D in each frame of its window): score tile j (n8) of walk chunk ch
// is key row kStripChunkRows ch + j / 2, columns 8 (j % 2) ..; a lane's score (j, e) of the
// m16n8 accumulator is row e / 2 of its two, column 8 (j % 2) + 2 (lane % 4) + e % 2.
#pragma once
#include <stdint.h>

#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/registry.h"
#include "nattn/common/window.cuh"
#include "nattn/sm90/forward_masks.cuh"
#include "nattn/sm90/tiles.cuh"

namespace nattn { namespace sm90 {

constexpr int kStripChunkRows = 4;  // key rows per softmax step: 64 keys, 32 score registers
constexpr int kStripWalkRows = 8;   // key rows a strip walks at most: 2 query rows + 7 - 1
constexpr int kStripCols = 16;      // key columns (the key box's last axis)
constexpr int kStripSlabRows = 10;  // 3-D: a frame's rows of the union (4 query rows + 7 - 1)

// Whether a (query box, key box) pair is a strip pair (Tile::kStrips in tiles.cuh), from its
// extents (host: the kernel table's rows): 64 queries, 2-D or 3-D, a key box above 160 keys
// (the union's extents, which the key boxes of the other pairs never are) of kStripCols
// columns (the square pair's, square_geometry.cuh, has 20).
NATTN_HD bool is_strip_pair(int na_dim, const int* qbox, const int* kbox) {
  return na_dim >= 2 && qbox[0] * qbox[1] * (na_dim > 2 ? qbox[2] : 1) == kWgRows &&
         kbox[0] * kbox[1] * (na_dim > 2 ? kbox[2] : 1) > 160 && kbox[na_dim - 1] == kStripCols;
}

// Why a strip pair (query box qbox, key box kbox) cannot take a problem, or null: its box's
// window union must fit the key box (stride 1, whose windows move one key a query; strided
// windows' unions are wider) and it has no split-KV. prepare_forward and the host's listing
// (sm90_pair_declines) both ask it.
inline const char* strip_declines(const Params& p, const int* qbox, const int* kbox) {
  if (p.kv_splits > 1) return "split-KV (kv_splits > 1) is not built for the strip pairs";
  for (int a = 0; a < p.na_dim; ++a) {
    if (p.stride[a] != 1) return "the strip pairs take stride 1 only (strided windows' unions are wider)";
    if (qbox[a] + p.kernel[a] - 1 > kbox[a])
      return p.na_dim == 2 ? "the strip pair takes windows up to 7 x 9 (its queries' union must fit its 14 x 16 key box)"
                           : "the strip pair takes windows up to 7 x 7 x 9 (its queries' union must fit its 8 x 10 x 16 "
                             "key box)";
  }
  return nullptr;
}

// The box of a strip pair's key and value tensor maps, from its key box (kbox, in place):
// 3-D copies the union a frame at a time (forward_strips.cuh's ring), 2-D in one piece.
NATTN_HD void strip_key_map_box(int na_dim, int* kbox) {
  if (na_dim == 3) kbox[0] = 1;
}

// Keys a strip walks per query: whole chunks of key rows (the rows its two query rows'
// windows span, kernel + 1 at most, of kStripCols) in each frame of its window.
NATTN_HD int strip_walked_keys(const Params& p) {
  const int rows = p.kernel[p.na_dim - 2] + 1 > kStripChunkRows ? 2 * kStripChunkRows : kStripChunkRows;
  return (p.na_dim > 2 ? p.kernel[0] : 1) * rows * kStripCols;
}

// Bits 4 a .. 4 b + 3 (key rows a..b of a walk, four column bits each) of a W word (8 rows
// in 32 bits, 16 in 64: the square walks'); none when b < a.
template <typename W = uint32_t>
NATTN_HD W nibble_rows(int a, int b) {
  constexpr int kRows = 2 * int(sizeof(W));
  const W hi = b >= kRows - 1 ? ~W(0) : (W(1) << (4 * b + 4)) - W(1);
  return hi & ~((W(1) << (4 * a)) - W(1));
}

// A lane's part of its warp's strip: its two query rows (box rows 16 warp + lane / 4 and
// + 8), their windows and validity; the strip's first key row (from the key box's) and walk
// chunks per frame (warp-uniform: 1, or 2 when the strip's windows span more than 4 key
// rows); in 3-D its first frame (from the key box's) and frame count (the window's: both rows
// are in one frame); one mask word per row (bit 4 i + 2 h + e: key row i of the walk, column
// 8 h + 2 (lane % 4) + e in the row's window); the RPB index of the walk's first frame and
// key row, column 2 (lane % 4) (a key row adds row_mult, a frame frame_mult).
struct StripLane {
  RowWindow row[2];
  bool row_ok[2];
  int sy, chunks;
  int ft, frames;
  uint32_t word[2];
  int bias_at[2];
  int row_mult, frame_mult;
};

template <int NA, class QB>
NATTN_HD void strip_lane(const Params& p, const CtaTile& tile, int warp, int lane, StripLane& s) {
  constexpr int R = NA - 2, C = NA - 1;  // the rows' and the columns' axes
  const int t4 = lane % 4;
  int rpb_mult[3] = {1, 1, 1};
  for (int a = NA - 2; a >= 0; --a) rpb_mult[a] = rpb_mult[a + 1] * p.rpb_size[a + 1];
  s.row_mult = rpb_mult[R];
  s.frame_mult = NA > 2 ? rpb_mult[0] : 0;
  for (int r = 0; r < 2; ++r) {
    s.row[r].rpb = 0;
    s.row_ok[r] = row_window<NA, QB>(p, tile.q0, tile.len, 16 * warp + lane / 4 + 8 * r, rpb_mult, s.row[r]);
  }
  // windows only move forward with the query: row 0's starts the strip, row 1's ends it
  s.sy = s.row[0].lo[R] - tile.lo[R];
  s.chunks = s.row[1].hi[R] - s.row[0].lo[R] + 1 > kStripChunkRows ? 2 : 1;
  s.ft = NA > 2 ? s.row[0].lo[0] - tile.lo[0] : 0;
  s.frames = NA > 2 ? s.row[0].hi[0] - s.row[0].lo[0] + 1 : 1;
  const int first = tile.lo[R] + s.sy;
  for (int r = 0; r < 2; ++r) {
    uint32_t cols = 0;
    for (int q = 0; q < 4; ++q) {
      const int kx = tile.lo[C] + 8 * (q / 2) + 2 * t4 + q % 2;
      cols |= uint32_t(kx >= s.row[r].lo[C] && kx <= s.row[r].hi[C]) << q;
    }
    s.word[r] = nibble_rows(s.row[r].lo[R] - first, nattn_min(s.row[r].hi[R] - first, kStripWalkRows - 1)) &
                (cols * 0x11111111u);
    s.bias_at[r] = s.row[r].rpb + first * s.row_mult + tile.lo[C] + 2 * t4 +
                   (NA > 2 ? (tile.lo[0] + s.ft) * s.frame_mult : 0);
  }
}

// The key box row (key row x 16 + column, within a frame in 3-D) of the first key of n8 tile
// j of chunk ch.
NATTN_HD int strip_tile_row(int sy, int ch, int j) {
  return (sy + kStripChunkRows * ch + j / 2) * kStripCols + 8 * (j % 2);
}
// A row's mask word for chunk ch (bit 2 j + e: score (j, e) of the chunk).
NATTN_HD uint32_t strip_chunk_word(uint32_t word, int ch) { return word >> (4 * kStripChunkRows * ch); }
NATTN_HD bool strip_kept(uint32_t chunk_word, int j, int e) { return (chunk_word >> (2 * j + e % 2)) & 1u; }
// Score (j, e)'s RPB index: the row's bias_at, plus the frame's and the chunk's rows, plus this.
NATTN_HD int strip_bias_offset(int row_mult, int j, int e) { return (j / 2) * row_mult + 8 * (j % 2) + e % 2; }
NATTN_HD int strip_chunk_bias(int row_mult, int ch) { return kStripChunkRows * ch * row_mult; }

// Narrow walks. Where the windows of every row of a warp lie in the first 8 of the key box's
// 16 columns (the columns axis' grid or dilation group at most 8 long: DiNAT's dilated
// layers, whose windows are their whole 7 x 7 groups, or a 7 x 7 grid), the warp skips the
// other 8: one step over its 8 key rows whose score tile j is the wide walk's tile 2 j of
// chunk 0 (key row j, columns 0..7; the functions above with j -> 2 j), and whose P V step i
// pairs key rows 2 i and 2 i + 1 (the V fragments' second eight keys 16 box rows on, not 8).
// Half the scores and products of the wide walk's two chunks. Warp-uniform: every lane's
// words have no bit of columns 8..15.
constexpr uint32_t kStripRightColumns = 0xccccccccu;  // a mask word's bits of columns 8..15
NATTN_HD bool strip_lane_narrow(const StripLane& s) { return ((s.word[0] | s.word[1]) & kStripRightColumns) == 0; }
// Whether every warp of every CTA walks narrow: the columns axis' groups (the grid's, at
// dilation d: ceil(length / d) tokens) are at most 8 long, so the 8 query columns of a box
// are the whole group and their windows lie in its 8 columns from the union's first.
NATTN_HD bool strip_problem_narrow(const Params& p) {
  const int c = p.na_dim - 1;
  return (p.spatial[c] + p.dilation[c] - 1) / p.dilation[c] <= 8;
}

// ------------------------------------------------------------------ the strip dK/dV pass
// (backward_dkv_strips.cuh) A CTA owns a 64-key box of one (batch, KV head, dilation group)
// of 8 x 8 keys (StripDkvKeyBox: in 3-D one frame of them, so that its four warps need the
// same query frames and none idles at the per-slab barrier; a 2 x 4 x 8 box's two warp pairs
// needed 5 of its union's 6 frames each: 12% of the pass's stall samples on video-3d, PERF.md
// forty-fourth session), and walks the union of its keys' inverse neighbourhoods (the
// queries whose windows hold them: key_inverse, per axis) in lines of 16 query columns, one
// k16 step of dV += P^T dO and dK += dS^T Q. Warp w owns the box rows 16 w .. 16 w + 15 (key
// rows 2 w and 2 w + 1 of 8 columns), the m16 rows of its products; a lane's accumulator rows
// lane / 4 and + 8 are the keys (row 0 or 1 of the strip, column lane / 4). The union is
// copied in slabs of its rows (up to kStripDkvRows: 8 key rows' inverse ranges under windows
// up to 7 rows, wider at the grid's borders, where windows shift inward), a frame of them at
// a time in 3-D, each 16 columns wide from the union's first column, and once more 16 columns
// on when the union is wider (up to 24 columns: 8 key columns, windows up to 9). A warp walks
// the lines of its keys' rows (in 3-D in each of the key frame's inverse frames); a score's
// mask is separable: the line's row in the key's inverse rows and the query column in the
// lane's key column's inverse columns.
constexpr int kStripDkvRows = 17;
constexpr int kStripDkvPasses = 2;  // column passes of kStripCols

// The dK/dV pass's key box: 8 x 8 keys of one frame.
template <int NA>
using StripDkvKeyBox = typename std::conditional<NA == 3, Box<1, 8, 8>, Box<8, 8, 1>>::type;

struct StripKeyLane {
  int y_lo[2], y_hi[2];  // each key's inverse query rows, group coordinates, inclusive (empty: a key past the grid)
  int w_lo, w_hi;        // the warp's lines: the union of its keys' rows (warp-uniform)
  int t_lo, t_hi;        // 3-D: the warp's key frame's inverse frames (warp-uniform; 2-D: 0, 0)
  uint32_t cols;         // bit 4 cp + 2 j + e: query column lo + 16 cp + 8 j + 2 (lane % 4) + e in the key column's inverse
  int rpb_key[2];        // each key's RPB part: the sum over axes of (key + kernel - 1) x mult
  int row_mult, frame_mult;
};

// A lane's keys and their inverse ranges, for the CTA's key box at tile.q0 (cta_tile_inverse
// with unit query boxes: tile.lo is the union's first query per axis).
template <int NA, class KB>
NATTN_HD void strip_key_lane(const Params& p, const CtaTile& tile, int warp, int lane, StripKeyLane& s) {
  constexpr int R = NA - 2, C = NA - 1;
  int mult[3] = {1, 1, 1};
  for (int a = NA - 2; a >= 0; --a) mult[a] = mult[a + 1] * p.rpb_size[a + 1];
  s.row_mult = mult[R];
  s.frame_mult = NA > 2 ? mult[0] : 0;
  const int kx = tile.q0[C] + lane / 4;
  const bool x_ok = kx < tile.len[C];
  const AxisRange ix = key_inverse(nattn_min(kx, tile.len[C] - 1), tile.len[C], p.kernel[C], 1, p.causal[C] != 0);
  s.cols = 0;
  for (int b = 0; b < 4 * kStripDkvPasses; ++b) {
    const int qx = tile.lo[C] + kStripCols * (b / 4) + 8 * ((b / 2) % 2) + 2 * (lane % 4) + b % 2;
    s.cols |= uint32_t(x_ok && qx >= ix.start && qx < ix.start + ix.count) << b;
  }
  bool t_ok = true;
  int kt = 0;
  s.t_lo = 0;
  s.t_hi = 0;
  if (NA == 3) {
    kt = tile.q0[0] + KB::offset(16 * warp, 0);
    t_ok = kt < tile.len[0];
    const AxisRange it = key_inverse(nattn_min(kt, tile.len[0] - 1), tile.len[0], p.kernel[0], 1, p.causal[0] != 0);
    s.t_lo = t_ok ? it.start : 1;
    s.t_hi = t_ok ? it.start + it.count - 1 : 0;
  }
  s.w_lo = 1 << 30;
  s.w_hi = -1;
  for (int r = 0; r < 2; ++r) {
    const int ky = tile.q0[R] + KB::offset(16 * warp + 8 * r, R);
    const bool ok = ky < tile.len[R] && t_ok;
    const AxisRange iy = key_inverse(nattn_min(ky, tile.len[R] - 1), tile.len[R], p.kernel[R], 1, p.causal[R] != 0);
    s.y_lo[r] = ok ? iy.start : 1;
    s.y_hi[r] = ok ? iy.start + iy.count - 1 : 0;
    if (ok) {
      s.w_lo = nattn_min(s.w_lo, s.y_lo[r]);
      s.w_hi = nattn_max(s.w_hi, s.y_hi[r]);
    }
    s.rpb_key[r] = (ky + p.kernel[R] - 1) * mult[R] + (kx + p.kernel[C] - 1) +
                   (NA > 2 ? (kt + p.kernel[0] - 1) * mult[0] : 0);
  }
}

// The flat token (row-major over the grid, real coordinates) of query (t, y, x) of the CTA's
// dilation group (group coordinates; 2-D: t unused): the LSE / delta row the slabs stage.
template <int NA>
NATTN_HD int strip_query_token(const Params& p, const CtaTile& tile, int t, int y, int x) {
  constexpr int R = NA - 2, C = NA - 1;
  int tok = (tile.g[R] + p.dilation[R] * y) * p.spatial[C] + tile.g[C] + p.dilation[C] * x;
  if (NA == 3) tok += (tile.g[0] + p.dilation[0] * t) * p.spatial[1] * p.spatial[2];
  return tok;
}

// Whether the lane's keys walk narrow in the dK/dV pass: their inverse columns all lie in the
// first 8 of the first column pass (where every lane of a warp does, its k16 steps pair two
// lines' first 8 columns instead of one line's 16: backward_dkv_strips.cuh). Every lane does
// wherever the columns axis' groups are at most 8 long (strip_problem_narrow).
NATTN_HD bool strip_key_lane_narrow(const StripKeyLane& s) { return (s.cols & ~0x3u) == 0u; }

// Whether score (j, e) of a lane's line (query row y, column pass cp) is kept: the line's row
// is in key e / 2's inverse rows and the query column in its column's (the frame is the
// slab's: in the warp's inverse frames, which the walk checks).
NATTN_HD bool strip_key_kept(const StripKeyLane& s, int y, int cp, int j, int e) {
  const int r = e / 2;
  return y >= s.y_lo[r] && y <= s.y_hi[r] && ((s.cols >> (4 * cp + 2 * j + e % 2)) & 1u);
}

// Its RPB index (where kept): per axis key - query + kernel - 1, row-major.
NATTN_HD int strip_key_bias(const StripKeyLane& s, const CtaTile& tile, int na_dim, int t, int y, int cp, int j,
                            int e, int lane) {
  const int qx = tile.lo[na_dim - 1] + kStripCols * cp + 8 * j + 2 * (lane % 4) + e % 2;
  return s.rpb_key[e / 2] - qx - y * s.row_mult - t * s.frame_mult;
}

// The strip dK/dV pass's RPB and fixed-point dRPB tables in the guard form: between guards of
// kStripDkvGuard entries, so that a masked score reads its bias and adds its (zero) term at
// its own index, without the selects of the sink form (a select and an LEA per score for the
// read, the kept-or-sink select for the add: ~45 of the fixed-point step's 197 instructions
// at 2-D D32; 169 in the guard form). H100, with an RPB, forward + backward: 2-D (batch 128,
// D32) 3.5-5% faster on undilated 7x7 layers, ~1% on dilated ones; 3-D (video-3d, D64)
// 1.2-2% faster since the pass is two kernels (kRpb; before that split it was 2.6-4% slower
// there). Build switch for A/B runs: NATTN_SM90_STRIP_DKV_GUARD=0 the sink form, 1 (the
// default) the guard form.
#ifndef NATTN_SM90_STRIP_DKV_GUARD
#define NATTN_SM90_STRIP_DKV_GUARD 1
#endif
constexpr bool kStripDkvGuarded = NATTN_SM90_STRIP_DKV_GUARD != 0;
// A masked score's index lies at most 36 entries before its head's table and 24 past it
// (csrc/tests/sm90_strips_dkv_check.cu asserts this bound over the wide and narrow walks).
constexpr int kStripDkvGuard = 64;
// What precedes the RPB tables and, again, the dRPB tables (StripDrpbLayout): a guard in the
// guard form, nothing in the sink form.
constexpr int kStripDrpbLead = kStripDkvGuarded ? kStripDkvGuard : 0;

// The strip dK/dV pass's RPB tables and fixed-point dRPB tables in shared memory (`entries`:
// the query heads' entries of the KV head): kStripDrpbLead floats, the RPB tables,
// kStripDrpbLead ints, the dRPB tables, then the sink of the masked scores' adds (a lane
// adds every score it walks, without a branch: common/drpb_fixed.cuh) or, in the guard
// form, a guard. The adds of one step fall on the table's diagonals (key
// column g4 against query column 2 t4: up to four lanes on one address, which the atomic unit
// serialises), so where they fit in kStripDrpbCopyBytes there are four copies, one per t4,
// `stride` ints apart with stride = 10 mod 32: a warp's 32 adds then fall in 32 distinct banks
// (csrc/tests/sm90_strips_dkv_check.cu checks it). The flush sums the copies.
struct StripDrpbLayout {
  int copies, stride;
  int bytes;  // the whole part: both tables and what surrounds them
};
constexpr int kStripDrpbCopyBytes = 4096;
constexpr int kStripDrpbTailBytes = kStripDkvGuarded ? 4 * kStripDkvGuard : kDrpbSinkBytes;
NATTN_HD StripDrpbLayout strip_drpb_layout(int entries) {
  StripDrpbLayout l;
  const int banked = entries <= 10 ? 10 : (entries - 10 + 31) / 32 * 32 + 10;
  l.copies = 4 * banked * 4 <= kStripDrpbCopyBytes ? 4 : 1;
  l.stride = l.copies == 4 ? banked : entries;
  l.bytes = 4 * (2 * kStripDrpbLead + entries + l.copies * l.stride) + kStripDrpbTailBytes;
  return l;
}
// The most shared memory the part takes (up to kSmallRpbStageFloats entries; copies only
// below kStripDrpbCopyBytes).
constexpr int kStripDrpbMostBytes =
    8 * kSmallRpbStageFloats + kStripDrpbCopyBytes + 8 * kStripDrpbLead + kStripDrpbTailBytes;

}  }  // namespace nattn::sm90
