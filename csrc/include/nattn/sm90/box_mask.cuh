// The window test of one accumulator row against the columns a lane holds, for a box of
// columns (keys in the dQ pass, queries in the dK/dV pass) at `origin`.
//
// Lane t4 holds columns col(i) = 8 (i / 4) + 2 t4 + i % 2 (wgmma_ops.cuh). When the box's
// last extent is a multiple of 8, the lane part 2 t4 + i % 2 stays inside the last axis, so
// every coordinate is a compile-time function of i once the score loop is unrolled, and the
// row's bounds can absorb the origin and the lane part: one comparison per bound per score.
#pragma once
#include "nattn/common/window.cuh"

namespace nattn { namespace sm90 {

template <int NA, class B>
struct BoxMask {
  static_assert(B::extent(NA - 1) % 8 == 0, "the last axis must hold whole 8-column groups");
  int lo[3], hi[3];  // the row's bounds relative to the origin (last axis: also minus 2 t4)

  __device__ __forceinline__ BoxMask(const int* row_lo, const int* row_hi, const int* origin, int t4) {
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int lane = a == NA - 1 ? 2 * t4 : 0;
      lo[a] = row_lo[a] - origin[a] - lane;
      hi[a] = row_hi[a] - origin[a] - lane;
    }
  }

  // Whether the row sees column col(i) (i: the accumulator index, a constant after unrolling).
  __device__ __forceinline__ bool in(int i) const {
    bool ok = true;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int c = B::offset(8 * (i / 4), a) + (a == NA - 1 ? i % 2 : 0);
      ok = ok && c >= lo[a] && c <= hi[a];
    }
    return ok;
  }
};

}  }  // namespace nattn::sm90
