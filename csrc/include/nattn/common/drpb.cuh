// dRPB accumulated per block in shared memory, then added to the float32 gradient buffer:
// the staging shared by the dK/dV kernels of every family. The table of a KV head's query
// heads, [groups, rpb_head_size], is staged when it fits (p.rpb_in_smem); otherwise the
// kernels add straight into global memory.
#pragma once
#include "nattn/common/registry.h"

namespace nattn {

// Largest staged table: 48 KiB, which any block may add to its other shared memory on SM50+
// (with the tc kernels' tiles a block still fits on an SM80).
constexpr int64_t kMaxDrpbSmemBytes = 48 * 1024;

// Host: the dynamic shared memory a dK/dV launch stages dRPB in (0: none, or too large).
inline int64_t drpb_stage_bytes(const Params& p) {
  const int64_t bytes = int64_t(p.groups) * p.rpb_head_size * int64_t(sizeof(float));
  return p.rpb != nullptr && bytes <= kMaxDrpbSmemBytes ? bytes : 0;
}

// Zeroes the staged table; every thread of the block calls it (it synchronises).
__device__ __forceinline__ void drpb_stage_begin(float* smem, int64_t len) {
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) smem[i] = 0.f;
  __syncthreads();
}

// Adds the block's staged table to KV head hkv's query heads; every thread of the block calls it.
__device__ __forceinline__ void drpb_stage_flush(const Params& p, int hkv, const float* smem, int64_t len) {
  __syncthreads();
  float* dst = p.drpb + int64_t(hkv) * p.groups * p.rpb_head_size;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
    if (smem[i] != 0.f) atomicAdd(dst + i, smem[i]);
}

}  // namespace nattn
