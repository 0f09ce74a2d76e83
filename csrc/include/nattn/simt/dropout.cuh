// Attention dropout in the SIMT family: the keep bit of one (query, key) element.
//
// Element (batch b, query head h, query token q, key token k) is kept iff word k & 3 of
// Philox-4x32-10(counter {k >> 2, q, h + lo(offset), b + hi(offset)}, key {lo(seed),
// hi(seed)}) is at least floor(p * 2^32) (docs/semantics.md, "Attention dropout";
// common/philox.cuh is the definition, checked bit for bit against nattn/dropout.py, and
// tc/dropout.cuh draws the same bits in the tensor-core family). q and k are row-major token
// indices mod 2^32; every one is global, so the forward, the dQ pass (a query's window) and
// the dK/dV pass (a key's inverse neighbourhood) draw the same mask.
//
// Every thread of a query's group computes the bits of the keys it walks itself (the group
// walks them together, so no exchange is needed); walking a window, keys that share a Philox
// group (four consecutive tokens, consecutive along the last axis without dilation) reuse
// the words of the previous call.
#pragma once
#include <stdint.h>

#include "nattn/common/philox.cuh"
#include "nattn/common/registry.h"

namespace nattn { namespace simt {

// The Philox key and the two counter words that do not depend on the element, for one
// (batch, query head), from the call's [seed, offset] in device memory (read by the kernel:
// no host synchronisation, CUDA graphs capture the draw).
struct DropKeys {
  uint32_t k0, k1, c2, c3;

  __device__ __forceinline__ void init(const Params& p, int b, int h) {
    const uint64_t seed = uint64_t(__ldg(reinterpret_cast<const long long*>(p.drop_rng)));
    const uint64_t offset = uint64_t(__ldg(reinterpret_cast<const long long*>(p.drop_rng) + 1));
    k0 = uint32_t(seed);
    k1 = uint32_t(seed >> 32);
    c2 = uint32_t(h) + uint32_t(offset);
    c3 = uint32_t(b) + uint32_t(offset >> 32);
  }
  // The four words of keys 4 kg .. 4 kg + 3 of query token `query`.
  __device__ __forceinline__ philox::Words words(uint32_t query, uint32_t kg) const {
    return philox::philox4x32(philox::Words{kg, query, c2, c3}, k0, k1);
  }
  // Whether (query, key) is kept (one Philox call).
  __device__ __forceinline__ bool keep(uint32_t query, uint32_t key, uint32_t threshold) const {
    return philox::word(words(query, key >> 2), key & 3u) >= threshold;
  }
};

// The keep bits of one query's keys, walked in any order: the words of the last key group
// drawn are kept, so a key of the same group costs no Philox call.
struct QueryDrop {
  DropKeys d;
  uint32_t query;
  uint32_t group;  // the key group whose words `w` holds (none at first: groups are < 2^30)
  philox::Words w;

  __device__ __forceinline__ void init(const Params& p, int b, int h, uint32_t query_token) {
    d.init(p, b, h);
    query = query_token;
    group = 0xffffffffu;
    w = philox::Words{0u, 0u, 0u, 0u};
  }
  __device__ __forceinline__ bool keep(uint32_t key, uint32_t threshold) {
    const uint32_t kg = key >> 2;
    if (kg != group) {
      group = kg;
      w = d.words(query, kg);
    }
    return philox::word(w, key & 3u) >= threshold;
  }
};

}  }  // namespace nattn::simt
