// Host side: recently encoded tensor maps (tensor_map.h), so that a call whose maps match an
// earlier call's skips cuTensorMapEncodeTiled. A model calls the same few layouts every step,
// so nearly every map finds one of its layout here: the same address is a copy of the map's
// 128 bytes, another address a copy whose address field the driver replaces
// (cuTensorMapReplaceAddress). The map is a function of the spec, the element type and the
// address alone (no allocation handle), so a cached map is exactly what an encode would
// write, even after the memory behind the address was freed and allocated again.
// Plain host code; the driver calls are the caller's (tensor_map.h), so that
// csrc/tests/sm90_map_cache_check.cu runs it on any machine.
#pragma once
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#include "nattn/sm90/tensor_map_spec.h"

namespace nattn { namespace sm90 {

enum class MapType { kHalf, kBfloat16, kFloat };

// Whether two specs give the same map (what cuTensorMapEncodeTiled reads of them).
inline bool same_map_spec(const MapSpec& a, const MapSpec& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.dim[i] != b.dim[i] || a.box[i] != b.box[i] || a.element_stride[i] != b.element_stride[i]) return false;
    if (i + 1 < a.rank && a.stride_bytes[i] != b.stride_bytes[i]) return false;
  }
  return true;
}

// FNV-1a over what same_map_spec compares, and the type: the scan's first test.
inline uint64_t map_spec_hash(const MapSpec& m, MapType type) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t x) {
    h ^= x;
    h *= 1099511628211ull;
  };
  mix(uint64_t(m.rank) | uint64_t(type) << 8);
  for (int i = 0; i < m.rank; ++i) {
    mix(m.dim[i]);
    mix(uint64_t(m.box[i]) | uint64_t(m.element_stride[i]) << 32);
    if (i + 1 < m.rank) mix(m.stride_bytes[i]);
  }
  return h;
}

// Fully associative, least recently used out. One per host thread (thread_map_cache): calls
// from autograd's backward thread and the caller's never share one.
class MapCache {
 public:
  static constexpr int kSlots = 64;
  // Replaces a map's address; CUDA_SUCCESS or the driver's refusal (an address the map
  // cannot take: then the caller encodes, and reports the encoder's reason).
  using ReplaceFn = CUresult (*)(CUtensorMap*, void*);

  // Fills *map from the cache when it holds this spec and type: returns true. An entry at
  // `ptr` is copied; else one of the layout at another address is copied and given `ptr`
  // (`replace`), and the result is remembered too.
  bool lookup(const MapSpec& m, MapType type, const void* ptr, CUtensorMap* map, ReplaceFn replace) {
    const uint64_t h = map_spec_hash(m, type);
    Slot* donor = nullptr;
    for (Slot& s : slots_) {
      if (!s.used || s.hash != h || s.type != type || !same_map_spec(s.spec, m)) continue;
      if (s.ptr == ptr) {
        *map = s.map;
        s.stamp = ++clock_;
        ++hits_;
        return true;
      }
      if (!donor || s.stamp > donor->stamp) donor = &s;
    }
    if (!donor || !replace) return false;
    *map = donor->map;
    donor->stamp = ++clock_;
    if (replace(map, const_cast<void*>(ptr)) != CUDA_SUCCESS) return false;
    ++replaced_;
    insert(h, m, type, ptr, *map);
    return true;
  }

  // Remembers an encoded map (in the least recently used slot).
  void insert(const MapSpec& m, MapType type, const void* ptr, const CUtensorMap& map) {
    insert(map_spec_hash(m, type), m, type, ptr, map);
  }

  // Lookups served by a copy at the same address / by a replaced address (for tests).
  uint64_t hits() const { return hits_; }
  uint64_t replaced() const { return replaced_; }

 private:
  void insert(uint64_t hash, const MapSpec& m, MapType type, const void* ptr, const CUtensorMap& map) {
    Slot* victim = &slots_[0];
    for (Slot& s : slots_) {
      if (!s.used) {
        victim = &s;
        break;
      }
      if (s.stamp < victim->stamp) victim = &s;
    }
    victim->used = true;
    victim->hash = hash;
    victim->type = type;
    victim->spec = m;
    victim->ptr = ptr;
    victim->map = map;
    victim->stamp = ++clock_;
  }

  struct Slot {
    bool used = false;
    uint64_t hash = 0;
    uint64_t stamp = 0;
    MapType type = MapType::kHalf;
    MapSpec spec{};
    const void* ptr = nullptr;
    CUtensorMap map{};
  };
  Slot slots_[kSlots];
  uint64_t clock_ = 0, hits_ = 0, replaced_ = 0;
};

inline MapCache& thread_map_cache() {
  static thread_local MapCache cache;
  return cache;
}

}  }  // namespace nattn::sm90
