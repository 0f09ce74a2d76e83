// Warp tiles over the NA grid (the tensor-core family): a warp serves a box of tokens of
// one dilation group; the box's window union is walked line by line (fixed leading
// coordinates), with per-token window checks.
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
// per warp, the union of its windows (leading axes x the last axis rounded up to chunks
// of `chunk`), times the number of warps. 2-D 7x7 windows get 2x8 boxes, 13x13 ones 4x4,
// 3-D 5x7x7 ones 1x2x8. Opt-in (NATTN_TC_BOX=model) until measured on its own: PERF.md run 4.
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
      double cost = 1;
      for (int a = 0; a < na; ++a) {
        const int m = (p.spatial[a] + p.dilation[a] - 1) / p.dilation[a];
        const int span = nattn_min(box[a] + p.kernel[a] - 1, m);
        cost *= double((m + box[a] - 1) / box[a]);  // warps along the axis
        cost *= a < A ? span : double((span + chunk - 1) / chunk) * chunk;
      }
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

// Which box a warp serves: per axis its dilation group g, group length L and first
// group coordinate. False when the warp has no token (past the grid, or a short group).
template <int NA>
NATTN_HD bool warp_box(const Params& p, const int* box, int64_t w, int* g, int* L, int* first) {
  bool ok = true;
#pragma unroll
  for (int a = NA - 1; a >= 0; --a) {
    const int d = p.dilation[a], m = (p.spatial[a] + d - 1) / d, bx = box[a];
    const int nt = (m + bx - 1) / bx;
    const int64_t per = int64_t(nt) * d;
    const int idx = int(w % per);
    w /= per;
    g[a] = idx / nt;
    first[a] = (idx % nt) * bx;
    L[a] = group_len(p.spatial[a], g[a], d);
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
    const int bx = box[a];
    const int c = first[a] + t % bx;
    t /= bx;
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
    const bool c = p.causal[a] != 0;
    const AxisRange lo = kInverse ? key_inverse(first[a], L[a], p.kernel[a], p.stride[a], c)
                                  : query_window(first[a], L[a], p.kernel[a], p.stride[a], c);
    const AxisRange hi = kInverse ? key_inverse(last, L[a], p.kernel[a], p.stride[a], c)
                                  : query_window(last, L[a], p.kernel[a], p.stride[a], c);
    u[a] = {lo.start, hi.start + hi.count - lo.start};
  }
}

// A line of the union: fixed leading coordinates r[0..NA-2] (group coordinates). Its memory
// offsets and row-major token index are the same for every row of the box; whether it lies
// in a row's window (inverse window) and that row's RPB index part are per row.
struct LineOffsets {
  int64_t off0, off1, tok;
};

template <int NA>
NATTN_HD LineOffsets line_offsets(const Params& p, const int* r, const int* g, const int64_t* s0,
                                  const int64_t* s1) {
  LineOffsets lo{0, 0, 0};
  int64_t tmult = p.spatial[NA - 1];
#pragma unroll
  for (int a = NA - 2; a >= 0; --a) {
    const int64_t c = int64_t(r[a]) * p.dilation[a] + g[a];
    lo.off0 += c * s0[1 + a];
    lo.off1 += c * s1[1 + a];
    lo.tok += c * tmult;
    tmult *= p.spatial[a];
  }
  return lo;
}

struct RowLine {
  bool ok;
  int rpb;
};

template <int NA, bool kInverse>
NATTN_HD RowLine row_line(const Params& p, const int* r, const AxisRange* mine, const int* ig, const int* rmult) {
  RowLine rl{true, 0};
#pragma unroll
  for (int a = 0; a < NA - 1; ++a) {
    rl.ok = rl.ok && unsigned(r[a] - mine[a].start) < unsigned(mine[a].count);
    // RPB slot on this axis: key - query + k - 1
    rl.rpb += ((kInverse ? ig[a] - r[a] : r[a] - ig[a]) + p.kernel[a] - 1) * rmult[a];
  }
  return rl;
}

// Walks a union chunk by chunk, line-major, `chunk` tokens along the last axis, with
// counters only (no divisions per chunk): r is the current line, cs its chunk's first
// last-axis coordinate.
template <int NA>
struct ChunkCursor {
  int r[3], cs;

  NATTN_HD explicit ChunkCursor(const AxisRange* u) {
#pragma unroll
    for (int a = 0; a < 3; ++a) r[a] = a < NA - 1 ? u[a].start : 0;
    cs = u[NA - 1].start;
  }
  NATTN_HD void next(const AxisRange* u, int chunk) {
    cs += chunk;
    if (cs < u[NA - 1].start + u[NA - 1].count) return;
    cs = u[NA - 1].start;
#pragma unroll
    for (int a = NA - 2; a >= 0; --a) {
      if (++r[a] < u[a].start + u[a].count) return;
      r[a] = u[a].start;
    }
  }
};

template <int NA>
NATTN_HD int leading_lines(const AxisRange* u) {
  int n = 1;
#pragma unroll
  for (int a = 0; a < NA - 1; ++a) n *= u[a].count;
  return n;
}

}  }  // namespace nattn::tiling
