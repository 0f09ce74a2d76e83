// Tile geometry of the Hopper (sm90) family: the query box a CTA owns, the key box each
// pipeline stage holds, and where both sit in a [B, *spatial, H, D] tensor.
//
// A CTA serves 128 queries of one (batch, head, dilation group): a spatial box (1-D 128,
// 2-D 8x16, 3-D 2x8x8 tokens, row-major, last axis fastest), split in two halves along
// axis 0, one per consumer warpgroup (64 rows: the wgmma M). It walks the union of its
// queries' windows in key boxes of the same 128-token shape. All coordinates here are in
// dilation-group coordinates (docs/semantics.md): token i of group g sits at g + d * i.
#pragma once
#include "nattn/common/registry.h"
#include "nattn/common/window.cuh"

namespace nattn { namespace sm90 {

constexpr int kTileRows = 128;  // queries per CTA (and keys per stage)
constexpr int kWgRows = 64;     // queries per consumer warpgroup

// Box extent along axis a (unused axes 1); Q and K boxes have the same shape.
template <int NA>
NATTN_HD constexpr int box_extent(int a) {
  return NA == 1 ? (a == 0 ? 128 : 1)
       : NA == 2 ? (a == 0 ? 8 : a == 1 ? 16 : 1)
                 : (a == 0 ? 2 : a == 1 ? 8 : a == 2 ? 8 : 1);
}

// Offset of row r of a box along axis a (row-major, last axis fastest).
template <int NA>
NATTN_HD constexpr int box_offset(int r, int a) {
  return a == NA - 1 ? r % box_extent<NA>(a)
       : a == 0      ? r / (box_extent<NA>(1) * box_extent<NA>(2))
                     : (r / box_extent<NA>(2)) % box_extent<NA>(1);  // axis 1 of a 3-D box
}

// The CTA's place: its dilation group, first query and group length per axis, and the
// union of its queries' windows (first key, number of key boxes) per axis.
struct CtaTile {
  int g[3], q0[3], len[3];
  int lo[3], nk[3];
  int tiles;  // key boxes to walk (product of nk)
};

// Query boxes along axis a: per dilation group, enough to cover the longest group.
NATTN_HD int qtiles_per_group(int len, int d, int box) {
  const int longest = (len + d - 1) / d;
  return (longest + box - 1) / box;
}

NATTN_HD int64_t num_cta_tiles(const Params& p, const int* box) {
  int64_t n = 1;
  for (int a = 0; a < p.na_dim; ++a)
    n *= int64_t(p.dilation[a]) * qtiles_per_group(p.spatial[a], p.dilation[a], box[a]);
  return n;
}

// Decodes a CTA index; false when the box holds no query (a short dilation group).
template <int NA>
NATTN_HD bool cta_tile(const Params& p, int64_t index, CtaTile& t) {
  t.tiles = 1;
  for (int a = NA - 1; a >= 0; --a) {
    const int d = p.dilation[a], per = qtiles_per_group(p.spatial[a], d, box_extent<NA>(a));
    const int i = int(index % (int64_t(d) * per));
    index /= int64_t(d) * per;
    t.g[a] = i / per;
    t.q0[a] = (i % per) * box_extent<NA>(a);
    t.len[a] = group_len(p.spatial[a], t.g[a], d);
    if (t.q0[a] >= t.len[a]) return false;
    const bool c = p.causal[a] != 0;
    const int last = nattn_min(t.q0[a] + box_extent<NA>(a) - 1, t.len[a] - 1);
    const AxisRange first_w = query_window(t.q0[a], t.len[a], p.kernel[a], p.stride[a], c);
    const AxisRange last_w = query_window(last, t.len[a], p.kernel[a], p.stride[a], c);
    t.lo[a] = first_w.start;
    const int hi = last_w.start + last_w.count - 1;
    t.nk[a] = (hi - t.lo[a] + box_extent<NA>(a)) / box_extent<NA>(a);
    t.tiles *= t.nk[a];
  }
  return true;
}

// First key (group coordinates) of key box `k` along each axis.
template <int NA>
NATTN_HD void key_origin(const CtaTile& t, int k, int* origin) {
  for (int a = NA - 1; a >= 0; --a) {
    origin[a] = t.lo[a] + (k % t.nk[a]) * box_extent<NA>(a);
    k /= t.nk[a];
  }
}

}  }  // namespace nattn::sm90
