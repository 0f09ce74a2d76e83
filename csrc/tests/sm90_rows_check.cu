// Host-side check of the Hopper family's query-box geometry (runs on the CPU, no GPU): for
// random problems (1-3 axes, dilation, any sizes) and every query-box shape of SM90_TILES,
// the boxes a launch decodes (cta_tile) and their rows (Box::offset, valid when inside the
// dilation group) cover every token exactly once. The forward writes its output and LSE
// per valid row, and split-KV's partial rows (box-local slots) are mapped back to tokens
// by split_kv_merge.cuh with the same decode: a gap or an overlap would leave an output
// row unwritten or written twice. Also: the kernels' box walk (BoxWalk: each step's box
// origin advanced like an odometer, and the pass count) visits the same boxes, in the same
// order, as decoding the step index directly, for the forward's and the dK/dV pass's tiles.
// And the backward's skipped steps (seen_steps): each consumer warpgroup's half of the CTA's
// box sees nothing of a box its walk only releases: no (query, key) pair of the dQ pass's half
// and box is in a window, nor of the dK/dV pass's box and half.
// And with a query range (a halo rank's own queries): the launched boxes still hold every
// query of the range, each once, and the dK/dV pass's clipped walk every query of the range
// that sees one of its keys.
// And the split CTAs' own walks (narrow_to_half: a half of the box along axis 0 walking its
// own union from where it starts): no more boxes than the box's walk, and along axis 0 holding
// every key a valid row of the half sees (the dK/dV pass: every query of the range that
// sees one of the half's keys).
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "nattn/sm90/tiles.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x243f6a8885a308d3ull
#include "host_rng.h"
#include "sm90_problems.h"

// Step it of a walk over t's boxes of shape B, decoded directly: pass it / tiles, then the
// box index's digits per axis, last axis fastest.
template <int NA, class B>
static void decoded(const CtaTile& t, int it, int* origin, int& pass) {
  pass = it / t.tiles;
  int k = it % t.tiles;
  for (int a = NA - 1; a >= 0; --a) {
    origin[a] = t.lo[a] + (k % t.nk[a]) * B::extent(a);
    k /= t.nk[a];
  }
}

template <int NA, class B>
static int walk_matches(const Params& p, const CtaTile& t, const char* what, long long& checks) {
  BoxWalk<NA, B> walk(t);
  for (int it = 0; it < 3 * t.tiles; ++it, walk.next(t)) {  // three passes (GQA: query heads)
    int origin[3], pass;
    decoded<NA, B>(t, it, origin, pass);
    ++checks;
    bool same = walk.pass == pass;
    for (int a = 0; a < NA; ++a) same = same && walk.origin[a] == origin[a];
    if (!same) {
      printf("%s walk: step %d of %d boxes is pass %d origin %d,%d,%d, expected pass %d origin %d,%d,%d "
             "(na %d, spatial %d,%d,%d)\n", what, it, t.tiles, walk.pass, walk.origin[0], walk.origin[1],
             walk.origin[2], pass, origin[0], NA > 1 ? origin[1] : 0, NA > 2 ? origin[2] : 0, NA, p.spatial[0],
             p.spatial[1], p.spatial[2]);
      return 1;
    }
  }
  return 0;
}

// The forward / dQ pass (query box QB walking key boxes KB) and the dK/dV pass (key box QB
// walking query boxes KB) of a random problem.
template <int NA, class QB, class KB>
static int check_walk(long long& checks) {
  Params p = random_problem<NA>();
  set_query_boxes<QB>(p);
  for (int64_t box = 0; box < num_cta_tiles<QB>(p); ++box) {
    CtaTile tile;
    if (cta_tile<NA, QB, KB>(p, box, tile) && walk_matches<NA, KB>(p, tile, "forward", checks)) return 1;
    if (cta_tile_inverse<NA, QB, KB>(p, box, tile) && tile.tiles > 0 &&
        walk_matches<NA, KB>(p, tile, "dK/dV", checks))
      return 1;
  }
  return 0;
}

