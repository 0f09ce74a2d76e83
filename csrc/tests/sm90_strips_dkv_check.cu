// Host-side check of the strip dK/dV pass's geometry (csrc/include/nattn/sm90/strip_geometry.cuh,
// "the strip dK/dV pass"; backward_dkv_strips.cuh; runs on the CPU, no GPU): for random 2-D and
// 3-D problems within the strip pairs' limits (stride 1, windows up to 7 x 9 / 7 x 7 x 9;
// dilation, causal axes, even kernels, grids ending in partial boxes; some with a query range),
// every key CTA, warp, lane, slab (column pass, frame), line and score (j, e) the kernel walks:
//   - the union fits the slab box (its rows) and two column passes;
//   - the line is inside the slab box, and the LSE / delta slot the line reads is the query's
//     (the staging's order: line-major, 16 columns; its token, strip_query_token);
//   - the score's mask is set exactly when the query exists and its window holds the key;
//   - its RPB index is (key - query + kernel - 1) per axis, row-major, where the mask is set,
//     and the line's index for the key minus 8 j + e % 2 (the kernel's form);
// and each key's walk keeps every query of the range whose window holds it exactly once.
// Narrow warps (strip_key_lane_narrow; every warp where the columns axis' groups are at most 8
// long): their k16 steps pair lines y and y + 1 (first 8 columns each); every kept score of
// the wide walk is kept by exactly one narrow step, at the RPB index line y's gives minus one
// row for the second line, and the line past the warp's last is masked in every lane.
// The fixed-point dRPB's adds (StripDrpbLayout): with four table copies, the 32 lanes of a
// step add at 32 distinct banks (a kept score at its copy's entry, a masked one at the sink's
// slot of the same bank, or in the guard form at its own index: the same bank), every
// score's index (masked ones too) lies within kStripDkvGuard entries of its head's table,
// and the layout's strides and sizes hold what the kernel assumes (the default build lays the
// tables out in the guard form; built with -DNATTN_SM90_STRIP_DKV_GUARD=0 too, the sink form:
// tests/test_cuda_window_math.py).
// Prints "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>
#include <string.h>

#include "nattn/sm90/strip_geometry.cuh"
#include "nattn/sm90/tiles.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x2ba4c5d9e1f38a67ull
#include "host_rng.h"
#include "sm90_problems.h"

static int fail(const char* what, const Params& p, long long cta, int warp, int lane) {
  printf("FAIL %s: %d-D spatial %dx%dx%d kernel %dx%dx%d dilation %dx%dx%d causal %d%d%d range [%d %d %d, %d %d %d), "
         "cta %lld warp %d lane %d\n",
         what, p.na_dim, p.spatial[0], p.spatial[1], p.spatial[2], p.kernel[0], p.kernel[1], p.kernel[2],
         p.dilation[0], p.dilation[1], p.dilation[2], p.causal[0], p.causal[1], p.causal[2], p.q_lo[0], p.q_lo[1],
         p.q_lo[2], p.q_hi[0], p.q_hi[1], p.q_hi[2], cta, warp, lane);
  return 1;
}

