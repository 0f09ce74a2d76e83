// Tile geometry of the Hopper (sm90) family: the query box a CTA owns, the key box each
// pipeline stage holds, and where both sit in a [B, *spatial, H, D] tensor.
//
// A CTA serves 128 or 64 queries of one (batch, head, dilation group): a spatial box
// (row-major, last axis fastest). 128-query boxes (large windows) are split in two halves
// along axis 0, one per consumer warpgroup (64 rows: the wgmma M); 64-query boxes (small
// windows) have one consumer warpgroup and several CTAs share an SM. A CTA walks the union
// of its queries' windows in key boxes of 64 to 160 tokens, a shape of their own (a
// kernel-table row is one (query box, key box) pair; the library picks the pair per
// problem, src/api.cu). All coordinates here are in dilation-group coordinates
// (docs/semantics.md): token i of group g sits at g + d * i.
#pragma once
#include "nattn/common/registry.h"
#include "nattn/common/window.cuh"

// Build switch for A/B runs (benchmarks/build_variants.sh): 0 walks each split backward CTA's
// half from its box's walk (seen_steps) instead of its own union's start (narrow_to_half).
#ifndef NATTN_SM90_SPLIT_OWN_WALK
#define NATTN_SM90_SPLIT_OWN_WALK 1
#endif