// Whether query q sees key k (group coordinates, per axis).
template <int NA>
static bool sees(const Params& p, const CtaTile& t, const int* q, const int* k) {
  for (int a = 0; a < NA; ++a) {
    const AxisRange w = query_window(q[a], t.len[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
    if (k[a] < w.start || k[a] >= w.start + w.count) return false;
  }
  return true;
}

// Every step of a CTA's walk outside seen_steps' range, for each half cw of its box RB (the
// dQ pass: RB queries, B key boxes; kInverse, the dK/dV pass: RB keys, B query boxes): no
// valid row of the half and valid element of the box form a visible pair.
template <int NA, class RB, class B, bool kInverse>
static int skipped_unseen(const Params& p, const CtaTile& t, long long& checks) {
  for (int cw = 0; cw < 2; ++cw) {
    int first, last;
    seen_steps<RB, B, kInverse>(p, t, cw, first, last);
    if (first < 0 || last > t.tiles || first > last) {
      printf("seen_steps [%d, %d) outside the walk's %d boxes\n", first, last, t.tiles);
      return 1;
    }
    int origin[3], pass;
    for (int it = 0; it < t.tiles; ++it) {
      if (it >= first && it < last) continue;
      decoded<NA, B>(t, it, origin, pass);
      for (int r = cw * RB::kSize / 2; r < (cw + 1) * RB::kSize / 2; ++r) {
        int x[3];
        bool ok = true;
        for (int a = 0; a < NA; ++a) ok = ok && (x[a] = t.q0[a] + RB::offset(r, a)) < t.len[a];
        if (!ok) continue;
        for (int e = 0; e < B::kSize; ++e) {
          int y[3];
          bool in = true;
          for (int a = 0; a < NA; ++a) in = in && (y[a] = origin[a] + B::offset(e, a)) < t.len[a] && y[a] >= 0;
          if (!in) continue;
          ++checks;
          if (kInverse ? sees<NA>(p, t, y, x) : sees<NA>(p, t, x, y)) {
            printf("%s: warpgroup %d skips step %d (seen [%d, %d) of %d) but its row %d sees box element %d "
                   "(na %d, spatial %d,%d,%d, kernel %d,%d,%d, stride %d,%d,%d, causal %d,%d,%d)\n",
                   kInverse ? "dK/dV" : "dQ", cw, it, first, last, t.tiles, r, e, NA, p.spatial[0], p.spatial[1],
                   p.spatial[2], p.kernel[0], p.kernel[1], p.kernel[2], p.stride[0], p.stride[1], p.stride[2],
                   p.causal[0], p.causal[1], p.causal[2]);
            return 1;
          }
        }
      }
    }
  }
  return 0;
}

// With a query range, the dK/dV pass's walk (cta_tile_inverse, clipped to the range) still
// holds, per axis, every query of the range whose window holds one of the CTA's keys.
template <int NA, class RB, class B>
static int check_inverse_range(long long& checks) {
  Params p = random_problem<NA>();
  for (int a = 0; a < NA; ++a) {
    p.q_lo[a] = rnd(0, p.spatial[a] - 1);
    p.q_hi[a] = rnd(p.q_lo[a] + 1, p.spatial[a]);
  }
  for (int64_t box = 0; box < num_key_ctas<RB>(p); ++box) {
    CtaTile t;
    if (!cta_tile_inverse<NA, RB, B>(p, box, t)) continue;
    for (int a = 0; a < NA; ++a) {
      const int d = p.dilation[a], g = t.g[a];
      for (int x = t.q0[a]; x < nattn_min(t.q0[a] + RB::extent(a), t.len[a]); ++x) {
        const AxisRange inv = key_inverse(x, t.len[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
        for (int j = inv.start; j < inv.start + inv.count; ++j) {
          const int real = g + d * j;
          if (real < p.q_lo[a] || real >= p.q_hi[a]) continue;
          ++checks;
          if (t.nk[a] == 0 || j < t.lo[a] || j >= t.lo[a] + t.nk[a] * B::extent(a)) {
            printf("dK/dV walk with a query range misses query %d of key %d on axis %d (walk %d + %d boxes, "
                   "range [%d, %d), na %d)\n", j, x, a, t.lo[a], t.nk[a], p.q_lo[a], p.q_hi[a], NA);
            return 1;
          }
        }
      }
    }
  }
  return 0;
}

// The split CTAs' walks (narrow_to_half) on a random problem, with a random query range
// every other time (the dK/dV pass clips its walk to it).
template <int NA, class RB, class B>
static int check_own_halves(long long& checks, bool ranged) {
  Params p = random_problem<NA>();
  for (int a = 0; ranged && a < NA; ++a) {
    p.q_lo[a] = rnd(0, p.spatial[a] - 1);
    p.q_hi[a] = rnd(p.q_lo[a] + 1, p.spatial[a]);
  }
  set_query_boxes<RB>(p);
  for (int inverse = 0; inverse < 2; ++inverse) {
    const int64_t boxes = inverse ? num_key_ctas<RB>(p) : num_cta_tiles<RB>(p);
    for (int64_t box = 0; box < boxes; ++box) {
      CtaTile whole;
      if (!(inverse ? cta_tile_inverse<NA, RB, B>(p, box, whole) : cta_tile<NA, RB, B>(p, box, whole))) continue;
      for (int half = 0; half < 2; ++half) {
        const int first = whole.q0[0] + half * (RB::extent(0) / 2);
        if (first >= whole.len[0]) continue;  // (the kernels return: no CTA)
        CtaTile t = whole;
        if (inverse) narrow_to_half<NA, RB, B, true>(p, t, half);
        else narrow_to_half<NA, RB, B, false>(p, t, half);
        ++checks;
        // (its last box may reach past the box's walk: what lies there is outside every window
        // of the half, masked like any other element outside them)
        bool ok = t.nk[0] == 0 || (t.lo[0] >= whole.lo[0] && t.nk[0] <= whole.nk[0]);
        for (int a = 1; a < NA; ++a) ok = ok && t.lo[a] == whole.lo[a] && t.nk[a] == whole.nk[a];
        int per_row = 1;
        for (int a = 1; a < NA; ++a) per_row *= t.nk[a];
        ok = ok && t.tiles == t.nk[0] * per_row;
        const int d = p.dilation[0], g = t.g[0];
        for (int x = first; ok && x < nattn_min(first + RB::extent(0) / 2, t.len[0]); ++x) {
          const AxisRange r = inverse ? key_inverse(x, t.len[0], p.kernel[0], p.stride[0], p.causal[0] != 0)
                                      : query_window(x, t.len[0], p.kernel[0], p.stride[0], p.causal[0] != 0);
          for (int j = r.start; ok && j < r.start + r.count; ++j) {
            if (inverse && (g + d * j < p.q_lo[0] || g + d * j >= p.q_hi[0])) continue;  // (not a query of the range)
            ++checks;
            ok = t.nk[0] > 0 && j >= t.lo[0] && j < t.lo[0] + t.nk[0] * B::extent(0);
          }
        }
        if (!ok) {
          printf("%s pass: half %d's own walk (%d + %d boxes, %d steps) starts before the box's (%d + %d) or misses "
                 "what its rows see (na %d, spatial %d,%d,%d, kernel %d,%d,%d, box %d)\n", inverse ? "dK/dV" : "dQ",
                 half, t.lo[0], t.nk[0], t.tiles, whole.lo[0], whole.nk[0], NA, p.spatial[0], p.spatial[1],
                 p.spatial[2], p.kernel[0], p.kernel[1], p.kernel[2], int(box));
          return 1;
        }
      }
    }
  }
  return 0;
}

// The backward's pairs (128-token box RB, 64-token box B): both passes of a random problem.
template <int NA, class RB, class B>
static int check_skips(long long& checks) {
  Params p = random_problem<NA>();
  set_query_boxes<RB>(p);
  for (int64_t box = 0; box < num_key_ctas<RB>(p); ++box) {
    CtaTile tile;
    if (cta_tile<NA, RB, B>(p, box, tile) && skipped_unseen<NA, RB, B, false>(p, tile, checks)) return 1;
    if (cta_tile_inverse<NA, RB, B>(p, box, tile) && skipped_unseen<NA, RB, B, true>(p, tile, checks)) return 1;
  }
  return 0;
}

// Whether token t (row-major) lies in the problem's query range on every axis.
static bool in_range(const Params& p, int64_t t) {
  for (int a = p.na_dim - 1; a >= 0; --a) {
    const int i = int(t % p.spatial[a]);
    t /= p.spatial[a];
    if (i < p.q_lo[a] || i >= p.q_hi[a]) return false;
  }
  return true;
}

// Every token of the grid is a row of exactly one launched box; with a random query range
// (`ranged`, as a halo rank computes only its own queries), every token of the range is,
// and no token is a row of two boxes.
template <int NA, class QB>
static int check(long long& checks, bool ranged = false) {
  Params p = random_problem<NA>();
  for (int a = 0; ranged && a < NA; ++a) {
    p.q_lo[a] = rnd(0, p.spatial[a] - 1);
    p.q_hi[a] = rnd(p.q_lo[a] + 1, p.spatial[a]);
  }
  set_query_boxes<QB>(p);
  std::vector<int> seen(p.tokens, 0);
  const int64_t boxes = num_cta_tiles<QB>(p);
  for (int64_t box = 0; box < boxes; ++box) {
    CtaTile tile;
    if (!cta_tile<NA, QB, QB>(p, box, tile)) continue;
    for (int qr = 0; qr < QB::kSize; ++qr) {
      int64_t token;
      if (!box_row_token<NA, QB>(p, tile, tile.q0, qr, token)) continue;  // the kernels' mapping
      ++checks;
      if (token < 0 || token >= p.tokens) {
        printf("box %lld row %d maps outside the grid (token %lld of %lld)\n", (long long)box, qr,
               (long long)token, (long long)p.tokens);
        return 1;
      }
      ++seen[token];
    }
  }
  for (int64_t t = 0; t < p.tokens; ++t) {
    ++checks;
    if (seen[t] > 1 || (seen[t] == 0 && in_range(p, t))) {
      printf("token %lld covered %d times (na %d, spatial %d,%d,%d, dilation %d,%d,%d, box %d,%d,%d)\n",
             (long long)t, seen[t], NA, p.spatial[0], p.spatial[1], p.spatial[2], p.dilation[0], p.dilation[1],
             p.dilation[2], QB::extent(0), QB::extent(1), QB::extent(2));
      return 1;
    }
  }
  return 0;
}

int main() {
  long long checks = 0;
  for (int it = 0; it < 300; ++it) {
    if (check<1, Box<128, 1, 1>>(checks) || check<1, Box<64, 1, 1>>(checks) ||
        check<2, Box<8, 16, 1>>(checks) || check<2, Box<8, 8, 1>>(checks) ||
        check<3, Box<2, 8, 8>>(checks) || check<3, Box<4, 4, 8>>(checks) || check<3, Box<4, 8, 4>>(checks) ||
        check<3, Box<2, 4, 8>>(checks) || check<2, Box<16, 8, 1>>(checks) || check<2, Box<16, 4, 1>>(checks) ||
        check<2, Box<32, 4, 1>>(checks))
      return 1;
    if (check<1, Box<128, 1, 1>>(checks, true) || check<1, Box<64, 1, 1>>(checks, true) ||
        check<2, Box<8, 16, 1>>(checks, true) || check<2, Box<8, 8, 1>>(checks, true) ||
        check<3, Box<2, 8, 8>>(checks, true) || check<3, Box<4, 8, 4>>(checks, true))
      return 1;
    if (check_walk<1, Box<128, 1, 1>, Box<64, 1, 1>>(checks) || check_walk<2, Box<8, 16, 1>, Box<4, 16, 1>>(checks) ||
        check_walk<2, Box<8, 8, 1>, Box<7, 16, 1>>(checks) || check_walk<3, Box<2, 8, 8>, Box<1, 8, 8>>(checks) ||
        check_walk<3, Box<4, 4, 8>, Box<2, 4, 16>>(checks) || check_walk<3, Box<2, 4, 8>, Box<1, 5, 16>>(checks) ||
        check_walk<3, Box<4, 4, 8>, Box<2, 4, 8>>(checks) || check_walk<2, Box<16, 8, 1>, Box<8, 8, 1>>(checks) ||
        check_walk<2, Box<32, 4, 1>, Box<7, 16, 1>>(checks))
      return 1;
    if (check_skips<1, Box<128, 1, 1>, Box<64, 1, 1>>(checks) || check_skips<2, Box<8, 16, 1>, Box<4, 16, 1>>(checks) ||
        check_skips<3, Box<2, 8, 8>, Box<1, 8, 8>>(checks) || check_skips<3, Box<4, 4, 8>, Box<2, 4, 8>>(checks) ||
        check_skips<2, Box<16, 8, 1>, Box<8, 8, 1>>(checks) || check_skips<2, Box<32, 4, 1>, Box<7, 16, 1>>(checks))
      return 1;
    const bool ranged = it % 2;
    if (check_own_halves<1, Box<128, 1, 1>, Box<64, 1, 1>>(checks, ranged) ||
        check_own_halves<2, Box<8, 16, 1>, Box<4, 16, 1>>(checks, ranged) ||
        check_own_halves<2, Box<16, 8, 1>, Box<4, 24, 1>>(checks, ranged) ||
        check_own_halves<2, Box<32, 4, 1>, Box<7, 16, 1>>(checks, ranged) ||
        check_own_halves<3, Box<2, 8, 8>, Box<1, 8, 8>>(checks, ranged) ||
        check_own_halves<3, Box<4, 4, 8>, Box<2, 4, 8>>(checks, ranged))
      return 1;
    if (check_inverse_range<1, Box<128, 1, 1>, Box<64, 1, 1>>(checks) ||
        check_inverse_range<2, Box<8, 16, 1>, Box<4, 16, 1>>(checks) ||
        check_inverse_range<3, Box<2, 8, 8>, Box<1, 8, 8>>(checks) ||
        check_inverse_range<3, Box<4, 4, 8>, Box<2, 4, 8>>(checks) ||
        check_inverse_range<2, Box<16, 8, 1>, Box<8, 8, 1>>(checks))
      return 1;
  }
  printf("ok %lld\n", checks);
  return 0;
}
