// The zero-padded copies of head dims without a Hopper instance (src/sm90_padded.h): one
// strided [B, *spatial, H, C] tensor and its packed [B, N, H, HD] copy (C <= HD, both
// multiples of 8; HD a power of two), 16 bytes (8 two-byte elements) an item. Host and
// device: csrc/tests/sm90_pad_copy_check.cu replays the index math on the CPU.
#pragma once
#include <stdint.h>

#include "nattn/common/window.cuh"  // NATTN_HD

namespace nattn { namespace sm90 {

struct PadCopy {
  const void* src;
  void* dst;
  int64_t s[5];  // the strided tensor's element strides (batch, axes 0..2, heads)
  unsigned spatial[3];
  int na_dim, channels, part_shift;  // parts of 8 channels per row: 1 << part_shift
  unsigned heads, items;             // items per batch entry: N * H * HD / 8
};

// Item i of batch entry b: its channel part (8 channels from part * 8), its element offset
// in the strided tensor and in the packed one. 32-bit index math within a batch entry (the
// host declines entries of 2^31 items or more); NA a template parameter: indexed by a
// runtime axis, the strides and sizes made every thread copy the parameters into local
// memory (13 STL a thread; the copies moved ~1 TB/s).
template <int NA>
NATTN_HD unsigned pad_copy_offsets(const PadCopy& c, unsigned b, unsigned i, int64_t& strided, int64_t& packed) {
  const unsigned part = i & ((1u << c.part_shift) - 1), row = i >> c.part_shift;
  unsigned token = row / c.heads;
  int64_t off = int64_t(b) * c.s[0] + int64_t(row - token * c.heads) * c.s[4] + part * 8;
#pragma unroll
  for (int a = NA - 1; a > 0; --a) {
    const unsigned up = token / c.spatial[a];
    off += int64_t(token - up * c.spatial[a]) * c.s[1 + a];
    token = up;
  }
  strided = off + int64_t(token) * c.s[1];
  packed = (int64_t(b) * c.items + i) * 8;
  return part;
}

}  }  // namespace nattn::sm90