namespace nattn { namespace sm90 {

constexpr int kQueryRows = 128;  // queries per CTA (64-query boxes: kWgRows)
constexpr int kWgRows = 64;      // queries per consumer warpgroup
// 64-query CTAs read their head's RPB table from shared memory: tables up to this many
// floats (a 2-D window of 32 x 32, a 3-D one of 7 x 9 x 9); larger ones take 128-query pairs.
constexpr int kSmallRpbStageFloats = 4096;

// Whether a tile pair's forward has the split-KV epilogue (box-local fp32 partial rows):
// every pair but the 3-D 64-query ones at head dim 32, whose register budget (three CTAs per
// SM, <= 128 a thread) it spills. The library's default choice skips those for a split call.
NATTN_HD constexpr bool split_kv_built(int qx, int qy, int qz, int head_dim) {
  return !(qx * qy * qz < kQueryRows && qy > 1 && qz > 1 && head_dim <= 32);
}

// A box of X x Y x Z tokens (unused axes 1), rows numbered row-major, last axis fastest.
template <int X, int Y, int Z>
struct Box {
  static constexpr int kSize = X * Y * Z;
  NATTN_HD static constexpr int extent(int a) { return a == 0 ? X : a == 1 ? Y : a == 2 ? Z : 1; }
  NATTN_HD static constexpr int offset(int r, int a) {
    return a == 0 ? r / (Y * Z) : a == 1 ? (r / Z) % Y : r % Z;
  }
};

// One kernel-table row's tiles: the query box (128 tokens, even along axis 0 so that the
// two consumer warpgroups take one half each; or 64 tokens, one consumer warpgroup) and
// the key box (a multiple of 16 tokens up to 160: the wgmma N of S = Q K^T and 16-key
// steps of O += P V; its last used axis holds whole 8-column groups, box_mask.cuh).
// A 64-query pair whose key box is a larger one (8 x 8 queries with 14 x 16 keys, 2 x 4 x 8
// with 8 x 10 x 16) is a strip pair: its key box holds the union of the box's windows (up to
// 7 x 9, 7 x 7 x 9), and its warps compute with mma.sync on their own strips of it
// (forward_strips.cuh). The 8 x 8 query box with a 20 x 20 key box is the square pair: its
// key box holds the union of windows up to 13 x 13, and each warp computes with mma.sync on
// its own 4 x 4 square of queries (forward_squares.cuh; forward only).
template <int QX, int QY, int QZ, int KX, int KY, int KZ>
struct Tile {
  using Q = Box<QX, QY, QZ>;
  using K = Box<KX, KY, KZ>;
  static constexpr int kConsumers = Q::kSize / kWgRows;  // consumer warpgroups
  static constexpr bool kSquares = QX == 8 && QY == 8 && QZ == 1 && KX == 20 && KY == 20 && KZ == 1;
  static constexpr bool kStrips = Q::kSize == kWgRows && QY > 1 && K::kSize > 160 && !kSquares;
  static_assert((Q::kSize == kQueryRows && QX % 2 == 0) || Q::kSize == kWgRows,
                "query boxes are 128 tokens (even along axis 0) or 64");
  static_assert(K::kSize % 16 == 0 && K::kSize >= 64 && (K::kSize <= 160 || kStrips || kSquares),
                "key boxes are 64 to 160 tokens, whole 16s (or a strip or square pair's union)");
};

// The CTA's place: its dilation group, first query and group length per axis, and the
// union of its queries' windows (first key, number of key boxes) per axis.
struct CtaTile {
  int g[3], q0[3], len[3];
  int lo[3], nk[3];
  int tiles;  // key boxes to walk (product of nk)
};

// Query boxes along axis a: per dilation group, enough to cover the longest group.
NATTN_HD int qtiles_per_group(int len, int d, int box) {
  const int longest = d == 1 ? len : (len + d - 1) / d;
  return (longest + box - 1) / box;
}

// Whether axis a of the call has a query range narrower than the axis (Params::q_lo / q_hi:
// a halo rank's own queries; the library checks 0 <= q_lo < q_hi <= the axis length).
NATTN_HD bool axis_has_query_range(const Params& p, int a) { return p.q_lo[a] > 0 || p.q_hi[a] < p.spatial[a]; }

// Whether some axis of the call has one.
NATTN_HD bool has_query_range(const Params& p) {
  for (int a = 0; a < p.na_dim; ++a)
    if (axis_has_query_range(p, a)) return true;
  return false;
}

// The query boxes the forward and the dQ pass launch along axis a, per dilation group: from box `first`,
// `count` of them, those holding queries of the range [q_lo, q_hi) in some group (the
// whole axis: every box, qtiles_per_group). Group coordinates j of the range's queries run
// from q_lo / d (rounded down over the groups) to (q_hi - 1) / d.
struct BoxRange {
  int first, count;
};
NATTN_HD BoxRange query_boxes(const Params& p, int a, int box) {
  const int d = p.dilation[a];
  // every query (the usual call): no division by d when it is 1, which the range's bounds
  // would cost every CTA before its first copy (~3% of a 13x13 2-D forward, measured)
  if (!axis_has_query_range(p, a)) return BoxRange{0, qtiles_per_group(p.spatial[a], d, box)};
  const int first = p.q_lo[a] / d / box, last = (p.q_hi[a] - 1) / d / box;
  return BoxRange{first, last - first + 1};
}

template <class QB>
NATTN_HD int64_t num_cta_tiles(const Params& p) {
  int64_t n = 1;
  for (int a = 0; a < p.na_dim; ++a) n *= int64_t(p.dilation[a]) * query_boxes(p, a, QB::extent(a)).count;
  return n;
}

// Fills Params::qbox_first / qbox_count for query box QB (host, before a launch that decodes
// with cta_tile): the CTAs then read each axis's box range instead of deriving it.
template <class QB>
inline void set_query_boxes(Params& p) {
  for (int a = 0; a < 3; ++a) {
    const BoxRange r = a < p.na_dim ? query_boxes(p, a, QB::extent(a)) : BoxRange{0, 1};
    p.qbox_first[a] = r.first;
    p.qbox_count[a] = r.count;
  }
}

// Decodes a CTA index (< 2^31: 32-bit division; set_query_boxes<QB> filled the box ranges);
// false when the box holds no query (a short dilation group). In 2-D and 3-D axis 0 takes
// what is left of the index (below its dilation x boxes: the grid is their product), and an
// undilated axis has no group to split off, so a 2-D CTA without dilation pays one division,
// not four (each ~20 instructions a thread, before the CTA's first copy; a 64-query CTA of
// a 7x7 window runs ~2000 a warp in all: PERF.md forty-first session).
template <int NA, class QB, class KB>
NATTN_HD bool cta_tile(const Params& p, unsigned index, CtaTile& t) {
  t.tiles = 1;
  for (int a = NA - 1; a >= 0; --a) {
    const unsigned d = unsigned(p.dilation[a]), per = unsigned(p.qbox_count[a]);
    unsigned i = index;
    if (NA == 1 || a > 0) {  // (1-D keeps it: without, ptxas serialized a 1-D kernel's wgmma)
      i = index % (d * per);
      index /= d * per;
    }
    const unsigned group = d == 1 ? 0u : i / per, box = d == 1 ? i : i % per;
    t.g[a] = int(group);
    t.q0[a] = (p.qbox_first[a] + int(box)) * QB::extent(a);
    t.len[a] = group_len(p.spatial[a], t.g[a], int(d));
    if (t.q0[a] >= t.len[a]) return false;
    const bool c = p.causal[a] != 0;
    const int last = nattn_min(t.q0[a] + QB::extent(a) - 1, t.len[a] - 1);
    const AxisRange first_w = query_window(t.q0[a], t.len[a], p.kernel[a], p.stride[a], c);
    const AxisRange last_w = query_window(last, t.len[a], p.kernel[a], p.stride[a], c);
    t.lo[a] = first_w.start;
    const int hi = last_w.start + last_w.count - 1;
    t.nk[a] = (hi - t.lo[a] + KB::extent(a)) / KB::extent(a);
    t.tiles *= t.nk[a];
  }
  return true;
}

// The KV head of query head h (GQA / MQA: groups query heads per KV head); without groups
// no division (~25 instructions a thread in every CTA's setup).
NATTN_HD int kv_head(const Params& p, int h) { return p.groups == 1 ? h : h / p.groups; }

// Clips [lo, hi] (group coordinates of group g along axis a) to the call's query range
// there: group coordinates ceil((q_lo - g) / d) to floor((q_hi - 1 - g) / d) (hi -1: none).
// No divisions without a range.
NATTN_HD void clip_to_query_range(const Params& p, int a, int g, int& lo, int& hi) {
  if (!axis_has_query_range(p, a)) return;
  const int d = p.dilation[a], top = p.q_hi[a] - 1 - g;
  lo = nattn_max(lo, (p.q_lo[a] - g + d - 1) / d);
  hi = nattn_min(hi, top < 0 ? -1 : top / d);
}

// The dK/dV pass's CTAs: every key box of the grid, whatever the query range.
template <class RB>
NATTN_HD int64_t num_key_ctas(const Params& p) {
  int64_t n = 1;
  for (int a = 0; a < p.na_dim; ++a)
    n *= int64_t(p.dilation[a]) * qtiles_per_group(p.spatial[a], p.dilation[a], RB::extent(a));
  return n;
}

// The backward's dK/dV pass: a CTA owns a box of keys (RB, the 128-token box) and walks
// the query boxes (CB) covering the union of its keys' inverse neighbourhoods (the queries
// whose windows hold them). Inverse ranges start and end non-decreasing in the key, so the
// extreme keys bound the union; a CTA whose keys no query sees walks nothing (tiles 0).
// Decodes like cta_tile (q0 is the first key here; the grid is every key box, num_key_ctas);
// lo / nk then count query boxes. Only queries of the query range are walked (a halo rank's
// own; every query by default): the others add nothing (their rows hold LSE +inf, or a zero
// output gradient). GRID: the walk starts on the global query-box grid (the box holding the
// first inverse query: at most one more box per axis), which an ordered KV-parallel dQ needs
// (nattn/sm90/ordered_dq.cuh; no query range).
template <int NA, class RB, class CB, bool GRID = false>
NATTN_HD bool cta_tile_inverse(const Params& p, unsigned index, CtaTile& t) {
  t.tiles = 1;
  for (int a = NA - 1; a >= 0; --a) {
    const int d = p.dilation[a];
    const unsigned per = unsigned(qtiles_per_group(p.spatial[a], d, RB::extent(a)));
    const unsigned i = index % (unsigned(d) * per);
    index /= unsigned(d) * per;
    t.g[a] = int(i / per);
    t.q0[a] = int(i % per) * RB::extent(a);
    t.len[a] = group_len(p.spatial[a], t.g[a], d);
    if (t.q0[a] >= t.len[a]) return false;
    const bool c = p.causal[a] != 0;
    const int last = nattn_min(t.q0[a] + RB::extent(a) - 1, t.len[a] - 1);
    const AxisRange first_inv = key_inverse(t.q0[a], t.len[a], p.kernel[a], p.stride[a], c);
    const AxisRange last_inv = key_inverse(last, t.len[a], p.kernel[a], p.stride[a], c);
    t.lo[a] = first_inv.start;
    int hi = last_inv.start + last_inv.count - 1;
    clip_to_query_range(p, a, t.g[a], t.lo[a], hi);
    if (GRID) t.lo[a] = t.lo[a] / CB::extent(a) * CB::extent(a);
    t.nk[a] = hi >= t.lo[a] ? (hi - t.lo[a] + CB::extent(a)) / CB::extent(a) : 0;
    t.tiles *= t.nk[a];
  }
  return true;
}

// The walk over a CTA's boxes in order (k = 0, 1, ...; in the dK/dV pass: query boxes, once
// per query head of the KV head's group): the current box's first element per axis (group
// coordinates), advanced like an odometer, last axis fastest. Recovering it from k took two
// integer divisions per axis and step (Nsight, flux GNA dQ pass: ~9% of its warps' samples).
template <int NA, class B>
struct BoxWalk {
  int origin[3];
  int pass;  // completed walks over all boxes

