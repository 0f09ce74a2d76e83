// Geometry of an ordered KV-parallel dQ (groundwork: no kernel uses it yet; STATUS, known
// gaps item 4). The KV-parallel dQ mode adds each key CTA's dQ part of a query box into an
// fp32 buffer in whatever order the CTAs reach the box, so its sums are not repeatable. A
// fixed order needs two things, both here:
// - one grid of query boxes shared by every key CTA: per axis and dilation group, boxes of
//   CB::extent(a) group coordinates from 0. cta_tile_inverse starts a CTA's walk at its
//   first key's first inverse query instead, so two CTAs' boxes overlap partially
//   (cta_tile_inverse<..., GRID = true> floors the walk onto the grid: at most one more box
//   per axis);
// - each key CTA's rank among the CTAs that add into a box. The key boxes touching query box
//   q along an axis are those between its first query's window start and its last query's
//   window end (windows are monotone), so the CTAs touching q are a product of per-axis
//   intervals; ranked in raster order, axis 0 slowest, they follow blockIdx.x (whose digits
//   are the same per-axis key boxes, last axis fastest). A CTA would wait until the box's
//   counter equals its rank, add, then bump it; a lower rank is a lower blockIdx.x, already
//   resident or done under in-order block dispatch.
// csrc/tests/sm90_ordered_dq_check.cu checks on the CPU that every grid box's adds carry
// the ranks 0 .. count - 1 once each, in blockIdx order (a missing or repeated rank would
// hang the waiting CTAs). Not for calls with a query range.
#pragma once
#include "nattn/sm90/tiles.cuh"

namespace nattn { namespace sm90 {

// Query boxes of the grid per (batch, query head): the counters a call needs per head (the
// key CTAs' grid, num_key_ctas, laid with the query box).
template <class CB>
NATTN_HD int64_t grid_query_boxes(const Params& p) {
  return num_key_ctas<CB>(p);
}

// Where a key CTA (t) adds the query box at `origin` (grid-aligned group coordinates): the
// box's counter among grid_query_boxes' (raster over axes of dilation group x box), the
// CTA's rank among the key CTAs that add into it, and their number.
struct OrderedSlot {
  int64_t box;
  int rank, count;
};
template <int NA, class RB, class CB>
NATTN_HD OrderedSlot ordered_slot(const Params& p, const CtaTile& t, const int* origin) {
  OrderedSlot s{0, 0, 1};
  for (int a = 0; a < NA; ++a) {
    const int e = CB::extent(a), kb = RB::extent(a), d = p.dilation[a];
    const int per = qtiles_per_group(p.spatial[a], d, e);
    s.box = s.box * (int64_t(d) * per) + int64_t(t.g[a]) * per + origin[a] / e;
    const bool c = p.causal[a] != 0;
    const int last = nattn_min(origin[a] + e - 1, t.len[a] - 1);
    const AxisRange first_w = query_window(origin[a], t.len[a], p.kernel[a], p.stride[a], c);
    const AxisRange last_w = query_window(last, t.len[a], p.kernel[a], p.stride[a], c);
    const int lo = first_w.start / kb, n = (last_w.start + last_w.count - 1) / kb - lo + 1;
    s.rank = s.rank * n + t.q0[a] / kb - lo;
    s.count *= n;
  }
  return s;
}

}  }  // namespace nattn::sm90
