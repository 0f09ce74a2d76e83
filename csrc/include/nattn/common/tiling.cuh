// Warp tiles over the NA grid (the tensor-core family): a warp serves a box of tokens of
// one dilation group and walks the union of their windows packed (row-major, chunks may
// span line ends), with per-token window checks.
#pragma once
#include "nattn/common/registry.h"
#include "nattn/common/window.cuh"

namespace nattn { namespace tiling {

// Box of tokens one warp serves, per axis: the last axis takes 4 (1-D: all), the others
// share the rest (16 tokens: 4x4 in 2-D, 2x2x4 in 3-D).
__host__ __device__ constexpr int box_dim(int na, int qw, int a) {
  return na == 1 ? qw : a == na - 1 ? 4 : na == 2 ? qw / 4 : (a == 0 ? (qw / 4 >= 4 ? 2 : 1) : (qw / 4 >= 2 ? 2 : 1));
}

// The fixed box shape (box_dim) as the per-axis array the functions below take.
template <int NA, int QW>
NATTN_HD void fixed_box(int* box) {
#pragma unroll
  for (int a = 0; a < 3; ++a) box[a] = a < NA ? box_dim(NA, QW, a) : 1;
}

// The box of `tokens` tokens that needs the fewest staged key slots over the whole problem:
// per warp, the union of its windows rounded up to whole chunks of `chunk` (the packed
// walk below), times the number of warps. Ties go to the longer last-axis box (longer
// contiguous runs). Opt-in (NATTN_TC_BOX=model) until measured on its own.
inline void model_box(Params& p, int tokens, int chunk) {
  const int na = p.na_dim, A = na - 1;
  int best[3] = {1, 1, tokens};
  double best_cost = -1;
  for (int b0 = 1; b0 <= tokens; b0 *= 2)
    for (int b1 = 1; b0 * b1 <= tokens; b1 *= 2) {
      int box[3] = {1, 1, 1};
      if (na == 1) { if (b0 > 1 || b1 > 1) continue; box[0] = tokens; }
      else if (na == 2) { if (b1 > 1) continue; box[0] = b0; box[1] = tokens / b0; }
      else { box[0] = b0; box[1] = b1; box[2] = tokens / (b0 * b1); }
      double warps = 1;
      int64_t slots = 1;
      for (int a = 0; a < na; ++a) {
        const int m = (p.spatial[a] + p.dilation[a] - 1) / p.dilation[a];
        warps *= double((m + box[a] - 1) / box[a]);
        slots *= nattn_min(box[a] + p.kernel[a] - 1, m);
      }
      const double cost = warps * double((slots + chunk - 1) / chunk * chunk);
      // ties: the longer last-axis box (contiguous rows)
      if (best_cost < 0 || cost < best_cost || (cost == best_cost && box[A] > best[A])) {
        best_cost = cost;
        for (int a = 0; a < 3; ++a) best[a] = box[a];
      }
    }
  for (int a = 0; a < 3; ++a) p.box[a] = a < na ? best[a] : 1;
}

// Number of warps for a problem: per axis, dilation groups x boxes along the longest group.
template <int NA>
inline int64_t num_warps(const Params& p, const int* box) {
  int64_t n = 1;
  for (int a = 0; a < NA; ++a) {
    const int d = p.dilation[a], m = (p.spatial[a] + d - 1) / d, bx = box[a];
    n *= int64_t((m + bx - 1) / bx) * d;
  }
  return n;
}

// log2 of a box extent: every box is a power of two per axis (fixed_box, model_box), so the
// kernels split token indices with shifts and masks instead of divisions.
NATTN_HD int box_shift(int bx) {
#ifdef __CUDA_ARCH__
  return __ffs(bx) - 1;
#else
  int s = 0;
  while ((1 << s) < bx) ++s;
  return s;
#endif
}

// Which box a warp serves: per axis its dilation group g, group length L and first
// group coordinate. False when the warp has no token (past the grid, or a short group).
// 32-bit unsigned arithmetic (w < 2^31: the launch's grid.x times its warps), one division
// per axis without dilation (they were ~20 signed / 64-bit divisions of a warp's setup).
template <int NA>
NATTN_HD bool warp_box(const Params& p, const int* box, int64_t w64, int* g, int* L, int* first) {
  unsigned w = unsigned(w64);
  bool ok = true;
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    const unsigned d = unsigned(p.dilation[a]), sh = unsigned(box_shift(box[a]));
    const unsigned m = d == 1 ? unsigned(p.spatial[a]) : (unsigned(p.spatial[a]) + d - 1) / d;
    const unsigned nt = (m + (1u << sh) - 1) >> sh;  // boxes along the longest group
    const unsigned per = nt * d;
    const unsigned q = w / per, idx = w - q * per;
    w = q;
    const unsigned gi = d == 1 ? 0u : idx / nt;
    g[a] = int(gi);
    first[a] = int((idx - gi * nt) << sh);
    L[a] = group_len(p.spatial[a], g[a], p.dilation[a]);
    ok = ok && first[a] < L[a];
  }
  return ok && w == 0;
}

// The lane's token in the box (group coordinates, clamped into the group) and whether it is real.
template <int NA>
NATTN_HD bool lane_token(const int* box, int t, const int* first, const int* L, int* ig) {
  bool ok = true;
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    const int sh = box_shift(box[a]);
    const int c = first[a] + (t & ((1 << sh) - 1));
    t >>= sh;
    ok = ok && c < L[a];
    ig[a] = c < L[a] ? c : L[a] - 1;
  }
  return ok;
}

