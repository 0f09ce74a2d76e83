// Host-side check of the strip CTA's geometry (csrc/include/nattn/sm90/strip_geometry.cuh,
// forward_strips.cuh; runs on the CPU, no GPU): for random 2-D problems within the strip
// pair's limits (stride 1, windows up to 7 x 9; dilation, causal axes, even kernels, grids
// ending in partial boxes), every CTA, warp, lane, walk chunk and score (j, e):
//   - the score's key lies in the CTA's 14 x 16 key box, at the box row the K / V fragments
//     read for it (strip_tile_row plus the accumulator column 2 (lane % 4) + e % 2);
//   - its mask bit is set exactly when the key is in the row's window (query_window), and the
//     row's set bits cover its whole window (each key once);
//   - its RPB index is (key - query + kernel - 1) per axis, row-major, where the bit is set,
//     and within the kernel's guards around the table where it is not (the kernel reads it
//     before the select);
// and the swizzled tiles' offsets move by whole rows with the walk (the ldmatrix addresses
// are a lane base plus the row offset: rows 8 r + i of the K tile, 16 r + i of the V tile).
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>

#include "nattn/sm90/smem_tile.cuh"
#include "nattn/sm90/strip_geometry.cuh"
#include "nattn/sm90/tiles.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x452821e638d01377ull
#include "host_rng.h"

using QB = Box<8, 8, 1>;
using KB = Box<14, 16, 1>;
constexpr int kGuard = 128;  // forward_strips.cuh, StripCta::kRpbGuard

static Params strip_problem() {
  Params p = {};
  p.na_dim = 2;
  p.tokens = 1;
  for (int a = 0; a < 3; ++a) p.spatial[a] = p.kernel[a] = p.stride[a] = p.dilation[a] = p.rpb_size[a] = 1;
  for (int a = 0; a < 2; ++a) {
    p.kernel[a] = rnd(1, a == 0 ? 7 : 9);
    p.dilation[a] = rnd(0, 2) ? 1 : rnd(2, 4);
    p.spatial[a] = p.kernel[a] * p.dilation[a] + rnd(0, rnd(0, 1) ? 6 : 40);
    p.causal[a] = rnd(0, 3) == 0;
    p.rpb_size[a] = 2 * p.kernel[a] - 1;
    p.tokens *= p.spatial[a];
  }
  for (int a = 0; a < 3; ++a) {
    p.q_lo[a] = 0;
    p.q_hi[a] = p.spatial[a];
  }
  return p;
}

static int fail(const char* what, const Params& p, long long box, int warp, int lane) {
  printf("FAIL %s: spatial %dx%d kernel %dx%d dilation %dx%d causal %d%d, box %lld warp %d lane %d\n", what,
         p.spatial[0], p.spatial[1], p.kernel[0], p.kernel[1], p.dilation[0], p.dilation[1], p.causal[0], p.causal[1],
         box, warp, lane);
  return 1;
}

template <int HD>
static int check_swizzle(long long& checks) {
  using C = TileSmem<HD, KB::kSize>;
  for (int base = 0; base + 16 <= KB::kSize; base += 8)
    for (int i = 0; i < 16; ++i)
      for (int c = 0; c < HD; c += 8) {
        const bool k_rows = i < 8, v_rows = base % 16 == 0;  // an n8 tile's rows; a k16 step's
        if (!k_rows && !v_rows) continue;
        ++checks;
        if (C::offset(base + i, c) != base * C::kRowBytes + C::offset(i, c)) {
          printf("FAIL swizzle: head dim %d, row %d + %d, channel %d\n", HD, base, i, c);
          return 1;
        }
      }
  return 0;
}

int main() {
  long long checks = 0;
  if (check_swizzle<32>(checks) || check_swizzle<64>(checks)) return 1;
  for (int it = 0; it < 3000; ++it) {
    Params p = strip_problem();
    set_query_boxes<QB>(p);
    const int table = p.rpb_size[0] * p.rpb_size[1];
    for (long long box = 0; box < num_cta_tiles<QB>(p); ++box) {
      CtaTile tile;
      if (!cta_tile<2, QB, KB>(p, unsigned(box), tile)) continue;
      if (tile.nk[0] != 1 || tile.nk[1] != 1) return fail("the union is larger than one key box", p, box, 0, 0);
      for (int warp = 0; warp < 4; ++warp)
        for (int lane = 0; lane < 32; ++lane) {
          // the four lanes of a quad (lane % 4) hold a row's columns: their kept keys together
          // are its window
          static int kept[2];
          if (lane % 4 == 0) kept[0] = kept[1] = 0;
          StripLane s;
          strip_lane<QB>(p, tile, warp, lane, s);
          if (s.sy < 0 || (s.sy + kStripChunkRows * s.chunks) * kStripCols > KB::kSize)
            return fail("the strip's rows leave the key box", p, box, warp, lane);
          for (int r = 0; r < 2; ++r) {
            const int qr = 16 * warp + lane / 4 + 8 * r;
            const int qy = tile.q0[0] + QB::offset(qr, 0), qx = tile.q0[1] + QB::offset(qr, 1);
            if (s.row_ok[r] != (qy < tile.len[0] && qx < tile.len[1])) return fail("row validity", p, box, warp, lane);
            // padding rows take the last query's window (their results are not written)
            const int cy = qy < tile.len[0] ? qy : tile.len[0] - 1, cx = qx < tile.len[1] ? qx : tile.len[1] - 1;
            const AxisRange wy = query_window(cy, tile.len[0], p.kernel[0], 1, p.causal[0] != 0);
            const AxisRange wx = query_window(cx, tile.len[1], p.kernel[1], 1, p.causal[1] != 0);
            for (int ch = 0; ch < s.chunks; ++ch) {
              const uint32_t word = strip_chunk_word(s.word[r], ch);
              for (int j = 0; j < 2 * kStripChunkRows; ++j)
                for (int e = 2 * r; e < 2 * r + 2; ++e) {
                  ++checks;
                  const int col = 2 * (lane % 4) + e % 2;  // the accumulator's column in the n8 tile
                  const int row_in_box = strip_tile_row(s.sy, ch, j) + col;
                  const int ky = tile.lo[0] + row_in_box / kStripCols, kx = tile.lo[1] + row_in_box % kStripCols;
                  if (ky != tile.lo[0] + s.sy + kStripChunkRows * ch + j / 2 || kx != tile.lo[1] + 8 * (j % 2) + col)
                    return fail("key coordinates", p, box, warp, lane);
                  const bool in = ky >= wy.start && ky < wy.start + wy.count && kx >= wx.start && kx < wx.start + wx.count;
                  if (strip_kept(word, j, e) != in) return fail("mask bit", p, box, warp, lane);
                  kept[r] += in;
                  const int idx = s.bias_at[r] + strip_chunk_bias(p.rpb_size[1], ch) + strip_bias_offset(p.rpb_size[1], j, e);
                  const int want = (ky - cy + p.kernel[0] - 1) * p.rpb_size[1] + (kx - cx + p.kernel[1] - 1);
                  if (in && idx != want) return fail("RPB index", p, box, warp, lane);
                  if (idx < -kGuard || idx >= table + kGuard) return fail("RPB index outside the guards", p, box, warp, lane);
                }
            }
            if (lane % 4 == 3 && kept[r] != wy.count * wx.count)
              return fail("the walk misses keys of the window", p, box, warp, lane);
          }
        }
    }
  }
  printf("ok %lld\n", checks);
  return 0;
}
