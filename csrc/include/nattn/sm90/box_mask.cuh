// The window test of one accumulator row against the columns a lane holds, for a box of
// columns (keys in the dQ pass, queries in the dK/dV pass) at `origin`.
//
// Lane t4 holds columns col(i) = 8 (i / 4) + 2 t4 + i % 2 (wgmma_ops.cuh). When the box's
// last extent is a multiple of 8, the lane part 2 t4 + i % 2 stays inside the last axis, so
// column group i / 4 and the lane part are all a score's coordinates need: the row's window
// becomes one bit per group and lane part, built once per row and box.
#pragma once
#include <stdint.h>

#include "nattn/common/window.cuh"

namespace nattn { namespace sm90 {

template <int NA, class B>
struct BoxMask {
  static_assert(B::extent(NA - 1) % 8 == 0, "the last axis must hold whole 8-column groups");
  static constexpr int kLast = NA - 1;
  static constexpr int kLineGroups = B::extent(kLast) / 8;  // 8-column groups per line of the last axis
  static_assert(B::kSize / 8 <= 32, "one bit per 8-column group of the box");
  // Bit j of bits[e]: the row sees column 8 j + 2 t4 + e. Groups number the box's lines
  // row-major (j = line * kLineGroups + group), so the in-window groups are a box of their
  // own: the last axis' group range, repeated at every line the other axes keep (a product
  // of "repeat every `step` bits" words, which have no carries). Per score the test is one
  // bit (FlashAttention-style masks cost several compares per score: the masked boxes of
  // large windows were issue-bound on them).
  uint32_t bits[2];

  // sum over v in [lo, hi) of 2^(v * step)
  template <int kStep>
  NATTN_HD static uint32_t repeat(int lo, int hi) {
    constexpr uint32_t kUnit = (1u << kStep) - 1u;
    return hi > lo ? ((1u << (hi * kStep)) - (1u << (lo * kStep))) / kUnit : 0u;
  }

  template <int A, int kStep>
  NATTN_HD static uint32_t lines(const int* row_lo, const int* row_hi, const int* origin) {
    if constexpr (A < 0) {
      return 1u;
    } else {
      constexpr int e = B::extent(A);
      const int lo = nattn_min(nattn_max(row_lo[A] - origin[A], 0), e);
      const int hi = nattn_min(nattn_max(row_hi[A] - origin[A] + 1, 0), e);
      return repeat<kStep>(lo, hi) * lines<A - 1, kStep * e>(row_lo, row_hi, origin);
    }
  }

  NATTN_HD BoxMask(const int* row_lo, const int* row_hi, const int* origin, int t4) {
    const uint32_t kept = lines<kLast - 1, kLineGroups>(row_lo, row_hi, origin);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      // groups g with 8 g + 2 t4 + e inside [lo, hi] (arithmetic shifts: floors)
      const int lo = row_lo[kLast] - origin[kLast] - 2 * t4 - e, hi = row_hi[kLast] - origin[kLast] - 2 * t4 - e;
      const int g0 = nattn_max((lo + 7) >> 3, 0), g1 = nattn_min((hi >> 3) + 1, kLineGroups);
      bits[e] = (g1 > g0 ? (1u << g1) - (1u << g0) : 0u) * kept;
    }
  }

  // Whether the row sees column col(i) (i: the accumulator index, a constant after unrolling).
  NATTN_HD bool in(int i) const { return (bits[i % 2] >> (i / 4)) & 1u; }
};

// The masks of a lane's two accumulator rows (index i belongs to row (i / 2) % 2) for one
// box, as the backward passes test them per score. (The forward's mask_box / mask_box_plain
// build the same pair themselves: through this struct ptxas allocated registers differently
// in the 2-D head-dim-32 64-query kernels, 8 more instructions, not timed.)
template <int NA, class B>
struct RowPairMask {
  BoxMask<NA, B> row[2];
  NATTN_HD RowPairMask(const int* lo0, const int* hi0, const int* lo1, const int* hi1, const int* origin, int t4)
      : row{BoxMask<NA, B>(lo0, hi0, origin, t4), BoxMask<NA, B>(lo1, hi1, origin, t4)} {}
  NATTN_HD bool in(int i) const { return row[(i / 2) % 2].in(i); }
};

// A masked score's value: `v` is computed for every score and then selected. Written as
// `in ? f(...) : 0`, the score's math was predicated, and ptxas then reloaded the softmax
// scale with one LDC per score instead of reading it from a uniform register (mid-2d-k13's
// dK/dV pass: 48 LDC of ~800 instructions a step). A masked-out `v` may be inf or NaN: the
// select drops it.
NATTN_HD float kept(bool in, float v) { return in ? v : 0.f; }

}  }  // namespace nattn::sm90