// Row-major multipliers of the RPB table [2k-1, ...] per axis.
template <int NA>
NATTN_HD void rpb_mults(const Params& p, int* rmult) {
  int m = 1;
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    rmult[a] = m;
    m *= p.rpb_size[a];
  }
}

// Row-major token index and tensor offset of a token given in group coordinates.
template <int NA>
NATTN_HD int64_t token_index(const Params& p, const int* ig, const int* g) {
  int64_t t = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) t = t * p.spatial[a] + (ig[a] * p.dilation[a] + g[a]);
  return t;
}

template <int NA>
NATTN_HD int64_t spatial_offset(const Params& p, const int64_t* s, const int* ig, const int* g) {
  int64_t o = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) o += int64_t(ig[a] * p.dilation[a] + g[a]) * s[1 + a];
  return o;
}

// Window unions of the warp's box: windows move monotonically with the token, so the
// union runs from the first token's start to the last token's end.
template <int NA, bool kInverse>
NATTN_HD void box_union(const Params& p, const int* box, const int* first, const int* L,
                                          AxisRange* u) {
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const int last = nattn_min(first[a] + box[a], L[a]) - 1;
    const AxisRange lo = axis_range_selects<kInverse>(p, a, first[a], L[a]);
    const AxisRange hi = axis_range_selects<kInverse>(p, a, last, L[a]);
    u[a] = {lo.start, hi.start + hi.count - lo.start};
  }
}

// The union walked packed: its tokens row-major (the last axis fastest), f = 0..size-1, cut
// into chunks of consecutive f. A chunk may span line ends, so only the union's last chunk
// is partly empty (a line-by-line walk pads every line to whole chunks: 10-token lines of a
// 5x7x7 window in 16-token chunks wasted 38% of the work).
template <int NA>
NATTN_HD int union_size(const AxisRange* u) {
  int n = 1;
#pragma unroll
  for (int a = 0; a < NA; ++a) n *= u[a].count;
  return n;
}

// floor(x / n) for a divisor fixed per warp: umulhi(x, floor((2^32 - 1) / n) + 1) is exact
// while x * n < 2^32 (the error of the rounded-up reciprocal, under x / 2^32, stays below the
// 1 / n gap to the next integer). The tc family's unions (windows <= 400 keys) keep
// size * extent below 2^28.
struct FixedDivisor {
  unsigned n, magic;
  NATTN_HD explicit FixedDivisor(int n_ = 1) : n(unsigned(n_)), magic(n_ > 1 ? 0xffffffffu / unsigned(n_) + 1u : 0u) {}
  NATTN_HD unsigned div(unsigned x) const {
#ifdef __CUDA_ARCH__
    const unsigned hi = __umulhi(x, magic);
#else
    const unsigned hi = unsigned((unsigned long long)x * magic >> 32);
#endif
    return n == 1 ? x : hi;
  }
};

// The union's packed index f -> group coordinates c (row-major, the last axis fastest), by
// multiplications: no cursor, no carries across line ends, no branches. Past the union's end
// (f >= size) the coordinates lie outside it; callers mask those tokens.
template <int NA>
struct UnionIndex {
  int start[3];
  FixedDivisor ext[3];

  NATTN_HD explicit UnionIndex(const AxisRange* u) {
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      start[a] = a < NA ? u[a].start : 0;
      ext[a] = FixedDivisor(a < NA ? u[a].count : 1);
    }
  }
  NATTN_HD void coords(int f, int* c) const {
    unsigned q = unsigned(f);
#pragma unroll
    for (int a = NA - 1; a > 0; --a) {
      const unsigned d = ext[a].div(q);
      c[a] = start[a] + int(q - d * ext[a].n);
      q = d;
    }
    c[0] = start[0] + int(q);
#pragma unroll
    for (int a = NA; a < 3; ++a) c[a] = 0;
  }
};

