// The split-KV forward's merge: S CTAs computed one query box over S slices of its key
// boxes, each leaving its rows' output (normalised by its own sum, fp32) and LSE in
// Params::o_part / lse_part, box-local (slot (batch, head, box x split) of QB::kSize rows in
// box order); a row's result is their average weighted by exp(LSE_s - LSE), LSE = logsumexp
// over s (a slice that saw no key has LSE -inf and weight 0). One thread per (row, 8
// channels): kMergeChunks blocks per (box, head, batch), so that every item of the grid
// loads at once (with one block per box, 64 boxes took 8 us of a 31 us split forward on
// the H200: each thread walked 8 items one load latency after the other).
#pragma once
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/sm90/forward.cuh"

namespace nattn { namespace sm90 {

constexpr int kMergeThreads = 256;
// Blocks per query box of the merge (its grid is boxes x this, heads, batch).
template <int HD, class QB>
constexpr int merge_chunks() { return (QB::kSize * (HD / 8) + kMergeThreads - 1) / kMergeThreads; }

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(kMergeThreads) split_kv_merge_kernel(const Params p) {
  using QB = typename Tl::Q;
  constexpr int kParts = HD / 8, kChunks = merge_chunks<HD, QB>();
  const int box = blockIdx.x / kChunks, boxes = gridDim.x / kChunks;
  CtaTile tile;
  if (!cta_tile<NA, QB, typename Tl::K>(p, box, tile)) return;  // a box without queries wrote nothing
  const int h = blockIdx.y, b = blockIdx.z, splits = p.kv_splits;
  const int64_t slot0 = ((int64_t(b) * p.heads + h) * boxes + box) * splits;
  T* out = head_base<T>(p.out, p.out_s, b, h);
  const int item = (blockIdx.x % kChunks) * kMergeThreads + threadIdx.x;
  if (item >= QB::kSize * kParts) return;
  const int qr = item / kParts, part = item % kParts;
  int64_t token, off;
  const bool ok = box_row_token<NA, QB>(p, tile, tile.q0, qr, token);
  box_row_offset<NA, QB>(p, tile, tile.q0, qr, p.out_s, off);
  if (!ok) return;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, p.lse_part[(slot0 + s) * QB::kSize + qr]);
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, sum = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const int64_t row = (slot0 + s) * QB::kSize + qr;
      const float w = __expf(p.lse_part[row] - m);
      sum += w;
      const float4* o = reinterpret_cast<const float4*>(p.o_part + row * HD + part * 8);
      const float4 x = o[0], y = o[1];
      acc[0] += w * x.x; acc[1] += w * x.y; acc[2] += w * x.z; acc[3] += w * x.w;
      acc[4] += w * y.x; acc[5] += w * y.y; acc[6] += w * y.z; acc[7] += w * y.w;
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  uint4 packed;
  packed.x = pack2<T>(acc[0] * inv, acc[1] * inv);
  packed.y = pack2<T>(acc[2] * inv, acc[3] * inv);
  packed.z = pack2<T>(acc[4] * inv, acc[5] * inv);
  packed.w = pack2<T>(acc[6] * inv, acc[7] * inv);
  *reinterpret_cast<uint4*>(out + off + part * 8) = packed;
  if (part == 0) p.lse[(int64_t(b) * p.tokens + token) * p.heads + h] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

}  }  // namespace nattn::sm90
