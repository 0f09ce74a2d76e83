// Host-side check of the square dK/dV pass's geometry (csrc/include/nattn/sm90/square_geometry.cuh,
// "the square dK/dV pass"; backward_dkv_squares.cuh; runs on the CPU, no GPU): for random 2-D
// problems within the square pair's limits (stride 1, windows up to 13 x 13; dilation, causal
// axes, even kernels, grids ending in partial boxes; some with a query range), every key CTA,
// warp, lane, slab, line, step and score (j, e) the kernel walks:
//   - the slab width (square_dkv_slab_cols) is a multiple of 8 of at most the box's kMaxSlabCols that holds
//     the union's columns;
//   - the warps' m16 rows cover the key box (8 x 8, or 4 x 16) once, and a lane's two keys are the rows
//     its K / V fragments and staged outputs are of;
//   - a step's reads (16 queries of Q and dO, their LSE / delta slots) stay inside the tiles
//     (slab and pad), and the fragment addresses at the warp's swizzle phase
//     (phase_fragment_offsets) are the swizzled tile's offsets of the queries read;
//   - a kept score's slot holds its query (the staging's order: union rows from the slab's
//     first, slab_cols a row, split as the kernel splits it; its token, strip_query_token);
//   - the score's mask is set exactly when the query exists, is in the query range and its
//     window holds the key;
//   - its RPB index is (key - query + kernel - 1) per axis, row-major, where the mask is set,
//     and the step's index for the key minus 8 j + e % 2 (the kernel's form);
// and each key's walk keeps every query of the range whose window holds it exactly once; for
// both key boxes (SquareDkvBox: 8 x 8 and 4 x 16).
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>

#include "nattn/sm90/smem_tile.cuh"
#include "nattn/sm90/square_geometry.cuh"
#include "nattn/sm90/tiles.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x51c3a8e07d92b46full
#include "host_rng.h"
#include "sm90_problems.h"

static int fail(const char* what, const Params& p, long long cta, int warp, int lane) {
  printf("FAIL %s: spatial %dx%d kernel %dx%d dilation %dx%d causal %d%d range [%d %d, %d %d), cta %lld warp %d "
         "lane %d\n",
         what, p.spatial[0], p.spatial[1], p.kernel[0], p.kernel[1], p.dilation[0], p.dilation[1], p.causal[0],
         p.causal[1], p.q_lo[0], p.q_lo[1], p.q_hi[0], p.q_hi[1], cta, warp, lane);
  return 1;
}

// A step's fragment addresses (first query q0 of the slab tile) against the tile's offsets.
template <int HD>
static bool addresses_ok(int sx, int q0, int lane, long long& checks) {
  using C = TileSmem<HD, kSquareDkvSlabTokens + kSquareDkvPad>;  // (offsets do not depend on the rows)
  int k_off[HD / 32], t_off[HD / 16];
  phase_fragment_offsets<C, HD>(sx & 7, lane, 0, k_off, t_off);
  for (int j = 0; j < 2; ++j)
    for (int x = 0; x < HD / 32; ++x) {
      ++checks;
      if ((q0 + 8 * j) * C::kRowBytes + k_off[x] != C::offset(q0 + 8 * j + lane % 8, 8 * (lane / 8) + 32 * x))
        return false;
    }
  for (int x = 0; x < HD / 16; ++x) {
    ++checks;
    if (q0 * C::kRowBytes + t_off[x] != C::offset(q0 + lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16) + 16 * x))
      return false;
  }
  return true;
}