  NATTN_HD explicit BoxWalk(const CtaTile& t) : origin{t.lo[0], NA > 1 ? t.lo[1] : 0, NA > 2 ? t.lo[2] : 0}, pass(0) {}

  NATTN_HD void next(const CtaTile& t) {
#pragma unroll
    for (int a = NA - 1; a >= 0; --a) {
      origin[a] += B::extent(a);
      if (origin[a] < t.lo[a] + t.nk[a] * B::extent(a)) return;
      origin[a] = t.lo[a];
    }
    ++pass;
  }
};

// Row `row` of box B whose first element is `first` (group coordinates, per axis): its flat
// token index in [0, N). False for a padding row (past the dilation group's end on an axis:
// edge boxes), whose `token` is then meaningless.
template <int NA, class B>
NATTN_HD bool box_row_token(const Params& p, const CtaTile& t, const int* first, int row, int64_t& token) {
  bool ok = true;
  token = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const int i = first[a] + B::offset(row, a);
    ok = ok && i < t.len[a];
    token = token * p.spatial[a] + t.g[a] + int64_t(p.dilation[a]) * i;
  }
  return ok;
}

// The same row's element offset in a tensor with element strides s (batch, axes 0..2, heads;
// the batch and head parts are the caller's).
template <int NA, class B>
NATTN_HD bool box_row_offset(const Params& p, const CtaTile& t, const int* first, int row, const int64_t* s,
                             int64_t& off) {
  bool ok = true;
  off = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const int i = first[a] + B::offset(row, a);
    ok = ok && i < t.len[a];
    off += (t.g[a] + int64_t(p.dilation[a]) * i) * s[1 + a];
  }
  return ok;
}

