// Attention dropout in the tensor-core family: the keep bits of a lane's score fragment.
//
// Element (batch b, query head h, query token q, key token k) is kept iff word k & 3 of
// Philox-4x32-10(counter {k >> 2, q, h + lo(offset), b + hi(offset)}, key {lo(seed),
// hi(seed)}) is at least floor(p * 2^32) (docs/semantics.md, "Attention dropout";
// common/philox.cuh is the definition, checked bit for bit against nattn/dropout.py). Every
// index is global, so the forward, the dQ pass and the dK/dV pass, which walk the same
// elements in different orders and fragment layouts, draw the same mask.
//
// A lane's score fragment holds two rows (r = 0, 1) by four columns (q = 0..3: chunk tokens
// 2 tq, 2 tq + 1, 8 + 2 tq, 9 + 2 tq); its keep bits are one word, bit 4 r + q. The kernels
// compute them right after taking a chunk's columns, before the chunk's products, so the
// Philox registers are not live next to the score and product fragments.
#pragma once
#include <stdint.h>

#include "nattn/common/drop_keys.cuh"
#include "nattn/common/philox.cuh"
#include "nattn/common/registry.h"

namespace nattn { namespace tc {

// The row-major token index of group coordinates c in dilation group g, mod 2^32 (the mask's
// q and k words; tiling::token_index is the same index in 64 bits).
template <int NA>
__device__ __forceinline__ uint32_t token_word(const Params& p, const int* c, const int* g) {
  uint32_t t = 0;
#pragma unroll
  for (int a = 0; a < NA; ++a) t = t * uint32_t(p.spatial[a]) + uint32_t(c[a] * p.dilation[a] + g[a]);
  return t;
}

// The loops below are kept rolled (their operands rotate through registers instead of being
// indexed): unrolled, the compiler interleaves the Philox calls and the registers they hold
// at once spill next to the kernels' fragments.

// Keep bits of a fragment whose rows are queries (forward, dQ pass) `qt[2]` and columns keys
// `kt[4]`. Columns 0/1 (and 2/3) are consecutive tokens of the packed window union, mostly
// consecutive keys of one Philox group: their second call is made only when it is not.
__device__ __forceinline__ unsigned keep_bits_query_rows(const DropKeys& d, const uint32_t* qt, const uint32_t* kt,
                                                         uint32_t threshold) {
  unsigned bits = 0;
  uint32_t k0 = kt[0], k1 = kt[1], k2 = kt[2], k3 = kt[3];
#pragma unroll 1
  for (int i = 0; i < 4; ++i) {  // row i / 2, column pair i % 2: bits 2 i and 2 i + 1
    const uint32_t query = i < 2 ? qt[0] : qt[1];
    philox::Words w = d.words(query, k0 >> 2);
    const uint32_t wa = philox::word(w, k0 & 3u);
    if ((k1 >> 2) != (k0 >> 2)) w = d.words(query, k1 >> 2);
    const uint32_t wb = philox::word(w, k1 & 3u);
    bits |= (unsigned(wa >= threshold) | unsigned(wb >= threshold) << 1) << (2 * i);
    const uint32_t t0 = k0, t1 = k1;  // the other pair next
    k0 = k2;
    k1 = k3;
    k2 = t0;
    k3 = t1;
  }
  return bits;
}

// Keep bits of a fragment whose rows are keys (dK/dV pass) `kt[2]` and columns queries `qt[4]`.
__device__ __forceinline__ unsigned keep_bits_key_rows(const DropKeys& d, const uint32_t* kt, const uint32_t* qt,
                                                       uint32_t threshold) {
  unsigned bits = 0;
  uint32_t q0 = qt[0], q1 = qt[1], q2 = qt[2], q3 = qt[3];
#pragma unroll 1
  for (int i = 0; i < 8; ++i) {  // row i / 4, column i % 4: bit i
    const uint32_t key = i < 4 ? kt[0] : kt[1];
    const philox::Words w = d.words(q0, key >> 2);
    bits |= unsigned(philox::word(w, key & 3u) >= threshold) << i;
    const uint32_t t = q0;  // the next column
    q0 = q1;
    q1 = q2;
    q2 = q3;
    q3 = t;
  }
  return bits;
}

// Whether fragment element (row r, column q) is kept.
__device__ __forceinline__ bool kept(unsigned bits, int r, int q) { return (bits >> (4 * r + q)) & 1u; }

}  }  // namespace nattn::tc
