// Host-side check of the ordered KV-parallel dQ's geometry (nattn/sm90/ordered_dq.cuh; runs
// on the CPU, no GPU). For random problems and every backward tile pair, the dK/dV CTAs'
// walks moved onto the query-box grid (cta_tile_inverse with GRID) are replayed. Per grid box, the CTAs
// that add into it must carry the ranks 0 .. count - 1 (ordered_slot), once each, rising
// with blockIdx.x. Each walked box must be one the CTA's keys are seen from, and each box
// holding a query must be added into. A missing or repeated rank, or ranks out of blockIdx
// order, would leave a waiting CTA waiting forever.
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "nattn/sm90/ordered_dq.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x13198a2e03707344ull
#include "host_rng.h"
#include "sm90_problems.h"

struct Add {
  int64_t cta;
  int rank, count;
};

// Whether some query of the box at `origin` (CB, group coordinates) sees some key of the
// CTA's box (RB at t.q0), per axis: the windows of the box's first and last queries bound
// its union (windows are monotone in the query).
template <int NA, class RB, class CB>
static bool box_sees_keys(const Params& p, const CtaTile& t, const int* origin) {
  for (int a = 0; a < NA; ++a) {
    const bool c = p.causal[a] != 0;
    const int last_q = std::min(origin[a] + CB::extent(a) - 1, t.len[a] - 1);
    const AxisRange f = query_window(origin[a], t.len[a], p.kernel[a], p.stride[a], c);
    const AxisRange l = query_window(last_q, t.len[a], p.kernel[a], p.stride[a], c);
    const int last_k = std::min(t.q0[a] + RB::extent(a) - 1, t.len[a] - 1);
    if (l.start + l.count - 1 < t.q0[a] || f.start > last_k) return false;
  }
  return true;
}

static void describe(const Params& p, int na) {
  printf("(na %d, spatial %d,%d,%d, kernel %d,%d,%d, stride %d,%d,%d, dilation %d,%d,%d, causal %d,%d,%d)\n", na,
         p.spatial[0], p.spatial[1], p.spatial[2], p.kernel[0], p.kernel[1], p.kernel[2], p.stride[0], p.stride[1],
         p.stride[2], p.dilation[0], p.dilation[1], p.dilation[2], p.causal[0], p.causal[1], p.causal[2]);
}

template <int NA, class RB, class CB>
static int check(long long& checks, long long& steps, long long& snapped_steps) {
  const Params p = random_problem<NA>();
  std::vector<std::vector<Add>> adds(size_t(grid_query_boxes<CB>(p)));
  for (int64_t cta = 0; cta < num_key_ctas<RB>(p); ++cta) {
    CtaTile t;
    if (!cta_tile_inverse<NA, RB, CB>(p, unsigned(cta), t)) continue;
    steps += t.tiles;
    cta_tile_inverse<NA, RB, CB, true>(p, unsigned(cta), t);
    snapped_steps += t.tiles;
    BoxWalk<NA, CB> walk(t);
    for (int it = 0; it < t.tiles; ++it, walk.next(t)) {
      ++checks;
      bool on_grid = true;
      for (int a = 0; a < NA; ++a) on_grid = on_grid && walk.origin[a] % CB::extent(a) == 0 && walk.origin[a] >= 0;
      if (!on_grid || !box_sees_keys<NA, RB, CB>(p, t, walk.origin)) {
        printf("CTA %lld walks box %d,%d,%d (step %d of %d): %s ", (long long)cta, walk.origin[0],
               NA > 1 ? walk.origin[1] : 0, NA > 2 ? walk.origin[2] : 0, it, t.tiles,
               on_grid ? "none of its queries sees the CTA's keys" : "off the grid");
        describe(p, NA);
        return 1;
      }
      const OrderedSlot s = ordered_slot<NA, RB, CB>(p, t, walk.origin);
      if (s.box < 0 || s.box >= int64_t(adds.size()) || s.rank < 0 || s.rank >= s.count) {
        printf("CTA %lld: slot box %lld rank %d of %d out of range ", (long long)cta, (long long)s.box, s.rank,
               s.count);
        describe(p, NA);
        return 1;
      }
      adds[size_t(s.box)].push_back(Add{cta, s.rank, s.count});
    }
  }
  // every grid box holding a query (a box of each dilation group whose origin is inside it)
  for (size_t box = 0; box < adds.size(); ++box) {
    int64_t rest = int64_t(box);
    bool holds_query = true;
    for (int a = NA - 1; a >= 0; --a) {
      const int per = qtiles_per_group(p.spatial[a], p.dilation[a], CB::extent(a));
      const int g = int(rest % (int64_t(p.dilation[a]) * per)) / per;
      const int b = int(rest % per);
      rest /= int64_t(p.dilation[a]) * per;
      holds_query = holds_query && b * CB::extent(a) < group_len(p.spatial[a], g, p.dilation[a]);
    }
    std::vector<Add>& in = adds[box];
    std::sort(in.begin(), in.end(), [](const Add& x, const Add& y) { return x.cta < y.cta; });
    ++checks;
    bool ok = holds_query ? !in.empty() : in.empty();
    for (size_t i = 0; ok && i < in.size(); ++i)
      ok = in[i].count == int(in.size()) && in[i].rank == int(i) && (i == 0 || in[i].cta > in[i - 1].cta);
    if (!ok) {
      printf("grid box %zu (%s a query): %zu adds, ranks", box, holds_query ? "holds" : "holds no", in.size());
      for (size_t i = 0; i < in.size() && i < 12; ++i) printf(" %d/%d (CTA %lld)", in[i].rank, in[i].count,
                                                             (long long)in[i].cta);
      printf(" ");
      describe(p, NA);
      return 1;
    }
  }
  return 0;
}

int main() {
  long long checks = 0, steps = 0, snapped = 0;
  for (int it = 0; it < 300; ++it) {
    if (check<1, Box<128, 1, 1>, Box<64, 1, 1>>(checks, steps, snapped) ||
        check<2, Box<8, 16, 1>, Box<4, 16, 1>>(checks, steps, snapped) ||
        check<2, Box<16, 8, 1>, Box<8, 8, 1>>(checks, steps, snapped) ||
        check<3, Box<2, 8, 8>, Box<1, 8, 8>>(checks, steps, snapped) ||
        check<3, Box<4, 4, 8>, Box<2, 4, 8>>(checks, steps, snapped))
      return 1;
  }
  printf("ok %lld (grid walks %.3fx the steps)\n", checks, double(snapped) / double(steps));
  return 0;
}
