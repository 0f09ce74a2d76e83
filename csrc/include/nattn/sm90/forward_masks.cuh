// The forward's window mask and RPB on one key box's scores (mask_box): the row's window
// becomes one bit per 8-column group and lane part (box_mask.cuh), one test per score.
// (Before the bit masks, 3-D 128-query CTAs tested each score's key coordinates, measured
// faster there than the per-bound compares: docs/dev/PERF.md sixth session.)
// Scores come in as S = Q K^T (accumulator layout, wgmma_ops.cuh) and leave as log2-domain
// logits times `pre` (plus bias), -inf outside the window; mx gets the rows' maxima.
// (A per-warp test of whole key lines for 64-query CTAs, skipping dead lines' exponentials,
// measured slower than mask_box: 0.51 vs 0.41 ms on a 13 x 13 window; not kept.)
#pragma once
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/common/window.cuh"
#include "nattn/sm90/box_mask.cuh"

namespace nattn { namespace sm90 {

constexpr float kLog2e = 1.4426950408889634f;

// The window bounds of one query row, as key offsets relative to a key box origin.
struct RowWindow {
  int lo[3], hi[3];  // inclusive, group coordinates
  int rpb;           // the row's part of the RPB index (head included for global tables)
};

// Query row `qr` of a box at q0 (axes of len[a] tokens, group coordinates): its window into
// row.lo / row.hi, its part of the RPB index added to row.rpb (which comes in holding the
// head's base), and whether it is a real query (padding rows take the last query's window).
template <int NA, class QB>
NATTN_HD bool row_window(const Params& p, const int* q0, const int* len, int qr, const int* rpb_mult,
                         RowWindow& row) {
  bool ok = true;
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const int i = q0[a] + QB::offset(qr, a);
    ok = ok && i < len[a];
    const int ic = nattn_min(i, len[a] - 1);
    const AxisRange w = query_window(ic, len[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
    row.lo[a] = w.start;
    row.hi[a] = w.start + w.count - 1;
    row.rpb += (p.kernel[a] - 1 - ic) * rpb_mult[a];
  }
  return ok;
}

// The RPB a mask adds (table null: none): index = row part + sum of key coordinate x mult.
// The table is global memory (128-query CTAs) or the head's copy in shared memory.
struct Bias {
  const float* table;
  int mult[3];
};

// The RPB index of the lane's column 2 t4 of the box for row r; columns add constants.
template <int NA>
__device__ __forceinline__ int bias_base(const RowWindow& row, const int* origin, int t4, const Bias& bias) {
  int base = row.rpb + 2 * t4;
#pragma unroll
  for (int a = 0; a < NA; ++a) base += origin[a] * bias.mult[a];
  return base;
}

template <int NA, class KB>
__device__ __forceinline__ int bias_offset(int i, const Bias& bias) {
  int off = i % 2;
#pragma unroll
  for (int a = 0; a < NA; ++a) off += KB::offset(8 * (i / 4), a) * bias.mult[a];
  return off;
}

// The window mask alone (no RPB, positive scale: the scores stay raw, the scale folds into
// the exponent): one bit test and select per score. mask_box's bias and scale steps, even
// predicated off, cost about four more instructions a score (SASS, eleventh session).
template <int NA, class KB, int N>
__device__ __forceinline__ void mask_box_plain(float (&sc)[N], const RowWindow (&row)[2], const int* origin, int t4,
                                               float (&mx)[2]) {
  const BoxMask<NA, KB> mask[2] = {BoxMask<NA, KB>(row[0].lo, row[0].hi, origin, t4),
                                   BoxMask<NA, KB>(row[1].lo, row[1].hi, origin, t4)};
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int r = (i / 2) % 2;
    sc[i] = mask[r].in(i) ? sc[i] : -INFINITY;
    mx[r] = fmaxf(mx[r], sc[i]);
  }
}

template <int NA, class KB, int N>
__device__ __forceinline__ void mask_box(float (&sc)[N], const RowWindow (&row)[2], const int* origin, int t4,
                                         float pre, const Bias& bias, float (&mx)[2]) {
  const BoxMask<NA, KB> mask[2] = {BoxMask<NA, KB>(row[0].lo, row[0].hi, origin, t4),
                                   BoxMask<NA, KB>(row[1].lo, row[1].hi, origin, t4)};
  const int base[2] = {bias.table ? bias_base<NA>(row[0], origin, t4, bias) : 0,
                       bias.table ? bias_base<NA>(row[1], origin, t4, bias) : 0};
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int r = (i / 2) % 2;
    float x = sc[i] * pre;
    if (!mask[r].in(i)) x = -INFINITY;
    else if (bias.table) x += bias.table[base[r] + bias_offset<NA, KB>(i, bias)] * kLog2e;
    sc[i] = x;
    mx[r] = fmaxf(mx[r], x);
  }
}

}  }  // namespace nattn::sm90
