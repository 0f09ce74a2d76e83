// Host-side check of the SIMT family's index math (runs on the CPU, no GPU needed):
// per-axis windows against docs/semantics.md written out directly, the inverse ranges against
// brute force, and BoxCursor's incremental offsets / RPB indices against direct formulas.
// Prints "ok <checks>" or the first mismatch (exit code 1).
#include <stdio.h>
#include <stdlib.h>

#include "nattn/simt/kernels.cuh"

using namespace nattn;
using nattn::simt::BoxCursor;
using nattn::simt::box_size;

#define NATTN_CHECK_SEED 88172645463325252ull
#include "host_rng.h"

// docs/semantics.md, one axis, in group coordinates: is key jg in the window of query ig?
static bool in_window(int ig, int jg, int len_g, int k, int s, bool causal) {
  const int block = (ig / s) * s;
  if (causal) {
    int l = block + s - 1; if (l > len_g - 1) l = len_g - 1;
    return jg <= ig && l - jg < k && jg >= 0;
  }
  int l = block + s / 2; if (l > len_g - 1) l = len_g - 1;
  const int rl = k / 2, rr = k / 2 + k % 2 - 1;
  int c0 = l; if (c0 > len_g - 1 - rr) c0 = len_g - 1 - rr; if (c0 < rl) c0 = rl;
  return c0 - rl <= jg && jg <= c0 + rr;
}

#define CHECK(cond, ...) do { ++checks; if (!(cond)) { printf(__VA_ARGS__); printf("\n"); return 1; } } while (0)

template <int NA>
static int check_cursor(long long& checks) {
  Params p = {};
  int g[3], other[3];
  AxisRange r[3];
  for (int a = 0; a < 3; ++a) {
    p.kernel[a] = rnd(2, 9); p.dilation[a] = rnd(1, 3); p.spatial[a] = rnd(20, 60);
    p.rpb_size[a] = 2 * p.kernel[a] - 1;
    r[a].start = rnd(0, 5); r[a].count = rnd(1, 6);
    g[a] = rnd(0, p.dilation[a] - 1); other[a] = rnd(0, 8);
  }
  int64_t s0[3] = {rnd(1, 1000), rnd(1, 1000), rnd(1, 1000)}, s1[3] = {rnd(1, 99), rnd(1, 99), rnd(1, 99)};
  const int64_t* strides[2] = {s0, s1};
  for (int sign = -1; sign <= 1; sign += 2) {
    BoxCursor<NA, 2> cur(r, g, p, strides, sign, other);
    int j[3] = {0, 0, 0}, n = 0;
    const int total = box_size<NA>(r);
    for (j[0] = r[0].start; j[0] < r[0].start + r[0].count; ++j[0])
      for (j[1] = NA > 1 ? r[1].start : 0; j[1] < (NA > 1 ? r[1].start + r[1].count : 1); ++j[1])
        for (j[2] = NA > 2 ? r[2].start : 0; j[2] < (NA > 2 ? r[2].start + r[2].count : 1); ++j[2]) {
          int64_t o0 = 0, o1 = 0;
          int rp = 0;
          for (int a = 0; a < NA; ++a) {
            o0 += int64_t(j[a] * p.dilation[a] + g[a]) * s0[a];
            o1 += int64_t(j[a] * p.dilation[a] + g[a]) * s1[a];
            const int slot = sign > 0 ? j[a] - other[a] : other[a] - j[a];
            rp = rp * p.rpb_size[a] + slot + p.kernel[a] - 1;
          }
          CHECK(cur.off[0] == o0 && cur.off[1] == o1 && cur.rpb == rp,
                "cursor NA=%d sign=%d point %d: off (%lld,%lld) rpb %d, want (%lld,%lld) %d", NA, sign,
                n, (long long)cur.off[0], (long long)cur.off[1], cur.rpb, (long long)o0, (long long)o1, rp);
          cur.next();
          ++n;
        }
    CHECK(n == total, "box size %d != %d", total, n);
  }
  return 0;
}

int main() {
  long long checks = 0;
  // every (k, s, len_g, causal) up to k = 13, len_g = k + 40, then random larger ones
  for (int it = 0; it < 13 * 13 * 41 * 2 + 3000; ++it) {
    int k, s, len_g;
    bool causal;
    if (it < 13 * 13 * 41 * 2) {
      int r = it;
      k = 1 + r % 13; r /= 13;
      s = 1 + r % 13; r /= 13;
      len_g = k + r % 41; r /= 41;
      causal = r != 0;
      if (s > k) continue;
    } else {
      k = rnd(2, 40); s = rnd(1, k); len_g = k + rnd(0, 90);
      causal = rnd(0, 1);
    }
    for (int ig = 0; ig < len_g; ++ig) {
      const AxisRange w = query_window(ig, len_g, k, s, causal);
      for (int jg = -1; jg <= len_g; ++jg) {
        const bool got = jg >= w.start && jg < w.start + w.count;
        CHECK(got == in_window(ig, jg, len_g, k, s, causal),
              "window L=%d k=%d s=%d causal=%d query %d key %d", len_g, k, s, causal, ig, jg);
      }
    }
    Params p = {};  // one axis: axis_range_selects (the tensor-core family's) must equal key_inverse
    p.kernel[0] = k;
    p.stride[0] = s;
    p.causal[0] = causal;
    for (int jg = 0; jg < len_g; ++jg) {
      const AxisRange inv = key_inverse(jg, len_g, k, s, causal);
      for (int ig = 0; ig < len_g; ++ig) {
        const bool got = ig >= inv.start && ig < inv.start + inv.count;
        CHECK(got == in_window(ig, jg, len_g, k, s, causal),
              "inverse L=%d k=%d s=%d causal=%d key %d query %d", len_g, k, s, causal, jg, ig);
      }
      const AxisRange sel = axis_range_selects<true>(p, 0, jg, len_g);
      CHECK(sel.start == inv.start && sel.count == inv.count, "selects L=%d k=%d s=%d causal=%d key %d: %d+%d vs %d+%d",
            len_g, k, s, causal, jg, sel.start, sel.count, inv.start, inv.count);
    }
  }
  for (int it = 0; it < 300; ++it) {
    if (check_cursor<1>(checks) || check_cursor<2>(checks) || check_cursor<3>(checks)) return 1;
  }
  printf("ok %lld\n", checks);
  return 0;
}
