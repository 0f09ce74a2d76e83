// A tile of ROWS tokens x HD channels (16-bit) in shared memory, as the copy engine writes
// it and wgmma reads it: rows of min(HD, 64) channels (one swizzle span: 128 bytes, or 64
// at head dim 32), HD / 64 column blocks one after the other, 16-byte chunks swizzled by
// the row. The backward kernels use it for every operand; the descriptors below are the
// two ways a product reads a tile.
#pragma once
#include <stdint.h>

#include "nattn/sm90/ptx.cuh"

namespace nattn { namespace sm90 {

// An SM's shared memory (228 KiB, of which the driver reserves 1 KiB a CTA): what the CTAs
// meant to share an SM must fit in together.
constexpr int kSmemPerSm = 228 * 1024, kSmemReservedPerCta = 1024;

template <int HD, int ROWS>
struct TileSmem {
  static constexpr int kRowBytes = HD >= 64 ? 128 : HD * 2;  // = the swizzle span
  static constexpr int kBlocks = HD >= 64 ? HD / 64 : 1;     // column blocks
  static constexpr int kChannels = HD >= 64 ? 64 : HD;       // channels per block (one copy)
  static constexpr int kBlockBytes = ROWS * kRowBytes;
  static constexpr int kBytes = kBlocks * kBlockBytes;
  static_assert(ROWS % 16 == 0, "tiles hold whole 16-row steps (and 8-row swizzle atoms)");

  // Byte offset of (row, channel c): the swizzle (16-byte chunk index XOR row bits).
  static __host__ __device__ __forceinline__ int offset(int row, int c) {  // (host: csrc/tests)
    const int chunk = (c % 64) / 8;
    const int swz = kRowBytes == 128 ? (row & 7) : ((row >> 1) & 3);
    return (c / 64) * kBlockBytes + row * kRowBytes + ((chunk ^ swz) << 4) + (c % 8) * 2;
  }

  // The operand "rows row0.., channels 16 kk .. 16 kk + 15" with the channels as the
  // reduction (K-major): A of Q K^T, or its B (the rows are then the N columns).
  static __device__ __forceinline__ uint64_t k_major(const unsigned char* tile, int row0, int kk) {
    const int cb = (kk * 16) / 64, within = ((kk * 16) % 64) * 2;
    return smem_desc<kRowBytes>(tile, 16, 8 * kRowBytes, cb * kBlockBytes + row0 * kRowBytes + within);
  }

  // The operand "rows 16 kk .. 16 kk + 15, all HD channels" with the rows as the reduction
  // (MN-major B): V of P V, K of dS K, Q or dO of the dK / dV products.
  static __device__ __forceinline__ uint64_t mn_major(const unsigned char* tile, int kk) {
    return smem_desc<kRowBytes>(tile, kBlockBytes, 8 * kRowBytes, kk * 16 * kRowBytes);
  }
};

}  }  // namespace nattn::sm90
