// Host-side check of the Hopper family's tensor maps (runs on the CPU, no GPU): for random
// [B, *spatial, H, D] tensors in every layout the API accepts (heads-last, q/k/v sliced from
// one projection, heads-first [B, H, *spatial, D] viewed heads-last, one batch entry,
// spatial axes stored in reverse), map_spec either declines with a reason or describes a
// map in which the coordinates the kernels issue (head_coords, then a box's spatial origin)
// address exactly the element the tensor's strides give, with every box inside the map's
// dims. The copy engine computes a box element's address as the sum of its coordinates times
// the map's byte strides (the innermost stride being the element size); this replays that
// sum. Layouts the maps cannot express (heads-first slices of a [B, 3, H, *spatial, D]
// buffer) must be declined, not mis-addressed.
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>
#include <stdlib.h>

#include "nattn/sm90/tensor_map_spec.h"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x13198a2e03707344ull
#include "host_rng.h"

enum Layout { kHeadsLast, kFused, kHeadsFirst, kReversed, kStackedHeadsFirst, kLayouts };
static const char* kLayoutNames[] = {"heads-last", "fused", "heads-first", "axes-reversed", "stacked heads-first"};

// Element strides (batch, axes 0..2, heads) of a layout, as nattn's Python passes them
// (0 for size-1 and absent axes).
static void strides_of(const Params& p, Layout layout, int heads, int hd, int64_t* s) {
  const int nd = p.na_dim;
  int64_t sp[3] = {0, 0, 0};
  int64_t row = 0, head = 0, batch = 0;
  switch (layout) {
    case kHeadsLast:
    case kFused: {  // fused: a token's row holds q, k and v of every head (3 H D wide)
      row = int64_t(heads) * hd * (layout == kFused ? 3 : 1);
      int64_t st = row;
      for (int a = nd - 1; a >= 0; --a) { sp[a] = st; st *= p.spatial[a]; }
      head = hd;
      batch = st;
      break;
    }
    case kReversed: {  // [B, *reversed(spatial), H, D] viewed in order
      int64_t st = int64_t(heads) * hd;
      for (int a = 0; a < nd; ++a) { sp[a] = st; st *= p.spatial[a]; }
      head = hd;
      batch = st;
      break;
    }
    case kHeadsFirst:
    case kStackedHeadsFirst: {  // [B, (3,) H, *spatial, D]: q is the first of the stack
      int64_t st = hd;
      for (int a = nd - 1; a >= 0; --a) { sp[a] = st; st *= p.spatial[a]; }
      head = st;
      batch = st * heads * (layout == kStackedHeadsFirst ? 3 : 1);
      break;
    }
    default: break;
  }
  s[0] = p.batch > 1 ? batch : 0;
  for (int a = 0; a < 3; ++a) s[1 + a] = a < nd && p.spatial[a] > 1 ? sp[a] : 0;
  s[4] = heads > 1 ? head : 0;
}

static int fail(const char* what, const Params& p, Layout layout, int heads, int hd) {
  printf("FAIL %s: %s, na_dim %d, batch %d, heads %d, head dim %d, spatial %d %d %d, dilation %d %d %d\n", what,
         kLayoutNames[layout], p.na_dim, p.batch, heads, hd, p.spatial[0], p.spatial[1], p.spatial[2],
         p.dilation[0], p.dilation[1], p.dilation[2]);
  return 1;
}

template <int HD>
static int check_one(Params p, Layout layout, int heads, long long& checks) {
  int64_t s[5];
  strides_of(p, layout, heads, HD, s);
  int box[3] = {1, 1, 1};
  for (int a = 0; a < p.na_dim; ++a) box[a] = 1 << rnd(0, 3);
  MapSpec m;
  const char* why = map_spec(p, s, heads, HD, box, m);
  const bool expressible = !(layout == kStackedHeadsFirst && p.batch > 1 && heads > 1 && s[4] != HD);
  if (!expressible) return why ? 0 : fail("an inexpressible layout was accepted", p, layout, heads, HD);
  if (why) {
    printf("FAIL declined (%s)\n", why);
    return fail("an expressible layout was declined", p, layout, heads, HD);
  }
  if (m.rank != p.na_dim + 2) return fail("rank", p, layout, heads, HD);
  p.map_heads_outer = m.heads_outer ? kRowsQ : 0;
  for (int trial = 0; trial < 64; ++trial) {
    const int b = rnd(0, p.batch - 1), h = rnd(0, heads - 1);
    const int cb = rnd(0, HD / int(m.box[0]) - 1);
    int first[3];  // a box's first token (real coordinates)
    for (int a = 0; a < p.na_dim; ++a) first[a] = rnd(0, p.spatial[a] - 1);
    const HeadCoords hc = head_coords<HD>(p, kRowsQ, heads, h, b);
    int c[5];
    c[0] = hc.channel + cb * int(m.box[0]);
    for (int a = 0; a < p.na_dim; ++a) c[p.na_dim - a] = first[a];
    c[p.na_dim + 1] = hc.outer;
    // The copy engine's address of the box's first element, and the tensor's.
    uint64_t at = uint64_t(c[0]) * 2;
    for (int i = 1; i < m.rank; ++i) at += uint64_t(c[i]) * m.stride_bytes[i - 1];
    int64_t want = int64_t(b) * s[0] + int64_t(h) * s[4] + cb * int64_t(m.box[0]);
    for (int a = 0; a < p.na_dim; ++a) want += int64_t(first[a]) * s[1 + a];
    if (at != uint64_t(want) * 2) return fail("address", p, layout, heads, HD);
    // Inside the map: the channel box within its head's channels, the outer coordinate
    // within the map's outer extent.
    if (c[0] + m.box[0] > m.dim[0] || (m.heads_outer && m.box[0] > uint64_t(HD)))
      return fail("channel box outside the map", p, layout, heads, HD);
    if (uint64_t(c[m.rank - 1]) >= m.dim[m.rank - 1]) return fail("outer coordinate outside the map", p, layout, heads, HD);
    // Steps along each axis: the next element of a box on spatial axis a (one dilation
    // group step) and the next channel move by the tensor's own strides.
    for (int a = 0; a < p.na_dim; ++a)
      if (p.spatial[a] > 1 && m.stride_bytes[p.na_dim - a - 1] * m.element_stride[p.na_dim - a] !=
                                  uint64_t(s[1 + a] * p.dilation[a]) * 2)
        return fail("spatial step", p, layout, heads, HD);
    ++checks;
  }
  return 0;
}

