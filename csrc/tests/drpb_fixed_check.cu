// Host check of the fixed-point dRPB's scale (common/drpb_fixed.cuh; runs on the CPU): for
// random largest |dS| values over the whole float range (subnormals and zero too) and terms
// up to twice that largest value (the dK/dV pass recomputes dS with other rounding), for
// blocks of the tensor-core (64 keys) and Hopper (128) dK/dV passes: every scaled term stays
// below 2^(bits + 1), a block's terms of one entry (one per key) sum without overflowing 32
// bits, the rounding step is at most 2^-(bits - 1) of the largest value (down to 2^-100), and
// NaN / infinity maxima take the NaN path; the SIMT family's int64 bound (a whole call's terms
// of one entry) too. Prints "ok <cases>" or the first failure.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nattn/common/drpb_fixed.cuh"

#define NATTN_CHECK_SEED 0x9e3779b97f4a7c15ull
#include "host_rng.h"

using namespace nattn;

static unsigned bits_of(float x) { unsigned u; memcpy(&u, &x, 4); return u; }

int main() {
  long cases = 0;
  // the SIMT family's int64 tables: a call's terms of one entry at the bound stay below 2^62
  for (long long terms = 1; terms <= (1ll << 40); terms = terms * 3 + 1) {
    const int bits = fixed_bits_wide(terms);
    if (bits > 52 || ldexp(double(terms), bits + 1) > ldexp(1.0, 62)) {
      printf("fail: fixed_bits_wide(%lld) = %d overflows int64 or a double's mantissa\n", terms, bits);
      return 1;
    }
  }
  if (drpb_fixed_shift(bits_of(INFINITY), 23) != 0 || drpb_fixed_shift(bits_of(NAN) & 0x7fffffffu, 23) != 0) {
    printf("fail: a non-finite maximum must take the NaN path\n");
    return 1;
  }
  for (int i = 0; i < 200000; ++i) {
    const int terms = i % 2 ? 128 : 64, bits = fixed_bits(terms);
    // a largest |dS| with a random exponent (including subnormals and 0) and mantissa
    const unsigned m = (unsigned(rnd(0, 254)) << 23) | unsigned(rnd(0, (1 << 23) - 1));
    float mf; memcpy(&mf, &m, 4);
    const int s = drpb_fixed_shift(m, bits);
    if (s < -126 || s > 126) { printf("fail: shift %d out of range for %g\n", s, mf); return 1; }
    const double scale = ldexp(1.0, s);
    if (mf >= ldexp(1.0, -100) && 1.0 / scale > ldexp(double(mf), -(bits - 1))) {
      printf("fail: step %g coarser than 2^-%d of the maximum %g\n", 1.0 / scale, bits - 1, mf);
      return 1;
    }
    long long block = 0;
    double exact = 0.0;
    for (int t = 0; t < terms; ++t) {  // a block's terms of one entry, at the bound
      // every other case: all terms of one sign just under twice the maximum (the worst
      // case for the 32-bit block sum); else mixed signs and sizes
      const double worst = (i % 4 == 0 ? 2.0 : -2.0) * 0.9999999;
      const double frac = (t & 1 ? -1.0 : 1.0) * (1.0 + rnd(0, 1 << 20) / double(1 << 20)) / 1.0000001;
      const float x = float(double(mf) * (i % 4 < 2 ? worst : frac));
      if (!isfinite(x)) continue;  // twice a maximum near FLT_MAX: not a finite dS
      const double scaled = double(x) * scale;
      if (fabs(scaled) >= ldexp(1.0, bits + 1)) {
        printf("fail: term %g (maximum %g) scales to %g >= 2^%d\n", x, mf, scaled, bits + 1);
        return 1;
      }
      block += llrint(float(double(x) * scale));  // the kernel's float product, rounded to int
      exact += double(x);
    }
    if (block > 2147483647ll || block < -2147483648ll) { printf("fail: block sum overflows 32 bits\n"); return 1; }
    if (fabs(double(block) / scale - exact) > terms * 0.5 / scale * 1.0001 + fabs(exact) * 1e-6) {
      printf("fail: block sum %g vs exact %g (maximum %g)\n", double(block) / scale, exact, mf);
      return 1;
    }
    ++cases;
  }
  printf("ok %ld\n", cases);
  return 0;
}
