// Attention dropout in the kernels: one (batch, query head)'s Philox key and the two counter
// words that do not depend on the element (docs/semantics.md, "Attention dropout";
// common/philox.cuh is the definition). Shared by the tensor-core (tc/dropout.cuh) and SIMT
// (simt/dropout.cuh) families, which walk the elements in their own orders.
#pragma once
#include <stdint.h>

#include "nattn/common/philox.cuh"
#include "nattn/common/registry.h"

namespace nattn {

// Read from the call's [seed, offset] in device memory (by the kernel: no host
// synchronisation, CUDA graphs capture the draw).
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

}  // namespace nattn
