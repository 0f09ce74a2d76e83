// Pieces of the strip and square dK/dV passes (backward_dkv_strips.cuh,
// backward_dkv_squares.cuh): the KV head's query heads' RPB tables and fixed-point dRPB
// tables in shared memory (StripDrpbLayout, strip_geometry.cuh), staged and flushed.
#pragma once
#include <stdint.h>

#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/sm90/strip_geometry.cuh"

namespace nattn { namespace sm90 {

constexpr int kDkvThreads = 128;  // both passes' CTAs: four warps

// The KV head hk's query heads' RPB tables (`table` entries each) times log2(e) into `bias`,
// their fixed-point dRPB tables (the layout's copies) zeroed; then the CTA's barrier.
__device__ __forceinline__ void stage_dkv_rpb(const Params& p, int hk, int table, float* bias, int* dbias,
                                              const StripDrpbLayout& dl) {
  const float* src = p.rpb + int64_t(hk) * p.groups * table;
  for (int i = threadIdx.x; i < p.groups * table; i += kDkvThreads) bias[i] = __ldg(src + i) * kLog2e;
  for (int i = threadIdx.x; i < dl.copies * dl.stride; i += kDkvThreads) dbias[i] = 0;
  __syncthreads();
}

// After the walk: each entry's sum over the layout's copies into the int64 table of KV head
// hk. Summed in registers: summing into copy 0 for drpb_fixed_add cost the strip pass's
// fixed-point loops 7-18 instructions a step at their register cap (ptxas's allocation;
// PERF.md fifty-eighth session).
__device__ __forceinline__ void flush_dkv_drpb(const Params& p, int hk, int table, const int* dbias,
                                               const StripDrpbLayout& dl) {
  __syncthreads();
  unsigned long long* dst = reinterpret_cast<unsigned long long*>(p.drpb_fixed) + int64_t(hk) * p.groups * table;
  for (int i = threadIdx.x; i < p.groups * table; i += kDkvThreads) {
    int sum = 0;  // (the copies' terms of an entry are the single table's: below 2^31 together)
    for (int c = 0; c < dl.copies; ++c) sum += dbias[c * dl.stride + i];
    if (sum != 0) atomicAdd(dst + i, (unsigned long long)(long long)sum);  // two's complement: signed sums
  }
}

}  }  // namespace nattn::sm90