// The boxes on the other side that need no mask for one warpgroup's rows of the CTA's box RB
// (its q0 and len): key boxes inside the window of every query row, or (kInverse, the dK/dV
// pass) query boxes inside the inverse neighbourhood of every key row. Windows and inverse
// ranges only grow with the position, so the extreme rows decide. kHalves: two warpgroups
// split the box along axis 0 and warpgroup cw has the half cw. Inclusive bounds per axis.
template <int NA, class RB, bool kInverse, bool kHalves>
__device__ __forceinline__ void unmasked_boxes(const Params& p, const CtaTile& tile, int cw, int* lo, int* hi) {
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    int first = tile.q0[a], last = tile.q0[a] + RB::extent(a) - 1;
    if (kHalves && a == 0) {
      first = tile.q0[0] + cw * (RB::extent(0) / 2);
      last = first + RB::extent(0) / 2 - 1;
    }
    first = nattn_min(first, tile.len[a] - 1);
    last = nattn_min(last, tile.len[a] - 1);
    const AxisRange rf = axis_range<kInverse>(p, a, first, tile.len[a]);
    const AxisRange rl = axis_range<kInverse>(p, a, last, tile.len[a]);
    lo[a] = rl.start;
    hi[a] = rf.start + rf.count - 1;
  }
}

