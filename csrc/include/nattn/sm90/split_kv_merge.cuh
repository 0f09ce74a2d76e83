// The split-KV forward's merge: S CTAs computed one query box over S slices of its key
// boxes, each leaving its output (normalised by its own sum, fp32) and LSE in
// Params::o_part / lse_part; the row's result is their average weighted by exp(LSE_s - LSE),
// LSE = logsumexp over s (a slice that saw no key has LSE -inf and weight 0). One thread per
// (row, 8 channels): memory-bound, a few microseconds next to the forward it follows.
#pragma once
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/sm90/forward.cuh"

namespace nattn { namespace sm90 {

constexpr int kMergeThreads = 256;

template <typename T, int HD>
__global__ void __launch_bounds__(kMergeThreads) split_kv_merge_kernel(const Params p) {
  constexpr int kParts = HD / 8;
  const int64_t rows = int64_t(p.batch) * p.tokens * p.heads;
  const int64_t idx = int64_t(blockIdx.x) * kMergeThreads + threadIdx.x;
  const int64_t row = idx / kParts;
  const int part = int(idx % kParts);
  if (row >= rows) return;
  float m = -INFINITY;
  for (int s = 0; s < p.kv_splits; ++s) m = fmaxf(m, p.lse_part[s * rows + row]);
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, sum = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < p.kv_splits; ++s) {
      const float w = __expf(p.lse_part[s * rows + row] - m);
      sum += w;
      const float4* o = reinterpret_cast<const float4*>(p.o_part + (s * rows + row) * HD + part * 8);
      const float4 a = o[0], b = o[1];
      acc[0] += w * a.x; acc[1] += w * a.y; acc[2] += w * a.z; acc[3] += w * a.w;
      acc[4] += w * b.x; acc[5] += w * b.y; acc[6] += w * b.z; acc[7] += w * b.w;
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  const int h = int(row % p.heads);
  int64_t token = (row / p.heads) % p.tokens;
  const int b = int(row / (int64_t(p.heads) * p.tokens));
  int64_t off = 0;
  for (int a = p.na_dim - 1; a >= 0; --a) {
    off += (token % p.spatial[a]) * p.out_s[1 + a];
    token /= p.spatial[a];
  }
  uint4 out;
  out.x = pack2<T>(acc[0] * inv, acc[1] * inv);
  out.y = pack2<T>(acc[2] * inv, acc[3] * inv);
  out.z = pack2<T>(acc[4] * inv, acc[5] * inv);
  out.w = pack2<T>(acc[6] * inv, acc[7] * inv);
  *reinterpret_cast<uint4*>(head_base<T>(p.out, p.out_s, b, h) + off + part * 8) = out;
  if (part == 0) p.lse[row] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

}  }  // namespace nattn::sm90
