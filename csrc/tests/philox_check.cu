// Host-side check of attention dropout's random bits (common/philox.cuh; runs on the CPU, no
// GPU; plain C++ too: tests/test_dropout_philox.py builds it with nvcc and with g++).
// First Philox-4x32-10 against the known-answer vectors of Random123's kat_vectors, then
// the bits for a fixed set of elements, for the PyTorch twin (nattn/dropout.py) to compare:
//   ok <elements>
//   w <seed> <offset> <batch> <head> <query> <key_group> <x0> <x1> <x2> <x3>
//   k <seed> <offset> <batch> <head> <query> <key> <p> <threshold> <word> <keep>
// (decimal; p printed with 17 significant digits, which round-trips a double). A known-answer
// mismatch prints it and exits 1 before anything else.
#include <stdio.h>

#include "nattn/common/philox.cuh"

#define NATTN_CHECK_SEED 0x243f6a8885a308d3ull
#include "host_rng.h"

using namespace nattn;

static unsigned long long next64() {  // the next state of host_rng.h's xorshift64 stream
  rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
  return rng_state;
}

struct Known {
  uint32_t counter[4], key[2], out[4];
};

static int known_answers() {
  const Known known[] = {
      {{0u, 0u, 0u, 0u}, {0u, 0u}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Known& k : known) {
    const philox::Words c{k.counter[0], k.counter[1], k.counter[2], k.counter[3]};
    const philox::Words w = philox::philox4x32(c, k.key[0], k.key[1]);
    const uint32_t got[4] = {w.x0, w.x1, w.x2, w.x3};
    for (int i = 0; i < 4; ++i) {
      if (got[i] != k.out[i] || philox::word(w, uint32_t(i)) != k.out[i]) {
        printf("known answer: counter %08x %08x %08x %08x key %08x %08x word %d: got %08x, want %08x\n",
               k.counter[0], k.counter[1], k.counter[2], k.counter[3], k.key[0], k.key[1], i, got[i], k.out[i]);
        return 1;
      }
    }
  }
  return 0;
}

// Indices: mostly small (as in real calls), sometimes at the uint32 edges.
static uint32_t index_value() {
  switch (rnd(0, 5)) {
    case 0: return 0u;
    case 1: return 0xffffffffu - uint32_t(rnd(0, 3));
    case 2: return uint32_t(next64());
    default: return uint32_t(rnd(0, 5000));
  }
}

// 64-bit words: random, at the edges, or with a low half that makes `head + lo(offset)` wrap.
static unsigned long long word64() {
  switch (rnd(0, 4)) {
    case 0: return 0ull;
    case 1: return ~0ull - unsigned(rnd(0, 2));
    case 2: return (next64() & 0xffffffff00000000ull) | (0xffffffffull - unsigned(rnd(0, 3)));
    default: return next64();
  }
}

int main() {
  if (known_answers()) return 1;
  const int kWordCases = 600, kKeepCases = 3000;
  printf("ok %d\n", kWordCases + kKeepCases);
  for (int i = 0; i < kWordCases; ++i) {
    const unsigned long long seed = word64(), offset = word64();
    const uint32_t b = index_value(), h = index_value(), q = index_value(), g = index_value();
    const philox::Words w = dropout_words(seed, offset, b, h, q, g);
    printf("w %llu %llu %u %u %u %u %u %u %u %u\n", seed, offset, b, h, q, g, w.x0, w.x1, w.x2, w.x3);
  }
  const double probabilities[] = {0.0, 0.1, 0.5, 1.0 / 3.0, 0.25, 0.9, 0.999999999, 1e-12, 0.7};
  const int num_p = int(sizeof(probabilities) / sizeof(probabilities[0]));
  for (int i = 0; i < kKeepCases;) {
    DropoutRng rng;
    rng.seed = word64();
    rng.offset = word64();
    const double p = probabilities[rnd(0, num_p - 1)];
    rng.threshold = dropout_threshold(p);
    // Runs of consecutive keys (as in a window row) and single ones.
    const uint32_t b = index_value(), h = index_value(), q = index_value();
    const uint32_t first = index_value();
    const int run = rnd(1, 9);
    for (int j = 0; j < run && i < kKeepCases; ++j, ++i) {
      const uint32_t key = first + uint32_t(j);
      const uint32_t wd = dropout_word(rng.seed, rng.offset, b, h, q, key);
      printf("k %llu %llu %u %u %u %u %.17g %u %u %d\n", (unsigned long long)rng.seed,
             (unsigned long long)rng.offset, b, h, q, key, p, rng.threshold, wd, int(dropout_keep(rng, b, h, q, key)));
    }
  }
  return 0;
}
