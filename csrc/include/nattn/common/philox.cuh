// Attention dropout's random bits: Philox-4x32-10 and the keep rule, host and device.
//
// The definition (which counter and key words hold what, which output word an element takes,
// the threshold) is in docs/semantics.md, "Attention dropout"; nattn/dropout.py is the same
// code in PyTorch (the reference backend's mask), and csrc/tests/philox_check.cu prints this
// header's bits for tests/test_dropout_philox.py to compare bit for bit. In short, element
// (batch b, query head h, query token q, key k) of a call with 64-bit seed S and offset O is
//   words = Philox4x32_10(counter = {k >> 2, q, h + lo(O), b + hi(O)}  (each mod 2^32),
//                         key     = {lo(S), hi(S)})
//   kept  iff words[k & 3] >= floor(p * 2^32)
// with q the flattened (row-major) spatial index and k the same for neighbourhood keys, or
// N + j for extra key j (N spatial tokens). Every pass computes the bits of an element from
// these global indices only, so the forward and both backward passes agree whatever order
// they walk keys in; four consecutive keys of a query share one Philox call.
//
// Plain C++ apart from the NATTN_HD qualifiers: without nvcc it compiles with any C++11
// compiler (the host check builds it with g++ too).
#pragma once
#include <stdint.h>

#ifndef NATTN_HD
#if defined(__CUDACC__)
#define NATTN_HD __host__ __device__ __forceinline__  // the same tokens as common/window.cuh
#else
#define NATTN_HD inline
#endif
#endif

namespace nattn {
namespace philox {

// Multipliers and Weyl key increments of Philox-4x32 (Salmon et al., SC'11).
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;
constexpr int kRounds = 10;

struct Words {
  uint32_t x0, x1, x2, x3;
};

// a * b as (high, low) 32-bit halves; nvcc makes it one mul.wide.u32 (or mul.hi + mul.lo).
NATTN_HD void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = uint64_t(a) * uint64_t(b);
  hi = uint32_t(product >> 32);
  lo = uint32_t(product);
}

// One round: two multiplies, the high halves mixed with the other two words and the key.
NATTN_HD Words mix_round(const Words& c, uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mul_hi_lo(kM0, c.x0, hi0, lo0);
  mul_hi_lo(kM1, c.x2, hi1, lo1);
  return Words{hi1 ^ c.x1 ^ k0, lo1, hi0 ^ c.x3 ^ k1, lo0};
}

// Philox-4x32 with `rounds` rounds (10 is the standard variant); the key grows by (kW0, kW1)
// between rounds.
NATTN_HD Words philox4x32(Words counter, uint32_t k0, uint32_t k1, int rounds = kRounds) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    counter = mix_round(counter, k0, k1);
  }
  return counter;
}

// Output word i (0..3) of w, without indexing a local array (no local memory on the device).
NATTN_HD uint32_t word(const Words& w, uint32_t i) {
  const uint32_t low = (i & 1u) ? w.x1 : w.x0;
  const uint32_t high = (i & 1u) ? w.x3 : w.x2;
  return (i & 2u) ? high : low;
}

}  // namespace philox

// One call's dropout randomness: the two 64-bit words drawn from torch's generator (the
// op's `rng` tensor: [seed, offset] as int64) and the drop threshold.
struct DropoutRng {
  uint64_t seed;
  uint64_t offset;
  uint32_t threshold;  // dropout_threshold(p)
};

// floor(p * 2^32) for a dropout probability p in [0, 1): exact (scaling a double by a power of
// two is exact, the conversion truncates). An element is dropped iff its word is below it, so
// it is kept with probability 1 - threshold / 2^32 (within 2^-32 of 1 - p); p = 0 keeps all.
NATTN_HD uint32_t dropout_threshold(double p) {
  if (!(p > 0.0)) return 0u;
  const double scaled = p * 4294967296.0;
  return scaled >= 4294967295.0 ? 4294967295u : uint32_t(scaled);
}

// The four words of key group `key_group` (keys 4 * key_group .. 4 * key_group + 3) of query
// token `query` in query head `head` of batch element `batch`.
NATTN_HD philox::Words dropout_words(uint64_t seed, uint64_t offset, uint32_t batch, uint32_t head,
                                     uint32_t query, uint32_t key_group) {
  const philox::Words counter{key_group, query, head + uint32_t(offset), batch + uint32_t(offset >> 32)};
  return philox::philox4x32(counter, uint32_t(seed), uint32_t(seed >> 32));
}

// The word of one element (key is the global key index: spatial token, or N + j for extra key j).
NATTN_HD uint32_t dropout_word(uint64_t seed, uint64_t offset, uint32_t batch, uint32_t head, uint32_t query,
                               uint32_t key) {
  return philox::word(dropout_words(seed, offset, batch, head, query, key >> 2), key & 3u);
}

NATTN_HD bool dropout_keep_word(uint32_t word, uint32_t threshold) { return word >= threshold; }

// Whether element (batch, head, query, key) is kept: its probability then enters P V scaled by
// 1 / (1 - p); a dropped one contributes nothing (the softmax's normaliser counts it either way).
NATTN_HD bool dropout_keep(const DropoutRng& rng, uint32_t batch, uint32_t head, uint32_t query, uint32_t key) {
  return dropout_keep_word(dropout_word(rng.seed, rng.offset, batch, head, query, key), rng.threshold);
}

}  // namespace nattn
