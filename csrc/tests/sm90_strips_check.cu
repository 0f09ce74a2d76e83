// Host-side check of the strip CTA's geometry (csrc/include/nattn/sm90/strip_geometry.cuh,
// forward_strips.cuh; runs on the CPU, no GPU): for random 2-D and 3-D problems within the
// strip pairs' limits (stride 1, windows up to 7 x 9 / 7 x 7 x 9; dilation, causal axes, even
// kernels, grids ending in partial boxes), every CTA, warp, lane, frame, walk chunk and score
// (j, e):
//   - the score's key lies in the CTA's key box (3-D: in a frame of the union, which the
//     ring holds), at the box row the K / V fragments read for it (strip_tile_row plus the
//     accumulator column 2 (lane % 4) + e % 2);
//   - its mask bit is set exactly when the key is in the row's window (query_window), and
//     the row's set bits cover its whole window (each key once);
//   - its RPB index is (key - query + kernel - 1) per axis, row-major, where the bit is set,
//     and within the kernel's guards around the table where it is not (the kernel reads it
//     before the select);
// and the swizzled tiles' offsets move by whole rows with the walk (the ldmatrix addresses
// are a lane base plus the row offset: rows 8 r + i, i < 16, of the K and V tiles).
// Warps whose lanes all take the narrow walk (strip_lane_narrow: one step, score tile j the
// wide numbering's 2 j) are checked on it the same way, and strip_problem_narrow must mean
// that every warp of the problem does.
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>

#include "nattn/sm90/smem_tile.cuh"
#include "nattn/sm90/strip_geometry.cuh"
#include "nattn/sm90/tiles.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x452821e638d01377ull
#include "host_rng.h"
#include "sm90_problems.h"

constexpr int kGuard = 128;  // forward_strips.cuh, StripCta::kRpbGuard

template <int NA>
struct Pair;
template <>
struct Pair<2> {
  using QB = Box<8, 8, 1>;
  using KB = Box<14, 16, 1>;
};
template <>
struct Pair<3> {
  using QB = Box<2, 4, 8>;
  using KB = Box<8, 10, 16>;
};

static int fail(const char* what, const Params& p, long long box, int warp, int lane) {
  printf("FAIL %s: %d-D spatial %dx%dx%d kernel %dx%dx%d dilation %dx%dx%d causal %d%d%d, box %lld warp %d lane %d\n",
         what, p.na_dim, p.spatial[0], p.spatial[1], p.spatial[2], p.kernel[0], p.kernel[1], p.kernel[2],
         p.dilation[0], p.dilation[1], p.dilation[2], p.causal[0], p.causal[1], p.causal[2], box, warp, lane);
  return 1;
}

template <int HD, int ROWS>
static int check_swizzle(long long& checks) {
  using C = TileSmem<HD, ROWS>;
  for (int base = 0; base + 16 <= ROWS; base += 8)
    for (int i = 0; i < 16; ++i)
      for (int c = 0; c < HD; c += 8) {
        ++checks;
        if (C::offset(base + i, c) != base * C::kRowBytes + C::offset(i, c)) {
          printf("FAIL swizzle: head dim %d, %d rows, row %d + %d, channel %d\n", HD, ROWS, base, i, c);
          return 1;
        }
      }
  return 0;
}

