// The host checks' random draws: xorshift64, reproducible, one stream per check program.
// Define NATTN_CHECK_SEED before including this header to pick the program's stream.
#pragma once

static unsigned long long rng_state = NATTN_CHECK_SEED;

static int rnd(int lo, int hi) {  // inclusive
  rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
  return lo + int(rng_state % (unsigned long long)(hi - lo + 1));
}