// Where, along axis 0 (group coordinates), what warpgroup cw's half of box RB sees ends
// (half 0) or starts (half 1): the keys in any window of the half's queries, or (kInverse,
// the dK/dV pass) the queries that see any of the half's keys. The halves split RB along axis
// 0, so on the other axes each half sees the CTA's whole walk, and along axis 0 the walk starts
// where half 0's range does and ends where half 1's does (windows and inverse ranges only grow
// with the position): half 0 can miss boxes at the walk's end, half 1 at its start
// (FLUX-sized 2-D windows: 1 of 22 rows of 4-row boxes each, 3-D: 1 of 19 frames).
template <class RB, bool kInverse>
NATTN_HD int unseen_edge(const Params& p, const CtaTile& tile, int cw) {
  const int row = nattn_min(tile.q0[0] + (cw == 0 ? RB::extent(0) / 2 - 1 : RB::extent(0) / 2), tile.len[0] - 1);
  const AxisRange r = axis_range<kInverse>(p, 0, row, tile.len[0]);
  return cw == 0 ? r.start + r.count - 1 : r.start;
}

// The steps [first, last) of a CTA's single walk over boxes B (no passes) that warpgroup cw
// computes; it only releases the others. Axis 0 is the walk's slowest (BoxWalk), so the
// boxes a half does not see form a suffix of the walk (half 0) or a prefix (half 1): with the
// loops' bounds moved, the loop bodies stay as they were (a skip test inside them made the 2-D
// dK/dV pass spill).
template <class RB, class B, bool kInverse>
NATTN_HD void seen_steps(const Params& p, const CtaTile& tile, int cw, int& first, int& last) {
  first = 0;
  last = tile.tiles;
  if (tile.tiles == 0) return;
  const int per_row = tile.tiles / tile.nk[0];                      // boxes per axis-0 row of the walk
  const int d = unseen_edge<RB, kInverse>(p, tile, cw) - tile.lo[0];  // the edge, from the walk's start
  if (cw == 0) last = d < 0 ? 0 : nattn_min(tile.tiles, (d / B::extent(0) + 1) * per_row);
  else first = d < 0 ? 0 : nattn_min(tile.tiles, d / B::extent(0) * per_row);
}

// A split CTA's walk (the backward passes at head dims up to 64: a CTA per half of the box
// along axis 0, DqCta / DkvCta): along axis 0 the half's own union, from where it starts,
// instead of the box's walk less the boxes the half does not see (seen_steps, which then
// finds every step seen). The two agree where the other side's box extent divides the
// half's; with 7-row boxes a 16-row half of a 32x4 box walks a 13-row window's 28-row union
// in four boxes, where from the box's start the second half straddled five.
template <int NA, class RB, class B, bool kInverse>
NATTN_HD void narrow_to_half(const Params& p, CtaTile& t, int half) {
  const int first = t.q0[0] + half * (RB::extent(0) / 2);
  const int last = nattn_min(first + RB::extent(0) / 2 - 1, t.len[0] - 1);
  const AxisRange rf = axis_range<kInverse>(p, 0, first, t.len[0]);
  const AxisRange rl = axis_range<kInverse>(p, 0, last, t.len[0]);
  int lo = rf.start, hi = rl.start + rl.count - 1;
  if (kInverse) clip_to_query_range(p, 0, t.g[0], lo, hi);  // the range's queries only
  int per_row = 1;  // boxes per axis-0 row of the walk
#pragma unroll
  for (int a = 1; a < NA; ++a) per_row *= t.nk[a];
  t.lo[0] = lo;
  t.nk[0] = hi >= lo ? (hi - lo + B::extent(0)) / B::extent(0) : 0;
  t.tiles = t.nk[0] * per_row;
}

}  }  // namespace nattn::sm90
