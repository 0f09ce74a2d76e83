// The Hopper family's tensor-map cache (nattn/sm90/tensor_map_cache.h), on the CPU: over a
// random stream of requests (a few layouts and types, many addresses, some of them misaligned,
// more distinct maps than the cache holds), every map the cache hands out equals what an
// encode at that address would write, misaligned addresses are never served, and the copies
// and address replacements both happen. A stand-in encoder writes the layout's hash and the
// address into the map; the stand-in replacement rewrites the address as the driver's does.
#include <stdio.h>
#include <string.h>

#include <random>
#include <vector>

#include "nattn/sm90/tensor_map_cache.h"

using nattn::sm90::MapCache;
using nattn::sm90::MapSpec;
using nattn::sm90::MapType;

namespace {

int failures = 0;
void check(bool ok, const char* what, int i) {
  if (!ok && failures++ < 10) printf("FAIL %s (request %d)\n", what, i);
}

// What the stand-in encoder writes: an independent checksum of the spec's fields (not the
// cache's hash), the type, and the address.
CUtensorMap stand_in_encode(const MapSpec& m, MapType type, const void* ptr) {
  CUtensorMap map;
  memset(&map, 0, sizeof map);
  uint64_t sum = uint64_t(m.rank) * 7919 + uint64_t(type) * 104729;
  for (int i = 0; i < m.rank; ++i) {
    sum = sum * 31 + m.dim[i];
    sum = sum * 37 + m.box[i];
    sum = sum * 41 + m.element_stride[i];
    if (i + 1 < m.rank) sum = sum * 43 + m.stride_bytes[i];
  }
  memcpy(reinterpret_cast<char*>(&map), &sum, 8);
  memcpy(reinterpret_cast<char*>(&map) + 8, &ptr, 8);
  return map;
}
bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int replace_calls = 0;
CUresult stand_in_replace(CUtensorMap* map, void* ptr) {
  ++replace_calls;
  if (!aligned(ptr)) return CUDA_ERROR_INVALID_VALUE;
  memcpy(reinterpret_cast<char*>(map) + 8, &ptr, 8);
  return CUDA_SUCCESS;
}

MapSpec random_spec(std::mt19937& rng) {
  MapSpec m{};
  m.rank = 3 + int(rng() % 3);
  uint64_t stride = 2 * 64;
  for (int i = 0; i < m.rank; ++i) {
    m.dim[i] = 1 + rng() % 64;
    m.box[i] = 1 + rng() % 8;
    m.element_stride[i] = 1 + rng() % 2;
    if (i + 1 < m.rank) m.stride_bytes[i] = stride *= (1 + rng() % 4);
  }
  return m;
}

}  // namespace

int main() {
  std::mt19937 rng(1234);
  // Specs alike but for one used field are different layouts; a field past the rank is not used.
  MapSpec a = random_spec(rng), b = a, c = a;
  b.dim[a.rank - 1] += 1;
  c.stride_bytes[a.rank - 1] += 128;  // past the last stride the map has (rank - 1 of them)
  check(!nattn::sm90::same_map_spec(a, b), "a changed dim is another layout", -1);
  check(nattn::sm90::same_map_spec(a, c), "a stride past the map's is ignored", -1);

  std::vector<MapSpec> specs;
  for (int i = 0; i < 6; ++i) specs.push_back(random_spec(rng));
  std::vector<const void*> ptrs;
  for (int i = 0; i < 48; ++i)  // one in six misaligned
    ptrs.push_back(reinterpret_cast<const void*>(uintptr_t(0x7f0000000000ull + 4096ull * i + (i % 6 == 5 ? 8 : 0))));

  MapCache cache;
  int encodes = 0, misaligned_served = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const MapSpec& m = specs[rng() % specs.size()];
    const MapType type = MapType(rng() % 3);
    const void* ptr = ptrs[rng() % ptrs.size()];
    CUtensorMap got;
    memset(&got, 0xAB, sizeof got);
    if (cache.lookup(m, type, ptr, &got, stand_in_replace)) {
      misaligned_served += !aligned(ptr);
      const CUtensorMap want = stand_in_encode(m, type, ptr);
      check(!memcmp(&got, &want, sizeof got), "a cached map is the encoder's", i);
    } else if (aligned(ptr)) {  // the encoder refuses a misaligned address: nothing to remember
      ++encodes;
      got = stand_in_encode(m, type, ptr);
      cache.insert(m, type, ptr, got);
    }
  }
  check(misaligned_served == 0, "misaligned addresses are never served", -1);
  // 18 layouts x 40 aligned addresses = 720 maps against 64 slots: the cache is
  // cycled, yet after the first request of each layout nearly every lookup finds a donor.
  check(cache.hits() > 0, "some maps are copies at the same address", -1);
  check(cache.replaced() > n / 2, "most maps are copies with their address replaced", -1);
  check(encodes < n / 10, "few maps are encoded", -1);
  check(replace_calls >= int(cache.replaced()), "every replacement went through the driver's call", -1);

  // Without a replacement function only same-address copies are served.
  MapCache plain;
  const CUtensorMap m0 = stand_in_encode(specs[0], MapType::kBfloat16, ptrs[0]);
  plain.insert(specs[0], MapType::kBfloat16, ptrs[0], m0);
  CUtensorMap got;
  check(!plain.lookup(specs[0], MapType::kBfloat16, ptrs[1], &got, nullptr), "no replacement, no donor", -1);
  check(!plain.lookup(specs[0], MapType::kHalf, ptrs[0], &got, nullptr), "another type is another map", -1);
  check(plain.lookup(specs[0], MapType::kBfloat16, ptrs[0], &got, nullptr) && !memcmp(&got, &m0, sizeof got),
        "the same address is a copy", -1);

  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("ok %d requests: %llu copies, %llu replaced addresses, %d encodes\n", n,
         (unsigned long long)cache.hits(), (unsigned long long)cache.replaced(), encodes);
  return 0;
}
