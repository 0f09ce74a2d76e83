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

#include "nattn/common/drop_keys.cuh"
#include "nattn/common/philox.cuh"
#include "nattn/common/registry.h"

namespace nattn { namespace simt {

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