// The banks of a warp's fixed-point dRPB adds, step by step, with four table copies (the
// stride strip_drpb_layout gives them; the kernel's address forms): 1 if two lanes share one,
// 2 if a score's index lies past the guards.
template <int NA>
static int check_drpb_banks(const Params& p, const CtaTile& tile, int warp, int passes, long long& checks) {
  constexpr int R = NA - 2;
  const int entries = p.rpb_size[0] * p.rpb_size[1] * p.rpb_size[2];
  const int stride = strip_drpb_layout(1).stride + (entries + 31) / 32 * 32;  // = 10 mod 32, >= entries
  StripKeyLane s[32];
  for (int lane = 0; lane < 32; ++lane) strip_key_lane<NA, StripDkvKeyBox<NA>>(p, tile, warp, lane, s[lane]);
  for (int f = 0; f < passes * (NA == 3 ? tile.nk[0] : 1); ++f) {
    const int cp = NA == 3 ? f / tile.nk[0] : f;
    const int t = NA == 3 ? tile.lo[0] + f % tile.nk[0] : 0;
    if (NA == 3 && (t < s[0].t_lo || t > s[0].t_hi)) continue;
    const int y_end = nattn_min(s[0].w_hi, tile.lo[R] + kStripDkvRows - 1);
    for (int y = nattn_max(s[0].w_lo, tile.lo[R]); y <= y_end; ++y)
      for (int j = 0; j < 2; ++j)
        for (int e = 0; e < 4; ++e) {
          unsigned banks = 0;
          for (int lane = 0; lane < 32; ++lane) {
            const int copy = (lane % 4) * stride;
            const int at = strip_key_bias(s[lane], tile, NA, t, y, cp, 0, 2 * (e / 2), lane) - 8 * j - e % 2;
            const bool kept = strip_key_kept(s[lane], y, cp, j, e);
            if (kept && (at < 0 || at >= entries)) return 1;
            if (at < -kStripDkvGuard || at >= entries + kStripDkvGuard) return 2;  // (the guards hold it)
            const int word = kept ? copy + at : 1 << 20 | ((copy + at) & 31);  // (the sink: bank 0 based)
            banks |= 1u << (word & 31);
          }
          ++checks;
          if (banks != 0xffffffffu) return 1;
        }
  }
  return 0;
}

// A warp's narrow steps against its wide walk (see the top): 1 on a mismatch.
static long long narrow_warps = 0;
template <int NA>
static int check_narrow_steps(const Params& p, const CtaTile& tile, int warp, long long& checks) {
  constexpr int R = NA - 2;
  StripKeyLane s[32];
  bool narrow = true;
  for (int lane = 0; lane < 32; ++lane) {
    strip_key_lane<NA, StripDkvKeyBox<NA>>(p, tile, warp, lane, s[lane]);
    narrow = narrow && strip_key_lane_narrow(s[lane]);
  }
  if (strip_problem_narrow(p) && !narrow) return 1;
  if (!narrow) return 0;
  ++narrow_warps;
  const int entries = p.rpb_size[0] * p.rpb_size[1] * p.rpb_size[2];
  for (int t = NA == 3 ? tile.lo[0] : 0; t < (NA == 3 ? tile.lo[0] + tile.nk[0] : 1); ++t) {
    if (NA == 3 && (t < s[0].t_lo || t > s[0].t_hi)) continue;
    const int y_end = nattn_min(s[0].w_hi, tile.lo[R] + kStripDkvRows - 1);
    const int y0 = nattn_max(s[0].w_lo, tile.lo[R]);
    for (int lane = 0; lane < 32; ++lane) {
      int kept_wide = 0, kept_narrow = 0;
      for (int y = y0; y <= y_end; ++y)
        for (int j = 0; j < 2; ++j)
          for (int e = 0; e < 4; ++e) kept_wide += strip_key_kept(s[lane], y, 0, j, e) + strip_key_kept(s[lane], y, 1, j, e);
      for (int y = y0; y <= y_end; y += 2)
        for (int j = 0; j < 2; ++j)
          for (int e = 0; e < 4; ++e) {
            ++checks;
            // the kernel's form: line y + j's rows, column bit e % 2 of the first pass
            const int yj = y + j, r = e / 2;
            const bool kept = yj >= s[lane].y_lo[r] && yj <= s[lane].y_hi[r] && ((s[lane].cols >> (e % 2)) & 1u);
            if (kept != strip_key_kept(s[lane], yj, 0, 0, e) || (kept && yj > y_end)) return 1;
            const int at = strip_key_bias(s[lane], tile, NA, t, y, 0, 0, 2 * r, lane) - j * s[lane].row_mult - e % 2;
            if (kept && at != strip_key_bias(s[lane], tile, NA, t, yj, 0, 0, e, lane)) return 1;
            if (at < -kStripDkvGuard || at >= entries + kStripDkvGuard) return 1;  // (the guards hold it)
            kept_narrow += kept;
          }
      if (kept_narrow != kept_wide) return 1;
    }
  }
  return 0;
}

