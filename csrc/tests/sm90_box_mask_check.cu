// Host-side check of the Hopper family's window masks (runs on the CPU, no GPU): for every
// key box of SM90_TILES (and the backward's 64-token column boxes, which are among them),
// random row windows, box origins and lanes, BoxMask's one-bit-per-group test agrees with
// the direct test of each column's coordinates, for every accumulator index a lane holds.
// The forward, the dQ pass and the dK/dV pass mask their scores with it. Prints
// "ok <checks>" or the first mismatch (exit 1).
#include <stdio.h>

#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/tiles.cuh"

using namespace nattn;
using namespace nattn::sm90;

#define NATTN_CHECK_SEED 0x13198a2e03707344ull
#include "host_rng.h"

template <int NA, class B>
static int check(long long& checks) {
  int lo[3], hi[3], origin[3];
  for (int a = 0; a < NA; ++a) {
    const int e = B::extent(a);
    origin[a] = rnd(-50, 200);
    lo[a] = origin[a] + rnd(-e - 12, 2 * e + 12);
    hi[a] = lo[a] + rnd(-2, rnd(0, 3) == 0 ? 4 : 2 * e + 24);  // empty windows too
  }
  const int t4 = rnd(0, 3);
  const BoxMask<NA, B> mask(lo, hi, origin, t4);
  for (int i = 0; i < B::kSize / 2; ++i) {
    const int col = 8 * (i / 4) + 2 * t4 + i % 2;
    bool want = true;
    for (int a = 0; a < NA; ++a) {
      const int key = origin[a] + B::offset(col, a);
      want = want && key >= lo[a] && key <= hi[a];
    }
    ++checks;
    if (mask.in(i) != want) {
      printf("box %d,%d,%d lane %d index %d (column %d): mask says %d, window says %d (lo %d,%d,%d hi %d,%d,%d "
             "origin %d,%d,%d)\n", B::extent(0), B::extent(1), B::extent(2), t4, i, col, int(mask.in(i)), int(want),
             lo[0], lo[1], lo[2], hi[0], hi[1], hi[2], origin[0], origin[1], origin[2]);
      return 1;
    }
  }
  return 0;
}

int main() {
  long long checks = 0;
  for (int it = 0; it < 20000; ++it) {
    if (check<1, Box<128, 1, 1>>(checks) || check<1, Box<64, 1, 1>>(checks) || check<1, Box<160, 1, 1>>(checks) ||
        check<2, Box<8, 16, 1>>(checks) || check<2, Box<4, 16, 1>>(checks) || check<2, Box<8, 8, 1>>(checks) ||
        check<2, Box<7, 16, 1>>(checks) || check<2, Box<4, 24, 1>>(checks) ||
        check<3, Box<2, 8, 8>>(checks) || check<3, Box<2, 4, 16>>(checks) || check<3, Box<4, 2, 16>>(checks) ||
        check<3, Box<1, 8, 8>>(checks) || check<3, Box<1, 5, 16>>(checks) || check<3, Box<2, 4, 8>>(checks))
      return 1;
  }
  printf("ok %lld\n", checks);
  return 0;
}
