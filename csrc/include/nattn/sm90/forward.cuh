// Hopper (sm_90a) fused NA forward: TMA loads, wgmma products, warp specialization.
//
// A CTA of 3 warpgroups serves one query box (tiles.cuh) of one (batch, head):
//   warpgroup 0, one thread: the producer. It loads the query box once and then the key
//     and value boxes covering the union of the queries' windows, each with one bulk
//     tensor copy per 64 channels into a ring of STAGES shared-memory slots; the copies
//     complete on the slot's "full" mbarriers, and the producer waits on the slot's
//     "empty" mbarrier before reusing it.
//   warpgroups 1 and 2: consumers, 64 queries each. Per key box: S = Q K^T (wgmma, both
//     operands in shared memory), the window mask (only on boxes that are not inside every
//     query's window) and RPB, online softmax in the accumulator registers, then
//     O += P V (wgmma, P from registers). Finally O / l and the LSE are written.
// Dilation is the tensor maps' element stride (docs/kernels.md), so the copy engine
// gathers a dilation group directly; boxes reaching past the tensor are zero-filled.
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/common/softmax.cuh"
#include "nattn/common/window.cuh"
#include "nattn/sm90/ptx.cuh"
#include "nattn/sm90/tiles.cuh"
#include "nattn/sm90/wgmma_ops.cuh"

namespace nattn { namespace sm90 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups

// Shared-memory geometry for head dim HD and NK keys per box: rows of min(HD, 64)
// channels (one swizzle span), HD / 64 column blocks per tile, a ring of STAGES key/value
// slots.
template <int HD, int NK>
struct Smem {
  static constexpr int kRowBytes = HD >= 64 ? 128 : HD * 2;   // = the swizzle span
  static constexpr int kBlocks = HD >= 64 ? HD / 64 : 1;      // column blocks
  static constexpr int kBlockBytes = kQueryRows * kRowBytes;  // one column block of the Q tile
  static constexpr int kTileBytes = kBlocks * kBlockBytes;    // 128 x HD, 16-bit
  static constexpr int kKvBlockBytes = NK * kRowBytes;        // one column block of a K/V tile
  static constexpr int kKvTileBytes = kBlocks * kKvBlockBytes;
  static constexpr int kStages = 3;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kTileBytes;
  static constexpr int kV = kK + kStages * kKvTileBytes;
  static constexpr int kBars = kV + kStages * kKvTileBytes;  // q_full, k_full[S], v_full[S], empty[S]
  static constexpr int kBytes = kBars + 8 * (1 + 3 * kStages);
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  static_assert(kAlloc <= 227 * 1024, "more shared memory than a Hopper block may have");

  // Byte offset of (row, channel c) in a tile: the swizzle the copy engine writes
  // (16-byte chunk index XOR row bits), which the wgmma descriptors then describe.
  static __device__ __forceinline__ int offset(int row, int c) {
    const int chunk = (c % 64) / 8;
    const int swz = kRowBytes == 128 ? (row & 7) : ((row >> 1) & 3);
    return (c / 64) * kBlockBytes + row * kRowBytes + ((chunk ^ swz) << 4) + (c % 8) * 2;
  }
};

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<bf16_t>(float lo, float hi) { return pack_bf16(lo, hi); }
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) { return pack_f16(lo, hi); }

// TMA coordinates (innermost first) of a box: channel, the spatial axes from last to
// first (real coordinates: group g plus dilation times the group coordinate), batch.
template <int NA>
__device__ __forceinline__ void box_coords(const Params& p, const CtaTile& t, const int* first, int channel,
                                           int batch, int* c) {
  c[0] = channel;
#pragma unroll
  for (int a = 0; a < NA; ++a) c[NA - a] = t.g[a] + p.dilation[a] * first[a];
  c[NA + 1] = batch;
}