template <int NA>
static int check_problems(int count, long long& checks, long long& narrow_warps) {
  using QB = typename Pair<NA>::QB;
  using KB = typename Pair<NA>::KB;
  constexpr int R = NA - 2, C = NA - 1;
  constexpr int kSlabRows = NA == 3 ? KB::extent(1) : KB::extent(0);
  for (int it = 0; it < count; ++it) {
    Params p = strip_problem<NA>();
    int qbox[3], kbox[3];
    for (int a = 0; a < 3; ++a) qbox[a] = QB::extent(a), kbox[a] = KB::extent(a);
    if (strip_declines(p, qbox, kbox)) return fail("declined a problem within the limits", p, -1, 0, 0);
    set_query_boxes<QB>(p);
    int table = 1;
    for (int a = 0; a < NA; ++a) table *= p.rpb_size[a];
    for (long long box = 0; box < num_cta_tiles<QB>(p); ++box) {
      CtaTile tile;
      if (!cta_tile<NA, QB, KB>(p, unsigned(box), tile)) continue;
      for (int a = 0; a < NA; ++a)
        if (tile.nk[a] != 1) return fail("the union is larger than the key box", p, box, 0, 0);
      int slabs = 1;  // forward_strips.cuh: the union's frames
      if (NA == 3) {
        const int last = nattn_min(tile.q0[0] + QB::extent(0) - 1, tile.len[0] - 1);
        const AxisRange w = query_window(last, tile.len[0], p.kernel[0], 1, p.causal[0] != 0);
        slabs = w.start + w.count - tile.lo[0];
      }
      for (int warp = 0; warp < 4; ++warp) {
        bool narrow = true;  // forward_strips.cuh: __all_sync over the warp's lanes
        for (int lane = 0; lane < 32; ++lane) {
          StripLane s;
          strip_lane<NA, QB>(p, tile, warp, lane, s);
          narrow = narrow && strip_lane_narrow(s);
        }
        if (strip_problem_narrow(p) && !narrow) return fail("a warp of a narrow problem walks wide", p, box, warp, 0);
        narrow_warps += narrow;
        const int step = narrow ? 2 : 1;  // a narrow step's tile j is the wide numbering's 2 j of chunk 0
        for (int lane = 0; lane < 32; ++lane) {
          // the four lanes of a quad (lane % 4) hold a row's columns: their kept keys together
          // are its window
          static int kept[2];
          if (lane % 4 == 0) kept[0] = kept[1] = 0;
          StripLane s;
          strip_lane<NA, QB>(p, tile, warp, lane, s);
          const int steps = narrow ? 1 : s.chunks;  // (a narrow warp's single step)
          if (s.sy < 0 || s.sy + (narrow ? kStripWalkRows : kStripChunkRows * s.chunks) > kSlabRows)
            return fail("the strip's rows leave the key box", p, box, warp, lane);
          if (s.ft < 0 || s.ft + s.frames > slabs) return fail("the strip's frames leave the union", p, box, warp, lane);
          for (int r = 0; r < 2; ++r) {
            const int qr = 16 * warp + lane / 4 + 8 * r;
            int q[3] = {0, 0, 0}, cq[3] = {0, 0, 0};
            bool ok = true;
            AxisRange w[3];
            for (int a = 0; a < NA; ++a) {
              q[a] = tile.q0[a] + QB::offset(qr, a);
              ok = ok && q[a] < tile.len[a];
              // padding rows take the last query's window (their results are not written)
              cq[a] = q[a] < tile.len[a] ? q[a] : tile.len[a] - 1;
              w[a] = query_window(cq[a], tile.len[a], p.kernel[a], 1, p.causal[a] != 0);
            }
            if (s.row_ok[r] != ok) return fail("row validity", p, box, warp, lane);
            if (NA == 3 && (tile.lo[0] + s.ft != w[0].start || s.frames != w[0].count))
              return fail("the strip's frames are not the window's", p, box, warp, lane);
            for (int fi = 0; fi < s.frames; ++fi)
              for (int ch = 0; ch < steps; ++ch) {
                const uint32_t word = strip_chunk_word(s.word[r], ch);
                for (int jn = 0; jn < 2 * kStripChunkRows; ++jn)
                  for (int e = 2 * r; e < 2 * r + 2; ++e) {
                    ++checks;
                    const int j = step * jn;  // the wide numbering's tile
                    const int col = 2 * (lane % 4) + e % 2;  // the accumulator's column in the n8 tile
                    const int row_in_box = strip_tile_row(s.sy, ch, j) + col;
                    int k[3] = {0, 0, 0};
                    if (NA == 3) k[0] = tile.lo[0] + s.ft + fi;
                    k[R] = tile.lo[R] + row_in_box / kStripCols;
                    k[C] = tile.lo[C] + row_in_box % kStripCols;
                    if (k[R] != tile.lo[R] + s.sy + kStripChunkRows * ch + j / 2 || k[C] != tile.lo[C] + 8 * (j % 2) + col)
                      return fail("key coordinates", p, box, warp, lane);
                    bool in = true;
                    int want = 0;
                    for (int a = 0; a < NA; ++a) {
                      in = in && k[a] >= w[a].start && k[a] < w[a].start + w[a].count;
                      want = want * p.rpb_size[a] + (k[a] - cq[a] + p.kernel[a] - 1);
                    }
                    if (strip_kept(word, j, e) != in) return fail("mask bit", p, box, warp, lane);
                    kept[r] += in;
                    const int idx = s.bias_at[r] + fi * s.frame_mult + strip_chunk_bias(s.row_mult, ch) +
                                    strip_bias_offset(s.row_mult, j, e);
                    if (in && idx != want) return fail("RPB index", p, box, warp, lane);
                    if (idx < -kGuard || idx >= table + kGuard) return fail("RPB index outside the guards", p, box, warp, lane);
                  }
              }
            int window = 1;
            for (int a = 0; a < NA; ++a) window *= w[a].count;
            if (lane % 4 == 3 && kept[r] != window) return fail("the walk misses keys of the window", p, box, warp, lane);
          }
        }
      }
    }
  }
  return 0;
}

int main() {
  long long checks = 0, narrow_warps = 0;
  if (check_swizzle<32, 224>(checks) || check_swizzle<64, 224>(checks) || check_swizzle<32, 160>(checks) ||
      check_swizzle<64, 160>(checks))
    return 1;
  if (check_problems<2>(3000, checks, narrow_warps) || check_problems<3>(200, checks, narrow_warps)) return 1;
  if (narrow_warps == 0) {
    printf("FAIL no problem drawn has narrow warps\n");
    return 1;
  }
  printf("ok %lld (%lld narrow warps)\n", checks, narrow_warps);
  return 0;
}