// Boxes whose axis-0 extent times the dilation is above the copy engine's 256 elements (1-D
// boxes of 64 and 128 tokens from dilation 3): the map's box is one piece, every piece fits,
// and the pieces tma_load_box copies (box_piece) put each of the box's rows at its token
// (first + row * dilation), each row once. Without pieces (the bulk reductions) such a box
// is declined.
static int check_pieces(long long& checks) {
  const int extents[] = {8, 16, 32, 64, 128};
  for (int extent : extents)
    for (int d = 1; d <= 8; ++d) {
      Params p = {};
      p.na_dim = 1;
      p.batch = 2;
      p.spatial[0] = 4000;
      p.spatial[1] = p.spatial[2] = 1;
      p.dilation[0] = d;
      p.dilation[1] = p.dilation[2] = 1;
      int64_t s[5] = {int64_t(4000) * 128, 128, 0, 0, 64};
      const int box[3] = {extent, 1, 1};
      MapSpec m;
      if (const char* why = map_spec(p, s, 2, 64, box, m)) {
        printf("FAIL extent %d dilation %d declined (%s)\n", extent, d, why);
        return 1;
      }
      const int n = box_pieces(extent, d), per = int(m.box[1]) / d;
      if (m.box[1] > uint32_t(kMaxBoxElements) || m.element_stride[1] != uint32_t(d) || int(m.box[1]) % d ||
          per * n != extent) {
        printf("FAIL extent %d dilation %d: map box %u, %d pieces\n", extent, d, m.box[1], n);
        return 1;
      }
      bool seen[128] = {};
      for (int j = 0; j < n; ++j) {
        const BoxPiece piece = box_piece(extent, d, j);
        for (int r = 0; r < per; ++r) {
          const int row = piece.step + r;
          if (row >= extent || seen[row] || piece.offset + r * d != row * d) {
            printf("FAIL extent %d dilation %d: piece %d row %d\n", extent, d, j, r);
            return 1;
          }
          seen[row] = true;
          ++checks;
        }
      }
      for (int row = 0; row < extent; ++row)
        if (!seen[row]) {
          printf("FAIL extent %d dilation %d: row %d not copied\n", extent, d, row);
          return 1;
        }
      const bool whole_fits = extent * d <= kMaxBoxElements;
      if (!map_spec(p, s, 2, 64, box, m, 2, 0, false) != whole_fits || (whole_fits && n != 1)) {
        printf("FAIL extent %d dilation %d: one box without pieces\n", extent, d);
        return 1;
      }
    }
  return 0;
}

int main() {
  long long checks = 0;
  if (check_pieces(checks)) return 1;
  for (int n = 0; n < 4000; ++n) {
    Params p = {};
    p.na_dim = rnd(1, 3);
    p.batch = rnd(1, 3);
    for (int a = 0; a < 3; ++a) p.spatial[a] = p.dilation[a] = 1;
    for (int a = 0; a < p.na_dim; ++a) {
      p.spatial[a] = rnd(1, p.na_dim == 1 ? 300 : 20);
      p.dilation[a] = rnd(1, 4);
    }
    const Layout layout = Layout(rnd(0, kLayouts - 1));
    const int heads = rnd(1, 4);
    const int hd = rnd(0, 2);
    const int bad = hd == 0   ? check_one<32>(p, layout, heads, checks)
                    : hd == 1 ? check_one<64>(p, layout, heads, checks)
                              : check_one<128>(p, layout, heads, checks);
    if (bad) return 1;
  }
  printf("ok %lld\n", checks);
  return 0;
}
