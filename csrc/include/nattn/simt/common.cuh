// The SIMT family's shared pieces: its tuning knobs (channels per thread, keys / queries per
// inner step), the query group's shuffle reductions, the window cursor over key / query
// boxes (offsets kept by adds), the axis strides and the query windows.
#pragma once
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/common/vec.cuh"
#include "nattn/common/window.cuh"
#include "nattn/simt/launch.h"

// Tuning knobs (overridable with -D for tuning builds): channels per thread, and the
// number of keys (queries) handled per step of the forward (backward) inner loops.
#ifndef NATTN_SIMT_CPT
#define NATTN_SIMT_CPT 16
#endif
#ifndef NATTN_SIMT_FWD_CHUNK
#define NATTN_SIMT_FWD_CHUNK 2
#endif
#ifndef NATTN_SIMT_BWD_CHUNK
#define NATTN_SIMT_BWD_CHUNK 1
#endif

namespace nattn { namespace simt {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kFwdChunk = NATTN_SIMT_FWD_CHUNK;
constexpr int kBwdChunk = NATTN_SIMT_BWD_CHUNK;

// Channels per thread for a head-dim bucket (at least one thread per query).
template <int HD> __host__ __device__ constexpr int cpt() { return HD < NATTN_SIMT_CPT ? HD : NATTN_SIMT_CPT; }
template <int HD> __host__ __device__ constexpr int tpq() { return HD / cpt<HD>(); }

template <int TPQ>
__device__ __forceinline__ unsigned group_mask() {
  if constexpr (TPQ == 32) {
    return 0xffffffffu;
  } else {
    const unsigned lane = threadIdx.x & 31u;
    return ((1u << TPQ) - 1u) << (lane & ~unsigned(TPQ - 1));
  }
}

// Sums N values over the thread group (independent shuffles interleave).
template <int TPQ, int N>
__device__ __forceinline__ void group_sum_n(float* x, unsigned mask) {
#pragma unroll
  for (int o = TPQ / 2; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] += __shfl_xor_sync(mask, x[i], o);
  }
}

// Row-major coordinates of a flat token index.
template <int NA>
NATTN_HD void unravel(int64_t t, const int* spatial, int* c) {
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    c[a] = int(t % spatial[a]);
    t /= spatial[a];
  }
}

template <int NA>
NATTN_HD int64_t token_offset(const int* c, const int64_t* s) {
  int64_t o = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) o += int64_t(c[a]) * s[1 + a];
  return o;
}

// Walks the box [start, start + count) per axis (dilation-group coordinates) in
// row-major order, keeping NOFF memory offsets and an RPB index up to date with adds.
// Offset t of point j is sum_a (j[a] * dil[a] + g[a]) * stride_t[a]; the RPB index is
// sum_a (sign * j[a] + base[a]) * rpb_mult[a].
template <int NA, int NOFF>
struct BoxCursor {
  int left[3], count[3];
  int64_t off[NOFF], step[NOFF][3], wrap[NOFF][3];
  int rpb, rpb_step[3], rpb_wrap[3];

  NATTN_HD BoxCursor(const AxisRange* r, const int* g, const Params& p,
                                       const int64_t* const* strides, int rpb_sign,
                                       const int* rpb_other) {
    int mult = 1, rmult[3];
#pragma unroll
    for (int a = NA - 1; a >= 0; --a) {
      rmult[a] = mult;
      mult *= p.rpb_size[a];
    }
    rpb = 0;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      left[a] = r[a].count;
      count[a] = r[a].count;
      rpb_step[a] = rpb_sign * rmult[a];
      // RPB slot of (key jg, query ig) on this axis: jg - ig + k - 1
      const int slot = rpb_sign > 0 ? r[a].start - rpb_other[a] : rpb_other[a] - r[a].start;
      rpb += (slot + p.kernel[a] - 1) * rmult[a];
    }
#pragma unroll
    for (int t = 0; t < NOFF; ++t) {
      off[t] = 0;
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        const int64_t s = strides[t][a];
        off[t] += int64_t(r[a].start * p.dilation[a] + g[a]) * s;
        step[t][a] = int64_t(p.dilation[a]) * s;
      }
    }
    // Moving to the next point: the last axis steps; an axis that runs out rewinds
    // (minus count * step) and the axis before it steps.
#pragma unroll
    for (int a = 0; a < NA; ++a) {
#pragma unroll
      for (int t = 0; t < NOFF; ++t) wrap[t][a] = a > 0 ? step[t][a - 1] - count[a] * step[t][a] : 0;
      rpb_wrap[a] = a > 0 ? rpb_step[a - 1] - count[a] * rpb_step[a] : 0;
    }
  }

  NATTN_HD void next() {
    constexpr int last = NA - 1;
    if (--left[last] > 0 || NA == 1) {
#pragma unroll
      for (int t = 0; t < NOFF; ++t) off[t] += step[t][last];
      rpb += rpb_step[last];
      return;
    }
    left[last] = count[last];
#pragma unroll
    for (int t = 0; t < NOFF; ++t) off[t] += wrap[t][last] + step[t][last];
    rpb += rpb_wrap[last] + rpb_step[last];
    if constexpr (NA == 3) {
      if (--left[1] == 0) {
        left[1] = count[1];
#pragma unroll
        for (int t = 0; t < NOFF; ++t) off[t] += wrap[t][1];
        rpb += rpb_wrap[1];
      }
    }
  }
};

template <int NA>
NATTN_HD int box_size(const AxisRange* r) {
  int n = 1;
#pragma unroll
  for (int a = 0; a < NA; ++a) n *= r[a].count;
  return n;
}

// Per-axis spatial strides of a tensor (the cursor's layout) and row-major token strides.
struct AxisStrides {
  int64_t s[3];
};

NATTN_HD AxisStrides axis_strides(const int64_t* st) {
  return {{st[1], st[2], st[3]}};
}

template <int NA>
NATTN_HD AxisStrides token_strides(const int* spatial) {
  AxisStrides t{{0, 0, 0}};
  int64_t m = 1;
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    t.s[a] = m;
    m *= spatial[a];
  }
  return t;
}

// The cursor of a query's window keys (forward, dQ pass): K and V offsets, and with dropout
// the keys' token indices (the mask's words) as a third stream.
template <int NA, bool kDrop>
__device__ __forceinline__ BoxCursor<NA, kDrop ? 3 : 2> key_cursor(const Params& p, const AxisRange* win,
                                                                  const int* g, const int* ig) {
  const AxisStrides ks = axis_strides(p.k_s), vs = axis_strides(p.v_s);
  AxisStrides ts;
  const int64_t* strides[kDrop ? 3 : 2] = {ks.s, vs.s};
  if constexpr (kDrop) {
    ts = token_strides<NA>(p.spatial);
    strides[2] = ts.s;
  }
  return BoxCursor<NA, kDrop ? 3 : 2>(win, g, p, strides, +1, ig);
}

// Token i's coordinates c, dilation group g and index in the group ig per axis, and its
// window there: the keys a query sees (forward, dQ) or, kInverse, the queries that see a
// key (dK/dV).
template <int NA, bool kInverse = false>
__device__ __forceinline__ void token_windows(int64_t i, const Params& p, int* c, int* g, int* ig,
                                              AxisRange* win) {
  unravel<NA>(i, p.spatial, c);
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    g[a] = c[a] % p.dilation[a];
    ig[a] = c[a] / p.dilation[a];
    const int len = group_len(p.spatial[a], g[a], p.dilation[a]);
    win[a] = axis_range<kInverse>(p, a, ig[a], len);
  }
}

}  }  // namespace nattn::simt