// Whether group coordinates c lie in the per-axis ranges w (a row's window or inverse).
template <int NA>
NATTN_HD bool in_window(const AxisRange* w, const int* c) {
  bool ok = true;
#pragma unroll
  for (int a = 0; a < NA; ++a) ok = ok && unsigned(c[a] - w[a].start) < unsigned(w[a].count);
  return ok;
}

// RPB index (key - query + k - 1 per axis, row-major) split into a query-row part and a
// column part: forward rows are queries, inverse (dK/dV) rows are keys.
template <int NA>
NATTN_HD int rpb_dot(const int* c, const int* rmult) {
  int t = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) t += c[a] * rmult[a];
  return t;
}

template <int NA, bool kInverse>
NATTN_HD int rpb_row_part(const Params& p, const int* ig, const int* rmult) {
  int t = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) t += (p.kernel[a] - 1 + (kInverse ? ig[a] : -ig[a])) * rmult[a];
  return t;
}

template <bool kInverse>
NATTN_HD int rpb_index(int row_part, int col_dot) { return kInverse ? row_part - col_dot : row_part + col_dot; }

// Element offsets of group coordinates in a tensor with token strides s[1 + a] (dilation
// group g folded into base); with two stride sets, `second` picks one per thread (the
// kernels' lanes 0-15 walk K and lanes 16-31 V). The per-axis steps are read from the
// strides when used: in the kernels those are kernel parameters and cost no registers.
template <int NA>
struct GroupStrides {
  const int64_t *s0, *s1;
  const int* dil;
  bool second;
  int64_t base;

  NATTN_HD GroupStrides(const Params& p, const int64_t* s0_, const int* g, const int64_t* s1_ = nullptr,
                        bool second_ = false)
      : s0(s0_), s1(s1_ ? s1_ : s0_), dil(p.dilation), second(second_), base(0) {
#pragma unroll
    for (int a = 0; a < NA; ++a) base += int64_t(g[a]) * stride(a);
  }
  NATTN_HD int64_t stride(int a) const { return second ? s1[1 + a] : s0[1 + a]; }
  NATTN_HD int64_t step(int a) const { return int64_t(dil[a]) * stride(a); }
  NATTN_HD int64_t at(const int* c) const {
    int64_t o = base;
#pragma unroll
    for (int a = 0; a < NA; ++a) o += int64_t(c[a]) * step(a);
    return o;
  }
};

// Row-major token strides of the grid, in the s[1 + a] convention of GroupStrides.
template <int NA>
NATTN_HD void token_strides(const Params& p, int64_t* s) {
  int64_t m = 1;
  s[0] = 0;
#pragma unroll
  for (int a = 2; a >= 0; --a) {
    s[1 + a] = a < NA ? m : 0;
    if (a < NA) m *= p.spatial[a];
  }
}

// Token rows (Params::tok_stride, tok_step, token_rows): the grid's row-major token strides,
// with dilation in tok_step (zeros past na_dim). Host: after the tensors' strides are set.
NATTN_HD void set_token_strides(Params& p) {
  int64_t m = 1;
  for (int a = 2; a >= 0; --a) {
    const bool live = a < p.na_dim;
    p.tok_stride[a] = live ? int(m) : 0;
    p.tok_step[a] = live ? int(m * p.dilation[a]) : 0;
    if (live) m *= p.spatial[a];
  }
}

// Whether a tensor of strides s stores its tokens as rows of one stride (s[na_dim], the last
// axis's): s[1 + a] == s[na_dim] * tok_stride[a] on every axis, with fewer than 2^31 tokens
// (token indices, and dilation * tok_stride <= tokens, fit an int).
NATTN_HD bool has_token_rows(const Params& p, const int64_t* s) {
  // (the tc walks multiply a token index by the row stride in 32-bit operands: it fits an int)
  bool rows = p.tokens <= 0x7fffffff && s[p.na_dim] >= 0 && s[p.na_dim] <= 0x7fffffff;
  for (int a = 0; a < p.na_dim; ++a) rows = rows && s[1 + a] == s[p.na_dim] * p.tok_stride[a];
  return rows;
}

// Token index of group coordinates c of dilation group g (token_index's value) in 32-bit
// arithmetic: the group's part once, one multiply-add per axis after.
template <int NA>
struct TokenIndex {
  int base;
  NATTN_HD TokenIndex(const Params& p, const int* g) : base(0) {
#pragma unroll
    for (int a = 0; a < NA; ++a) base += g[a] * p.tok_stride[a];
  }
  NATTN_HD int at(const Params& p, const int* c) const {
    int t = base;
#pragma unroll
    for (int a = 0; a < NA; ++a) t += c[a] * p.tok_step[a];
    return t;
  }
};

}  }  // namespace nattn::tiling