// StripDrpbLayout's invariants over the table sizes a KV head's query heads stage.
static int check_drpb_layout(long long& checks) {
  for (int entries = 1; entries <= kSmallRpbStageFloats; ++entries) {
    const StripDrpbLayout l = strip_drpb_layout(entries);
    ++checks;
    if (l.stride < entries || (l.copies != 4 && l.copies != 1) || (l.copies == 4 && l.stride % 32 != 10) ||
        (l.copies == 4 && 4 * 4 * l.stride > kStripDrpbCopyBytes) ||
        l.bytes != 4 * (2 * kStripDrpbLead + entries + l.copies * l.stride) + kStripDrpbTailBytes ||
        l.bytes > kStripDrpbMostBytes) {
      printf("FAIL the dRPB layout of %d entries\n", entries);
      return 1;
    }
  }
  // the sink's slots: 32 ints from the first bank-0 word at or past the copies' end
  return 4 * 31 + 4 * 32 > kDrpbSinkBytes;
}

template <int NA>
static int check_problems(int count, long long& checks) {
  using KB = StripDkvKeyBox<NA>;
  constexpr int R = NA - 2, C = NA - 1;
  constexpr int kLineRows = kStripDkvRows;
  for (int it = 0; it < count; ++it) {
    Params p = strip_problem<NA>();
    if (rnd(0, 3) == 0)  // a halo rank's query range on one axis
      for (int a = rnd(0, NA - 1), n = 0; n < 1; ++n) {
        p.q_lo[a] = rnd(0, p.spatial[a] - 1);
        p.q_hi[a] = rnd(p.q_lo[a] + 1, p.spatial[a]);
      }
    int mult[3] = {1, 1, 1};
    for (int a = NA - 2; a >= 0; --a) mult[a] = mult[a + 1] * p.rpb_size[a + 1];
    for (long long cta = 0; cta < num_key_ctas<KB>(p); ++cta) {
      CtaTile tile;
      if (!cta_tile_inverse<NA, KB, Box<1, 1, 1>>(p, unsigned(cta), tile)) continue;
      const int passes = tile.nk[C] > kStripCols ? 2 : 1;
      if (tile.tiles > 0 && (tile.nk[R] > kLineRows || tile.nk[C] > kStripDkvPasses * kStripCols))
        return fail("the union is larger than the slab box", p, cta, 0, 0);
      for (int warp = 0; warp < 4; ++warp) {
        int kept_by_key[16] = {0};  // the warp's keys (accumulator rows), over the quad's lanes
        for (int lane = 0; lane < 32; ++lane) {
          StripKeyLane s;
          strip_key_lane<NA, KB>(p, tile, warp, lane, s);
          if (tile.tiles == 0) continue;
          for (int r = 0; r < 2; ++r) {
            const int kr = 16 * warp + lane / 4 + 8 * r;  // the key's box row
            int k[3] = {0, 0, 0};
            bool k_ok = true;
            for (int a = 0; a < NA; ++a) {
              k[a] = tile.q0[a] + KB::offset(kr, a);
              k_ok = k_ok && k[a] < tile.len[a];
            }
            for (int f = 0; f < passes * (NA == 3 ? tile.nk[0] : 1); ++f) {
              const int cp = NA == 3 ? f / tile.nk[0] : f;
              const int t = NA == 3 ? tile.lo[0] + f % tile.nk[0] : 0;
              if (NA == 3 && (t < s.t_lo || t > s.t_hi)) continue;
              const int y_end = nattn_min(s.w_hi, tile.lo[R] + kLineRows - 1);
              for (int y = nattn_max(s.w_lo, tile.lo[R]); y <= y_end; ++y) {
                const int li = y - tile.lo[R];
                if (li < 0 || li >= kLineRows) return fail("a line outside the slab box", p, cta, warp, lane);
                for (int j = 0; j < 2; ++j)
                  for (int e = 2 * r; e < 2 * r + 2; ++e) {
                    ++checks;
                    int q[3] = {t, 0, 0};
                    q[R] = y;
                    q[C] = tile.lo[C] + kStripCols * cp + 8 * j + 2 * (lane % 4) + e % 2;
                    // the staged LSE slot the line reads (li * 16 + 8 j + 2 (lane % 4) + e) holds
                    // the query the staging loaded there
                    const int slot = li * kStripCols + 8 * j + 2 * (lane % 4) + e % 2;
                    if (tile.lo[R] + slot / kStripCols != q[R] ||
                        tile.lo[C] + kStripCols * cp + slot % kStripCols != q[C])
                      return fail("the staged LSE slot", p, cta, warp, lane);
                    bool in = k_ok, q_ok = true, in_range = true;
                    int want = 0;
                    long long token = 0;
                    for (int a = 0; a < NA; ++a) {
                      q_ok = q_ok && q[a] < tile.len[a];
                      const int real = tile.g[a] + p.dilation[a] * q[a];
                      in_range = in_range && real >= p.q_lo[a] && real < p.q_hi[a];
                      token = token * p.spatial[a] + real;
                    }
                    // the staged row: the query's token (its LSE / delta row)
                    if (q_ok && strip_query_token<NA>(p, tile, t, y, q[C]) != token)
                      return fail("the staged query's token", p, cta, warp, lane);
                    for (int a = 0; a < NA && in; ++a) {
                      const AxisRange w = query_window(q[a], tile.len[a], p.kernel[a], 1, p.causal[a] != 0);
                      in = q_ok && k[a] >= w.start && k[a] < w.start + w.count;
                    }
                    for (int a = 0; a < NA; ++a) want += (k[a] - q[a] + p.kernel[a] - 1) * mult[a];
                    const bool kept = strip_key_kept(s, y, cp, j, e);
                    if (kept != in) return fail("mask bit", p, cta, warp, lane);
                    if (kept && strip_key_bias(s, tile, NA, t, y, cp, j, e, lane) != want)
                      return fail("RPB index", p, cta, warp, lane);
                    // the kernel takes a line's index per key once and subtracts 8 j + e % 2
                    if (strip_key_bias(s, tile, NA, t, y, cp, 0, 2 * r, lane) - 8 * j - e % 2 !=
                        strip_key_bias(s, tile, NA, t, y, cp, j, e, lane))
                      return fail("RPB index from the line's", p, cta, warp, lane);
                    kept_by_key[lane / 4 + 8 * r] += kept && in_range;
                  }
              }
            }
          }
        }
        if (const int why = tile.tiles > 0 ? check_drpb_banks<NA>(p, tile, warp, passes, checks) : 0)
          return fail(why == 2 ? "an RPB index past the guards" : "dRPB adds of one step share a bank", p, cta, warp, 0);
        if (tile.tiles > 0 && check_narrow_steps<NA>(p, tile, warp, checks))
          return fail("the narrow steps", p, cta, warp, 0);
        // every query of the range whose window holds the key, once
        for (int kr = 0; kr < 16; ++kr) {
          int k[3] = {0, 0, 0};
          bool k_ok = true;
          for (int a = 0; a < NA; ++a) {
            k[a] = tile.q0[a] + KB::offset(16 * warp + kr, a);
            k_ok = k_ok && k[a] < tile.len[a];
          }
          int want = 0;
          if (k_ok) {
            want = 1;
            for (int a = 0; a < NA; ++a) want *= queries_seeing(p, tile, a, k[a]);
          }
          if (kept_by_key[kr] != want) return fail("the walk does not keep each query of a key once", p, cta, warp, kr);
        }
      }
    }
  }
  return 0;
}

int main() {
  long long checks = 0;
  if (check_drpb_layout(checks) || check_problems<2>(3000, checks) || check_problems<3>(300, checks)) return 1;
  if (narrow_warps == 0) {
    printf("FAIL no problem drawn has narrow warps\n");
    return 1;
  }
  printf("ok %lld (%lld narrow warps)\n", checks, narrow_warps);
  return 0;
}
