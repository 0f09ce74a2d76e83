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

// Queries [start, start + count) (group coordinates) whose window holds key jg.
// Window start and end are non-decreasing in the query, so the set is one range:
// two binary searches find it.
NATTN_HD AxisRange key_inverse(int jg, int len_g, int k, int s, bool causal) {
  int lo = 0, hi = len_g;  // first query whose window end >= jg
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const AxisRange w = query_window(mid, len_g, k, s, causal);
    if (w.start + w.count - 1 >= jg) hi = mid; else lo = mid + 1;
  }
  const int first = lo;
  lo = first; hi = len_g;  // first query whose window start > jg
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const AxisRange w = query_window(mid, len_g, k, s, causal);
    if (w.start > jg) hi = mid; else lo = mid + 1;
  }
  return {first, lo - first};
}

// Number of tokens of dilation group g along an axis of length len: ceil((len - g) / d).
NATTN_HD int group_len(int len, int g, int d) { return d == 1 ? len - g : (len - g + d - 1) / d; }

}  // namespace nattn