// The window bounds of one query row, as key offsets relative to a key box origin.
struct RowWindow {
  int lo[3], hi[3];  // inclusive, group coordinates
  int rpb;           // the row's part of the RPB index (head included)
};

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(kThreads, 1)
    forward_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                   const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v) {
#if NATTN_SM90_ENABLED
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  constexpr int kNk = KB::kSize;  // keys per box
  using S = Smem<HD, kNk>;
  constexpr int kRank = NA + 2;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = bars + 1 + S::kStages;
  uint64_t* empty = bars + 1 + 2 * S::kStages;

  CtaTile tile;
  if (!cta_tile<NA, QB, KB>(p, blockIdx.x, tile)) return;  // uniform over the CTA
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = h / p.groups;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(q_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(empty + s, 8);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------ producer
    regs_dealloc<40>();
    if (warp != 0 || lane != 0) return;
    constexpr int kChannels = HD >= 64 ? 64 : HD;
    int c[5];
    mbar_expect_tx(q_full, S::kTileBytes);
    for (int cb = 0; cb < S::kBlocks; ++cb) {
      box_coords<NA>(p, tile, tile.q0, h * HD + cb * kChannels, b, c);
      tma_load<kRank>(smem + S::kQ + cb * S::kBlockBytes, &map_q, q_full, c);
    }
    for (int k = 0; k < tile.tiles; ++k) {
      const int s = k % S::kStages;
      if (k >= S::kStages) mbar_wait(empty + s, ((k / S::kStages) - 1) & 1);
      int origin[3];
      key_origin<NA, KB>(tile, k, origin);
      mbar_expect_tx(k_full + s, S::kKvTileBytes);
      for (int cb = 0; cb < S::kBlocks; ++cb) {
        box_coords<NA>(p, tile, origin, h_kv * HD + cb * kChannels, b, c);
        tma_load<kRank>(smem + S::kK + s * S::kKvTileBytes + cb * S::kKvBlockBytes, &map_k, k_full + s, c);
      }
      mbar_expect_tx(v_full + s, S::kKvTileBytes);
      for (int cb = 0; cb < S::kBlocks; ++cb) {
        box_coords<NA>(p, tile, origin, h_kv * HD + cb * kChannels, b, c);
        tma_load<kRank>(smem + S::kV + s * S::kKvTileBytes + cb * S::kKvBlockBytes, &map_v, v_full + s, c);
      }
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  regs_alloc<232>();
  const int cw = wg - 1;             // consumer warpgroup 0 or 1: query rows 64 cw ..
  const int wr = (warp % 4) * 16;    // the warp's first row inside the warpgroup
  const int g4 = lane / 4, t4 = lane % 4;

  // The lane's two rows (wr + g4 and + 8): validity, windows, RPB row part.
  RowWindow row[2];
  bool row_ok[2];
  int rpb_mult[3] = {1, 1, 1};
  for (int a = NA - 2; a >= 0; --a) rpb_mult[a] = rpb_mult[a + 1] * p.rpb_size[a + 1];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qr = cw * kWgRows + wr + g4 + 8 * r;
    row_ok[r] = true;
    row[r].rpb = h * int(p.rpb_head_size);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int i = tile.q0[a] + QB::offset(qr, a);
      row_ok[r] = row_ok[r] && i < tile.len[a];
      const int ic = nattn_min(i, tile.len[a] - 1);
      const AxisRange w = query_window(ic, tile.len[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
      row[r].lo[a] = w.start;
      row[r].hi[a] = w.start + w.count - 1;
      row[r].rpb += (p.kernel[a] - 1 - ic) * rpb_mult[a];
    }
  }
  // Key boxes inside the window of every query of this warpgroup need no mask: the
  // windows' bounds only grow with the query, so the extreme queries decide.
  int full_lo[3], full_hi[3];
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    int first = tile.q0[a], last = tile.q0[a] + QB::extent(a) - 1;
    if (a == 0) {
      first = tile.q0[0] + cw * (QB::extent(0) / 2);
      last = first + QB::extent(0) / 2 - 1;
    }
    first = nattn_min(first, tile.len[a] - 1);
    last = nattn_min(last, tile.len[a] - 1);
    const bool c = p.causal[a] != 0;
    const AxisRange wf = query_window(first, tile.len[a], p.kernel[a], p.stride[a], c);
    const AxisRange wl = query_window(last, tile.len[a], p.kernel[a], p.stride[a], c);
    full_lo[a] = wl.start;
    full_hi[a] = wf.start + wf.count - 1;
  }

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const bool has_rpb = p.rpb != nullptr;
  const unsigned char* q_tile = smem + S::kQ + cw * kWgRows * S::kRowBytes;

  // S = Q K^T of key box k, issued (completes at the next wgmma wait).
  auto issue_s = [&](int k, float (&sc)[kNk / 2]) {
    const int s = k % S::kStages;
    const unsigned char* k_tile = smem + S::kK + s * S::kKvTileBytes;
    mbar_wait(k_full + s, (k / S::kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int cb = (kk * 16) / 64, within = ((kk * 16) % 64) * 2;
      const uint64_t da = smem_desc<S::kRowBytes>(q_tile + cb * S::kBlockBytes + within, 16, 8 * S::kRowBytes);
      const uint64_t db = smem_desc<S::kRowBytes>(k_tile + cb * S::kKvBlockBytes + within, 16, 8 * S::kRowBytes);
      wgmma_ss<T, kNk>(sc, da, db, kk > 0);
    }
    wgmma_commit();
  };
  // O += P V of key box k, issued.
  auto issue_pv = [&](int k, const uint32_t (&pa)[kNk / 16][4]) {
    const int s = k % S::kStages;
    const unsigned char* v_tile = smem + S::kV + s * S::kKvTileBytes;
    mbar_wait(v_full + s, (k / S::kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kNk / 16; ++kk) {
      const uint64_t dv = smem_desc<S::kRowBytes>(v_tile + kk * 16 * S::kRowBytes, S::kKvBlockBytes, 8 * S::kRowBytes);
      wgmma_rs<T, HD>(o, pa[kk], dv, 1);
    }
    wgmma_commit();
  };
  // Scale, mask (boxes not inside every window), bias; online softmax: sc becomes P in
  // fp32, m and l move on, and alpha is the factor O must be rescaled by.
  auto softmax = [&](int k, float (&sc)[kNk / 2], float (&alpha)[2]) {
    int origin[3] = {0, 0, 0};
    key_origin<NA, KB>(tile, k, origin);
    bool full = true;
#pragma unroll
    for (int a = 0; a < NA; ++a)
      full = full && origin[a] >= full_lo[a] && origin[a] + KB::extent(a) - 1 <= full_hi[a];
    float mx[2] = {-INFINITY, -INFINITY};
    // Unmasked boxes (the common case of large windows) keep the raw scores: the row max
    // is taken on them and the scale folds into the exponent's FFMA below. (A negative
    // scale would turn the max into a min: those take the general path.)
    float mul = 1.f;
    if (full && !has_rpb && p.scale_log2 > 0.f) {
#pragma unroll
      for (int i = 0; i < kNk / 2; ++i) mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], sc[i]);
      mx[0] *= p.scale_log2;
      mx[1] *= p.scale_log2;
      mul = p.scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < kNk / 2; ++i) {
        const int r = (i / 2) % 2;
        const int col = 8 * (i / 4) + 2 * t4 + (i % 2);
        float x = sc[i] * p.scale_log2;
        bool in = true;
        int rpb_col = 0;
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          const int key = origin[a] + KB::offset(col, a);
          in = in && key >= row[r].lo[a] && key <= row[r].hi[a];
          rpb_col += key * rpb_mult[a];
        }
        if (!in) x = -INFINITY;
        else if (has_rpb) x += __ldg(p.rpb + row[r].rpb + rpb_col) * kLog2e;
        sc[i] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    }
    float m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing seen yet stays at zero
      alpha[r] = fast_exp2(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < kNk / 2; ++i) {
      sc[i] = fast_exp2(fmaf(sc[i], mul, -m_use[(i / 2) % 2]));
      l[(i / 2) % 2] += sc[i];
    }
  };
  auto pack_p = [&](const float (&sc)[kNk / 2], uint32_t (&pa)[kNk / 16][4]) {
#pragma unroll
    for (int i = 0; i < kNk / 2; i += 2) pa[i / 8][(i % 8) / 2] = pack2<T>(sc[i], sc[i + 1]);
  };
  auto release = [&](int k) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + k % S::kStages);
  };

  // Pipelined as FlashAttention-3 does: while the tensor cores run P_{k-1} V_{k-1}, the
  // warpgroup computes the softmax of box k (issued just before). The two consumer
  // warpgroups also take turns issuing (barriers 3 and 4), so one's softmax overlaps the
  // other's products.
  const int my_turn = 3 + cw, their_turn = 4 - cw;
  float sc[kNk / 2], alpha[2];
  uint32_t pa[kNk / 16][4];
  mbar_wait(q_full, 0);
  issue_s(0, sc);
  wgmma_wait<0>();
  fence_regs(sc);
  softmax(0, sc, alpha);
  pack_p(sc, pa);
  if (cw == 1 && tile.tiles > 1) named_arrive(their_turn, 256);  // warpgroup 0 goes first
  for (int k = 1; k < tile.tiles; ++k) {
    named_sync(my_turn, 256);
    issue_s(k, sc);
    issue_pv(k - 1, pa);
    if (cw == 0 || k + 1 < tile.tiles) named_arrive(their_turn, 256);
    wgmma_wait<1>();  // S of box k is in; P_{k-1} V_{k-1} may still run
    fence_regs(sc);
    softmax(k, sc, alpha);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    release(k - 1);
    // Once the row maxima settle (most boxes of a large window) alpha is 1: skip the rescale.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) o[i] *= alpha[(i / 2) % 2];
    }
    pack_p(sc, pa);
  }
  issue_pv(tile.tiles - 1, pa);
  wgmma_wait<0>();
  fence_regs(o);
  fence_regs(pa);
  release(tile.tiles - 1);

  // O / l through shared memory (the warpgroup's own query rows, no longer read), then
  // 16-byte stores of whole rows; the LSE from the lanes holding column 0.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    inv[r] = inv_row_sum(l[r]);
  }
  unsigned char* stage = smem + S::kQ;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int r = (i / 2) % 2;
    const int qr = cw * kWgRows + wr + g4 + 8 * r;
    const int col = 8 * (i / 4) + 2 * t4;
    *reinterpret_cast<uint32_t*>(stage + S::offset(qr, col)) = pack2<T>(o[i] * inv[r], o[i + 1] * inv[r]);
  }
  if (t4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!row_ok[r]) continue;
      const int qr = cw * kWgRows + wr + g4 + 8 * r;
      int64_t token = 0;
#pragma unroll
      for (int a = 0; a < NA; ++a)
        token = token * p.spatial[a] + tile.g[a] + int64_t(p.dilation[a]) * (tile.q0[a] + QB::offset(qr, a));
      p.lse[(int64_t(b) * p.tokens + token) * p.heads + h] = row_lse(m[r], l[r]);
    }
  }
  named_sync(1 + cw, 128);
  T* out = head_base<T>(p.out, p.out_s, b, h);
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x - 128 * wg; idx < kWgRows * kChunks; idx += 128) {
    const int qr = cw * kWgRows + idx / kChunks, ch = idx % kChunks;
    int64_t off = 0;
    bool ok = true;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int i = tile.q0[a] + QB::offset(qr, a);
      ok = ok && i < tile.len[a];
      off += int64_t(tile.g[a] + p.dilation[a] * i) * p.out_s[1 + a];
    }
    if (ok)
      *reinterpret_cast<uint4*>(out + off + ch * 8) = *reinterpret_cast<const uint4*>(stage + S::offset(qr, ch * 8));
  }
#endif
}

}  }  // namespace nattn::sm90
