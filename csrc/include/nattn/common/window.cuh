// Per-axis NA windows (docs/semantics.md), in dilation-group coordinates, and their inverse.
#pragma once

// Host and device: the host-side unit test (tests/test_cuda_window_math.py) runs them on the CPU.
#define NATTN_HD __host__ __device__ __forceinline__

namespace nattn {

NATTN_HD int nattn_min(int a, int b) { return a < b ? a : b; }
NATTN_HD int nattn_max(int a, int b) { return a > b ? a : b; }

// Keys [start, start + count) (group coordinates) seen by group coordinate ig.
struct AxisRange { int start, count; };

NATTN_HD AxisRange query_window(int ig, int len_g, int k, int s, bool causal) {
  const int block = s == 1 ? ig : (ig / s) * s;  // no integer division in the common case
  if (causal) {
    const int leader = nattn_min(block + s - 1, len_g - 1);
    const int start = nattn_max(0, leader - k + 1);
    return {start, ig - start + 1};  // ends at the query itself
  }
  const int leader = nattn_min(block + s / 2, len_g - 1);
  const int left = k / 2, right = k / 2 + k % 2 - 1;
  const int centre = nattn_max(nattn_min(leader, len_g - 1 - right), left);
  return {centre - left, k};  // shifts inward at the borders, never shrinks
}

// The first query whose window centre (start + k / 2) is >= t, without causality: the centre
// is the query's stride-block leader (block + s / 2) clamped to [k / 2, len_g - 1 - right], so
// past the clamps it is the first block >= t - s / 2. (Needs len_g >= k, 1 <= s <= k: the
// argument checks guarantee both.)
NATTN_HD int first_centre_at_least(int t, int len_g, int k, int s) {
  const int left = k / 2, right = k / 2 + k % 2 - 1;
  if (t <= left) return 0;
  if (t > len_g - 1 - right) return len_g;
  const int need = t - s / 2;  // block(i) >= need
  if (need <= 0) return 0;
  return nattn_min(len_g, s == 1 ? need : (need + s - 1) / s * s);
}

// Queries [start, start + count) (group coordinates) whose window holds key jg. Window start
// and end are non-decreasing in the query, so the set is one range; closed forms (a binary
// search over query_window cost the backward's key rows ~1000 instructions a warp).
NATTN_HD AxisRange key_inverse(int jg, int len_g, int k, int s, bool causal) {
  if (causal) {
    // start(i) <= jg <= i: from jg to the first query whose window starts past jg, i.e. whose
    // leader min(block + s - 1, len_g - 1) reaches jg + k
    int end = len_g;
    if (jg + k <= len_g - 1) {
      const int need = jg + k - s + 1;  // block(i) >= need (> 0: s <= k)
      end = nattn_min(len_g, s == 1 ? need : (need + s - 1) / s * s);
    }
    return {jg, end - jg};
  }
  const int left = k / 2;
  const int first = first_centre_at_least(jg - k + 1 + left, len_g, k, s);  // window end >= jg
  const int end = first_centre_at_least(jg + 1 + left, len_g, k, s);        // window start > jg
  return {first, end - first};
}

// Along axis a of problem P: the keys token ig sees, or (kInverse) the queries that see key ig.
template <bool kInverse, class P>
NATTN_HD AxisRange axis_range(const P& p, int a, int ig, int len_g) {
  const bool c = p.causal[a] != 0;
  return kInverse ? key_inverse(ig, len_g, p.kernel[a], p.stride[a], c)
                  : query_window(ig, len_g, p.kernel[a], p.stride[a], c);
}

// axis_range with the inverse of a stride-1 window without causality by selects: the
// first query whose window ends at or after key jg and the first whose window starts past
// it (first_centre_at_least at stride 1). The tensor-core family's setup finds 4-12 inverse
// ranges per lane, where key_inverse's early returns compiled to ~20 instructions with
// three branches each (~8% of a DiNAT-sized dK/dV pass's instructions; PERF.md
// thirty-second session). The Hopper family keeps key_inverse: this form made its dK/dV
// passes spill.
template <bool kInverse, class P>
NATTN_HD AxisRange axis_range_selects(const P& p, int a, int ig, int len_g) {
  if (kInverse && p.stride[a] == 1 && p.causal[a] == 0) {
    const int k = p.kernel[a], left = k / 2, last = len_g - 1 - (k / 2 + k % 2 - 1);
    const int t0 = ig - k + 1 + left, t1 = ig + 1 + left;
    const int first = t0 <= left ? 0 : (t0 > last ? len_g : t0);
    const int end = t1 <= left ? 0 : (t1 > last ? len_g : t1);
    return {first, end - first};
  }
  return axis_range<kInverse>(p, a, ig, len_g);
}

// Number of tokens of dilation group g along an axis of length len: ceil((len - g) / d).
NATTN_HD int group_len(int len, int g, int d) { return d == 1 ? len - g : (len - g + d - 1) / d; }

}  // namespace nattn