template <bool kWide>
static int check_problems(int count, int tokens, long long& checks, long long& two_steps) {
  using Sq = SquareDkvBox<kWide>;  // (square_geometry.cuh)
  using KB = typename Sq::Keys;
  for (int it = 0; it < count; ++it) {
    Params p = square_problem();
    if (rnd(0, 3) == 0) {  // a halo rank's query range on one axis
      const int a = rnd(0, 1);
      p.q_lo[a] = rnd(0, p.spatial[a] - 1);
      p.q_hi[a] = rnd(p.q_lo[a] + 1, p.spatial[a]);
    }
    const int W = square_dkv_slab_cols(p, Sq::kCols), rows = square_dkv_slab_rows(W, tokens), slab_queries = rows * W;
    if (W % 8 || W > Sq::kMaxSlabCols || slab_queries > tokens)
      return fail("the slab width", p, -1, 0, 0);
    const int mult = p.rpb_size[1];
    for (long long cta = 0; cta < num_key_ctas<KB>(p); ++cta) {
      CtaTile tile;
      if (!cta_tile_inverse<2, KB, Box<1, 1, 1>>(p, unsigned(cta), tile)) continue;
      if (tile.tiles > 0 && tile.nk[1] > W) return fail("the union is wider than the slab", p, cta, 0, 0);
      const int per_head = (tile.nk[0] + rows - 1) / rows;
      int rows_seen[64] = {0};
      for (int warp = 0; warp < 4; ++warp) {
        int kept_by_key[16] = {0};  // the warp's keys (m16 rows), over the quad's lanes
        for (int m = 0; m < 16; ++m) rows_seen[Sq::key_row(warp, m)] += 1;
        for (int lane = 0; lane < 32; ++lane) {
          SquareKeyLane s;
          square_key_lane<kWide>(p, tile, warp, lane, s);
          if (tile.tiles == 0) continue;
          if (s.w_hi >= s.w_lo && (s.steps < 1 || s.steps > 2 || s.sx < 0)) return fail("the warp's steps", p, cta, warp, lane);
          two_steps += s.steps == 2 && lane == 0;
          for (int r = 0; r < 2; ++r) {
            const int kr = Sq::key_row(warp, lane / 4 + 8 * r);  // the key's box row
            const int k[2] = {tile.q0[0] + KB::offset(kr, 0), tile.q0[1] + KB::offset(kr, 1)};
            if (k[0] != tile.q0[0] + kSquareSide * (warp / (KB::extent(1) / kSquareSide)) + (lane / 4) / 4 + 2 * r ||
                k[1] != tile.q0[1] + kSquareSide * (warp % (KB::extent(1) / kSquareSide)) + (lane / 4) % 4)
              return fail("the lane's keys", p, cta, warp, lane);
            // (the staged outputs' second row: kLaneRowStep after the first)
            if (r == 1 && kr != Sq::key_row(warp, lane / 4) + Sq::kLaneRowStep)
              return fail("the lane's second key row", p, cta, warp, lane);
            const bool k_ok = k[0] < tile.len[0] && k[1] < tile.len[1];
            for (int rb = 0; rb < per_head; ++rb) {
              const int y0 = tile.lo[0] + rows * rb;
              const int y_last = nattn_min(s.w_hi, y0 + rows - 1);
              for (int y = nattn_max(s.w_lo, y0); y <= y_last; ++y) {
                for (int c = 0; c < s.steps; ++c) {
                  const int q0 = (y - y0) * W + s.sx + 16 * c;
                  if (q0 < 0 || q0 + 16 > tokens + kSquareDkvPad) return fail("a step outside the tiles", p, cta, warp, lane);
                  if (!addresses_ok<32>(s.sx, q0, lane, checks) || !addresses_ok<64>(s.sx, q0, lane, checks))
                    return fail("fragment address", p, cta, warp, lane);
                  for (int j = 0; j < 2; ++j)
                    for (int e = 2 * r; e < 2 * r + 2; ++e) {
                      ++checks;
                      const int q[2] = {y, tile.lo[1] + s.sx + 16 * c + 8 * j + 2 * (lane % 4) + e % 2};
                      const int slot = q0 + 8 * j + 2 * (lane % 4) + e % 2;
                      const bool kept = square_key_kept(s, y, c, j, e);
                      bool in = k_ok, in_range = true;
                      long long token = 0;
                      int want = 0;
                      for (int a = 0; a < 2; ++a) {
                        in = in && q[a] < tile.len[a];
                        const int real = tile.g[a] + p.dilation[a] * q[a];
                        in_range = in_range && real >= p.q_lo[a] && real < p.q_hi[a];
                        token = token * p.spatial[a] + real;
                        want = want * (a ? mult : 1) + (k[a] - q[a] + p.kernel[a] - 1);
                      }
                      for (int a = 0; a < 2 && in; ++a) {
                        const AxisRange w = query_window(q[a], tile.len[a], p.kernel[a], 1, p.causal[a] != 0);
                        in = k[a] >= w.start && k[a] < w.start + w.count;
                      }
                      if (kept != (in && in_range)) return fail("mask bit", p, cta, warp, lane);
                      if (!kept) continue;
                      // the staged slot holds the query (and its LSE / delta row is its token's)
                      // (the staging's split of a slot: backward_dkv_squares.cuh, fetch)
                      const int qy = Sq::slot_row(slot, W, square_dkv_row_recip(W));
                      if (slot >= slab_queries || y0 + qy != q[0] || tile.lo[1] + slot - qy * W != q[1])
                        return fail("the staged slot", p, cta, warp, lane);
                      if (strip_query_token<2>(p, tile, 0, q[0], q[1]) != token)
                        return fail("the staged query's token", p, cta, warp, lane);
                      if (square_key_bias(s, y, c, j, e, lane) != want) return fail("RPB index", p, cta, warp, lane);
                      if (square_key_bias(s, y, c, 0, 2 * r, lane) - 8 * j - e % 2 != want)
                        return fail("RPB index from the step's", p, cta, warp, lane);
                      kept_by_key[lane / 4 + 8 * r] += 1;
                    }
                }
              }
            }
          }
        }
        if (tile.tiles == 0) continue;
        // every query of the range whose window holds the key, once
        for (int m = 0; m < 16; ++m) {
          const int kr = Sq::key_row(warp, m);
          const int k[2] = {tile.q0[0] + KB::offset(kr, 0), tile.q0[1] + KB::offset(kr, 1)};
          int want = k[0] < tile.len[0] && k[1] < tile.len[1];
          for (int a = 0; a < 2 && want; ++a) want *= queries_seeing(p, tile, a, k[a]);
          if (kept_by_key[m] != want) return fail("the walk does not keep each query of a key once", p, cta, warp, m);
        }
      }
      for (int i = 0; i < 64; ++i)
        if (rows_seen[i] != 1) return fail("the squares do not cover the key box once", p, cta, 0, 0);
    }
  }
  return 0;
}

int main() {
  long long checks = 0, two_steps = 0;
  for (int W = 8; W <= SquareDkvBox<true>::kMaxSlabCols; W += 8)  // the reciprocal division, every slot
    for (int q = 0; q <= kSquareDkvSlabTokens + kSquareDkvPad; ++q, ++checks)
      if (square_dkv_slot_row(q, square_dkv_row_recip(W)) != q / W) {
        printf("FAIL square_dkv_slot_row(%d) at width %d\n", q, W);
        return 1;
      }
  // (slabs of 256 queries; of 192 at head dim 64 in the NATTN_SM90_SQUARE_DKV_THREE_CTAS build;
  // of half those with NATTN_SM90_SQUARE_DKV_STAGES=2)
  for (int tokens : {kSquareDkvSlabTokens, 192, 128, 96}) {
    const int count = tokens == kSquareDkvSlabTokens ? 1500 : 400;
    if (check_problems<false>(count, tokens, checks, two_steps) || check_problems<true>(count, tokens, checks, two_steps))
      return 1;
  }
  if (two_steps == 0) {
    printf("FAIL no warp drawn walks two steps a line\n");
    return 1;
  }
  printf("ok %lld (%lld warps of two steps)\n", checks, two_steps);
  return 0;
}
