// Hopper (sm_90a) NA backward at head dim 256: the dQ pass and the dK/dV pass with the two
// consumer warpgroups splitting each step's products by role instead of by rows.
//
// At head dim 256 one warpgroup's dK and dV (64 keys x 256 channels each, fp32) would be 256
// registers a thread, and a CTA's Q and dO rows plus a ring of K / V boxes would pass a
// block's shared memory with 128-token boxes. So both passes use the tile pair's 64-token box
// on both sides, and both consumer warpgroups work on the same 64 rows:
//   dK/dV pass (a CTA owns 64 keys; per query box of their inverse neighbourhood):
//     warpgroup 1: S^T = K Q^T, P^T = exp2(S^T scale log2e + bias - LSE log2e) (masked),
//                  P^T to the other warpgroup through shared memory, dV += P^T dO
//     warpgroup 2: dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q (and dRPB)
//   dQ pass (a CTA owns 64 queries; per key box of their windows' union):
//     warpgroup 1: S = Q K^T, P (masked) to the other warpgroup, then dQ[:, :128] += dS K
//     warpgroup 2: dP = dO V^T, dS = P (dP - delta) to the other warpgroup, dQ[:, 128:] += dS K
// Each warpgroup then holds 128 accumulator registers (dV or dK: 64 x 256; or half of dQ's
// channels, 64 x 128), and each step's products split evenly: no product is computed twice.
// The exchanged 16-bit fragments (P or dS: 64 x 64, 8 KB) keep the accumulator layout: thread
// t of one warpgroup holds the scores thread t of the other needs, so the exchange is a plain
// per-thread copy (conflict-free 16-byte stores and loads) completing on an mbarrier of 128
// arrivals. Two exchange slots alternate by step; the two-stage ring orders their reuse (a
// warpgroup reaches step k + 2's operands only after the other released step k).
// Deterministic: no atomics on dQ, dK or dV (every query head of a KV head runs in one
// dK/dV CTA); dRPB as in the instances of head dims 32-128 (add_drpb, fixed point when the
// table is staged; tables above the room this pass leaves are declined, kernels.cuh).
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/drpb.cuh"
#include "nattn/common/drpb_fixed.cuh"
#include "nattn/sm90/backward_delta.cuh"
#include "nattn/sm90/backward_dkv.cuh"
#include "nattn/sm90/backward_dq.cuh"
#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/forward.cuh"
#include "nattn/sm90/smem_tile.cuh"

namespace nattn { namespace sm90 {

constexpr int kWideHeadDim = 256;

// A warpgroup's 64 x 64 fragment set in 16-bit pairs (the A operand of a register product):
// per thread kPieces uint4, stored [piece][thread] so that a warp's 16-byte accesses are
// consecutive.
struct Exchange {
  static constexpr int kPieces = 4;                // 16 x 32-bit words a thread
  static constexpr int kBytes = kPieces * 128 * 16;  // one slot: 8 KB
  static __device__ __forceinline__ void put(unsigned char* slot, int tid, const uint32_t (&f)[4][4]) {
    uint4* dst = reinterpret_cast<uint4*>(slot);
#pragma unroll
    for (int i = 0; i < kPieces; ++i) dst[i * 128 + tid] = make_uint4(f[i][0], f[i][1], f[i][2], f[i][3]);
  }
  static __device__ __forceinline__ void get(const unsigned char* slot, int tid, uint32_t (&f)[4][4]) {
    const uint4* src = reinterpret_cast<const uint4*>(slot);
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const uint4 v = src[i * 128 + tid];
      f[i][0] = v.x, f[i][1] = v.y, f[i][2] = v.z, f[i][3] = v.w;
    }
  }
};

// Shared memory of the wide dQ pass: Q and dO rows (64 x 256), a two-stage ring of (K, V)
// boxes, two exchange slots, barriers.
struct DqWideSmem {
  using Rows = TileSmem<kWideHeadDim, kWgRows>;
  static constexpr int kStages = 2;
  static constexpr int kQ = 0;
  static constexpr int kDo = kQ + Rows::kBytes;
  static constexpr int kK = kDo + Rows::kBytes;
  static constexpr int kV = kK + kStages * Rows::kBytes;
  static constexpr int kX = kV + kStages * Rows::kBytes;
  // rows_full, k_full[S], v_full[S], empty[S], p_full[2], ds_full[2]
  static constexpr int kBars = kX + 2 * Exchange::kBytes;
  static constexpr int kBytes = kBars + 8 * (1 + 3 * kStages + 4);
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  static_assert(kAlloc <= 227 * 1024, "more shared memory than a Hopper block may have");
};

// Shared memory of the wide dK/dV pass: K and V rows, a two-stage ring of (Q, dO) boxes, two
// exchange slots, the stages' (LSE, delta) rows, barriers, then the staged dRPB table.
struct DkvWideSmem {
  using Rows = TileSmem<kWideHeadDim, kWgRows>;
  static constexpr int kStages = 2;
  static constexpr int kK = 0;
  static constexpr int kV = kK + Rows::kBytes;
  static constexpr int kQ = kV + Rows::kBytes;
  static constexpr int kDo = kQ + kStages * Rows::kBytes;
  static constexpr int kX = kDo + kStages * Rows::kBytes;
  static constexpr int kLd = kX + 2 * Exchange::kBytes;  // [stage][lse2 64 | delta 64] floats
  // kv_full, qd_full[S], ld_full[S], empty[S], ld_empty[S], p_full[2]
  static constexpr int kBars = kLd + kStages * 2 * kWgRows * 4;
  static constexpr int kDrpb = kBars + 8 * (1 + 4 * kStages + 2);
  static constexpr int kAllocFixed = kDrpb + 1024;
  static constexpr int kDrpbRoom = 227 * 1024 - kAllocFixed;  // bytes of dRPB table it stages
  static_assert(kDrpbRoom > 0, "more shared memory than a Hopper block may have");
};

template <typename T, int NA, class Tl>
__global__ void __launch_bounds__(kThreads, 1)
    backward_dq_wide_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                            const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                            const __grid_constant__ CUtensorMap map_v) {
#if NATTN_SM90_ENABLED
  constexpr int HD = kWideHeadDim;
  using B = typename Tl::K;  // the query box and the key boxes
  constexpr int kN = B::kSize;
  static_assert(kN == kWgRows, "the wide passes use the pair's 64-token box on both sides");
  using S = DqWideSmem;
  using R = S::Rows;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* rows_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + S::kStages;
  uint64_t* empty = v_full + S::kStages;
  uint64_t* p_full = empty + S::kStages;  // [slot]: warpgroup 1's P stored
  uint64_t* ds_full = p_full + 2;         // [slot]: warpgroup 2's dS stored

  CtaTile tile;
  if (!cta_tile<NA, B, B>(p, blockIdx.x, tile)) return;  // uniform over the CTA
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = kv_head(p, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warpgroup_index();

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(rows_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(empty + s, 8);  // one arrival per consumer warp
    }
    for (int x = 0; x < 2; ++x) {
      mbar_init(p_full + x, 128);
      mbar_init(ds_full + x, 128);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------ producer
    regs_dealloc<DefaultRegisterSplit::kProducer>();
    if (warp != 0 || lane != 0) return;
    int c[5];
    const HeadCoords hq = head_coords<HD>(p, kRowsQ, p.heads, h, b);
    const HeadCoords hdo = head_coords<HD>(p, kRowsGradOut, p.heads, h, b);
    mbar_expect_tx(rows_full, 2 * R::kBytes);
    for (int cb = 0; cb < R::kBlocks; ++cb) {
      box_coords<NA>(p, tile, tile.q0, hq.channel + cb * R::kChannels, hq.outer, c);
      tma_load_box<NA, B, R::kRowBytes>(p, smem + S::kQ + cb * R::kBlockBytes, &map_q, rows_full, c);
      box_coords<NA>(p, tile, tile.q0, hdo.channel + cb * R::kChannels, hdo.outer, c);
      tma_load_box<NA, B, R::kRowBytes>(p, smem + S::kDo + cb * R::kBlockBytes, &map_do, rows_full, c);
    }
    produce_kv_ring<NA, HD, B, R, S::kStages>(p, tile, h_kv, b, smem + S::kK, smem + S::kV, &map_k, &map_v, k_full,
                                             v_full, empty);
    return;
  }

  // ---------------------------------------------------------------- consumers
  regs_alloc<DefaultRegisterSplit::kConsumer>();
  const int role = wg - 1;  // 0: S, P and dQ's first 128 channels; 1: dP, dS and the rest
  const int tid = threadIdx.x - 128 * wg;
  const int wr = (warp % 4) * 16;
  const int g4 = lane / 4, t4 = lane % 4;

  // The lane's two query rows (both warpgroups hold the same): windows, RPB row part, LSE
  // (log2 units), delta (from the delta kernel: Params::delta_in_dq is 0 here).
  RowWindow row[2];
  float lse2[2], dlt[2];
  int64_t row_idx;
  int rpb_mult[3] = {1, 1, 1};
  for (int a = NA - 2; a >= 0; --a) rpb_mult[a] = rpb_mult[a + 1] * p.rpb_size[a + 1];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    dq_query_row<NA, B>(p, tile, b, h, wr + g4 + 8 * r, rpb_mult, row[r], lse2[r], dlt[r], row_idx);
  int full_lo[3], full_hi[3];  // key boxes inside every window of the box's queries
  unmasked_boxes<NA, B, false, false>(p, tile, 0, full_lo, full_hi);

  float dq[HD / 4];  // this warpgroup's 128 channels of dQ
#pragma unroll
  for (int i = 0; i < HD / 4; ++i) dq[i] = 0.f;
  const bool has_rpb = p.rpb != nullptr;
  unsigned ds_max = 0;  // with RPB: the largest |dS| of the lane's scores, as float bits
  const unsigned char* q_tile = smem + S::kQ;
  const unsigned char* do_tile = smem + S::kDo;
  mbar_wait(rows_full, 0);

  BoxWalk<NA, B> walk(tile);
  for (int k = 0; k < tile.tiles; ++k, walk.next(tile)) {
    const int s = k % S::kStages, phase = (k / S::kStages) & 1;
    const int x = k % 2, x_phase = (k / 2) & 1;
    unsigned char* slot = smem + S::kX + x * Exchange::kBytes;
    const unsigned char* k_tile = smem + S::kK + s * R::kBytes;
    const unsigned char* v_tile = smem + S::kV + s * R::kBytes;
    float sc[kN / 2];
    uint32_t ds[kN / 16][4];
    mbar_wait(k_full + s, phase);  // K: both warpgroups' dQ products
    if (role == 0) {  // S = Q K^T, then P
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        wgmma_ss<T, kN>(sc, R::k_major(q_tile, 0, kk), R::k_major(k_tile, 0, kk), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(sc);
      const int* origin = walk.origin;
      bool full = true;
#pragma unroll
      for (int a = 0; a < NA; ++a)
        full = full && origin[a] >= full_lo[a] && origin[a] + B::extent(a) - 1 <= full_hi[a];
      if (full && !has_rpb) {
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) sc[i] = fast_exp2(fmaf(sc[i], p.scale_log2, -lse2[(i / 2) % 2]));
      } else if (!has_rpb) {
        const RowPairMask<NA, B> mask(row[0].lo, row[0].hi, row[1].lo, row[1].hi, origin, t4);
#pragma unroll
        for (int i = 0; i < kN / 2; ++i)
          sc[i] = kept(mask.in(i), fast_exp2(fmaf(sc[i], p.scale_log2, -lse2[(i / 2) % 2])));
      } else {
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) {
          const int r = (i / 2) % 2;
          const int col = 8 * (i / 4) + 2 * t4 + (i % 2);
          bool in = true;
          int rpb_col = 0;
#pragma unroll
          for (int a = 0; a < NA; ++a) {
            const int key = origin[a] + B::offset(col, a);
            in = in && key >= row[r].lo[a] && key <= row[r].hi[a];
            rpb_col += key * rpb_mult[a];
          }
          const float xs = sc[i] * p.scale_log2 + (in ? __ldg(p.rpb + row[r].rpb + rpb_col) * kLog2e : 0.f);
          sc[i] = in ? fast_exp2(xs - lse2[r]) : 0.f;
        }
      }
#pragma unroll
      for (int i = 0; i < kN / 2; i += 2) ds[i / 8][(i % 8) / 2] = pack2<T>(sc[i], sc[i + 1]);
      Exchange::put(slot, tid, ds);
      mbar_arrive(p_full + x);
      mbar_wait(ds_full + x, x_phase);
      Exchange::get(slot, tid, ds);
    } else {  // dP = dO V^T, then dS = P (dP - delta)
      mbar_wait(v_full + s, phase);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        wgmma_ss<T, kN>(sc, R::k_major(do_tile, 0, kk), R::k_major(v_tile, 0, kk), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(sc);
      mbar_wait(p_full + x, x_phase);
      Exchange::get(slot, tid, ds);  // P
#pragma unroll
      for (int i = 0; i < kN / 2; i += 2) {
        const int r = (i / 2) % 2;
        const float2 pr = unpack2<T>(ds[i / 8][(i % 8) / 2]);
        const float d0 = pr.x * (sc[i] - dlt[r]), d1 = pr.y * (sc[i + 1] - dlt[r]);
        if (has_rpb) ds_max = drpb_abs_max(drpb_abs_max(ds_max, d0), d1);
        ds[i / 8][(i % 8) / 2] = pack2<T>(d0, d1);
      }
      Exchange::put(slot, tid, ds);  // over P: this thread's own words, read above
      mbar_arrive(ds_full + x);
    }
    // dQ[:, 128 role ..] += dS K: K's channel blocks 2 role, 2 role + 1 as the MN-major B.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      wgmma_rs<T, HD / 2>(dq, ds[kk], R::mn_major(k_tile + role * 2 * R::kBlockBytes, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(dq);
    fence_regs(ds);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + s);  // this warp's reads of the stage are done
  }

  if (p.drpb_max && role == 1) {
    ds_max = __reduce_max_sync(0xffffffffu, ds_max);
    if (lane == 0) atomicMax(p.drpb_max + h, ds_max);
  }
  // dQ * scale through this warpgroup's own operand rows (Q for warpgroup 1, dO for 2: no
  // longer read), then whole-row stores of its 128 channels.
  unsigned char* stage = smem + (role == 0 ? S::kQ : S::kDo);
  const int ch0 = role * (HD / 2);
#pragma unroll
  for (int i = 0; i < HD / 4; i += 2) {
    const int qr = wr + g4 + 8 * ((i / 2) % 2);
    const int col = ch0 + 8 * (i / 4) + 2 * t4;
    *reinterpret_cast<uint32_t*>(stage + R::offset(qr, col)) = pack2<T>(dq[i] * p.scale, dq[i + 1] * p.scale);
  }
  named_sync(1 + role, 128);
  T* out = head_base<T>(p.dq, p.dq_s, b, h);
  constexpr int kChunks = HD / 2 / 8;
  for (int idx = tid; idx < kN * kChunks; idx += 128) {
    const int qr = idx / kChunks, ch = ch0 + (idx % kChunks) * 8;
    int64_t off;
    if (box_row_offset<NA, B>(p, tile, tile.q0, qr, p.dq_s, off))
      *reinterpret_cast<uint4*>(out + off + ch) = *reinterpret_cast<const uint4*>(stage + R::offset(qr, ch));
  }
#endif
}

template <typename T, int NA, class Tl>
__global__ void __launch_bounds__(kThreads, 1)
    backward_dkv_wide_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_k,
                             const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_q,
                             const __grid_constant__ CUtensorMap map_do) {
#if NATTN_SM90_ENABLED
  constexpr int HD = kWideHeadDim;
  using B = typename Tl::K;  // the CTA's keys and the query boxes
  constexpr int kN = B::kSize;
  static_assert(kN == kWgRows, "the wide passes use the pair's 64-token box on both sides");
  using S = DkvWideSmem;
  using R = S::Rows;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* kv_full = bars;
  uint64_t* qd_full = bars + 1;
  uint64_t* ld_full = qd_full + S::kStages;
  uint64_t* empty = ld_full + S::kStages;
  uint64_t* ld_empty = empty + S::kStages;
  uint64_t* p_full = ld_empty + S::kStages;  // [slot]: warpgroup 1's P^T stored
  float* drpb_smem = reinterpret_cast<float*>(smem + S::kDrpb);

  CtaTile tile;
  if (!cta_tile_inverse<NA, B, B>(p, blockIdx.x, tile)) return;  // uniform over the CTA
  const int h_kv = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warpgroup_index();
  const int steps = tile.tiles * p.groups;  // (query head, query box) pairs
  // A staged table sums in fixed point (the launcher stages it only with the workspace).
  const bool fixed = p.rpb != nullptr && p.rpb_in_smem;
  const int64_t rpb_len = int64_t(p.groups) * p.rpb_head_size;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    mbar_init(kv_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(qd_full + s, 1);
      mbar_init(ld_full + s, 32);    // every lane of the LSE / delta warp
      mbar_init(empty + s, 8);       // one arrival per consumer warp
      mbar_init(ld_empty + s, 256);  // every consumer thread, after its last read of the stage's rows
    }
    for (int x = 0; x < 2; ++x) mbar_init(p_full + x, 128);
    fence_barrier_init();
  }
  if (fixed)
    for (int64_t i = threadIdx.x; i < rpb_len; i += kThreads) drpb_smem[i] = 0.f;
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------ producers
    regs_dealloc<DefaultRegisterSplit::kProducer>();
    if (warp == 0 && lane == 0)
      produce_dkv_rows<NA, HD, B, B, R, R, S::kStages>(p, tile, h_kv, b, 0, 0, steps, smem + S::kK, smem + S::kV,
                                                      smem + S::kQ, smem + S::kDo, &map_k, &map_v, &map_q,
                                                      &map_do, kv_full, qd_full, empty);
    else if (warp == 1)
      produce_lse_delta<NA, B, S::kStages>(p, tile, h_kv, b, 0, steps, lane, reinterpret_cast<float*>(smem + S::kLd),
                                           ld_full, ld_empty);
    return;
  }

  // ---------------------------------------------------------------- consumers
  regs_alloc<DefaultRegisterSplit::kConsumer>();
  const int role = wg - 1;  // 0: S^T, P^T and dV; 1: dP^T, dS^T, dK and dRPB
  const int tid = threadIdx.x - 128 * wg;
  const int wr = (warp % 4) * 16;
  const int g4 = lane / 4, t4 = lane % 4;

  // The lane's two key rows: validity, the queries that see them (per axis), the key's part
  // of the RPB index (k - 1 - query + key per axis; the query part comes per score).
  int lo[2][3], hi[2][3], row_rpb[2];
  bool row_ok[2];
  int rpb_mult[3] = {1, 1, 1};
  for (int a = NA - 2; a >= 0; --a) rpb_mult[a] = rpb_mult[a + 1] * p.rpb_size[a + 1];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kr = wr + g4 + 8 * r;
    row_ok[r] = true;
    row_rpb[r] = 0;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int j = tile.q0[a] + B::offset(kr, a);
      row_ok[r] = row_ok[r] && j < tile.len[a];
      const int jc = nattn_min(j, tile.len[a] - 1);
      const AxisRange inv = key_inverse(jc, tile.len[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
      lo[r][a] = inv.start;
      hi[r][a] = inv.start + inv.count - 1;
      row_rpb[r] += (p.kernel[a] - 1 + jc) * rpb_mult[a];
    }
  }
  int full_lo[3], full_hi[3];  // query boxes inside the inverse neighbourhood of every key
  unmasked_boxes<NA, B, true, false>(p, tile, 0, full_lo, full_hi);

  float acc[HD / 2];  // warpgroup 1: dV, 2: dK (64 keys x 256 channels)
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) acc[i] = 0.f;
  const bool has_rpb = p.rpb != nullptr;
  const unsigned char* k_tile = smem + S::kK;
  const unsigned char* v_tile = smem + S::kV;
  mbar_wait(kv_full, 0);

  BoxWalk<NA, B> walk(tile);  // step it: query head h_kv * groups + walk.pass
  for (int it = 0; it < steps; ++it, walk.next(tile)) {
    const int s = it % S::kStages, phase = (it / S::kStages) & 1;
    const int x = it % 2, x_phase = (it / 2) & 1;
    unsigned char* slot = smem + S::kX + x * Exchange::kBytes;
    const int hg = walk.pass, h = h_kv * p.groups + hg;
    const unsigned char* q_tile = smem + S::kQ + s * R::kBytes;
    const unsigned char* do_tile = smem + S::kDo + s * R::kBytes;
    const float* ld = reinterpret_cast<const float*>(smem + S::kLd) + s * 2 * kN;
    const int* origin = walk.origin;
    float st[kN / 2];
    uint32_t pa[kN / 16][4];
    mbar_wait(qd_full + s, phase);
    wgmma_fence();
    // S^T = K Q^T (warpgroup 1) or dP^T = V dO^T (warpgroup 2)
    const unsigned char* a_rows = role == 0 ? k_tile : v_tile;
    const unsigned char* b_rows = role == 0 ? q_tile : do_tile;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_ss<T, kN>(st, R::k_major(a_rows, 0, kk), R::k_major(b_rows, 0, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(st);
    mbar_wait(ld_full + s, phase);
    if (role == 0) {  // P^T, masked; padding key rows need no mask (never stored)
      bool full = true;
#pragma unroll
      for (int a = 0; a < NA; ++a)
        full = full && origin[a] >= full_lo[a] && origin[a] + B::extent(a) - 1 <= full_hi[a];
      auto lse_of = [&](int i) { return ld[8 * (i / 4) + 2 * t4 + i % 2]; };
      if (full && !has_rpb) {
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) st[i] = fast_exp2(fmaf(st[i], p.scale_log2, -lse_of(i)));
      } else if (!has_rpb) {
        const RowPairMask<NA, B> mask(lo[0], hi[0], lo[1], hi[1], origin, t4);
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) st[i] = mask.in(i) ? fast_exp2(fmaf(st[i], p.scale_log2, -lse_of(i))) : 0.f;
      } else {  // the general test (padding key rows excluded: they would reach dRPB)
        const float* rpb = p.rpb + int64_t(h) * p.rpb_head_size;
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) {
          const int r = (i / 2) % 2;
          const int col = 8 * (i / 4) + 2 * t4 + (i % 2);
          bool in = row_ok[r];
          int ridx = row_rpb[r];
#pragma unroll
          for (int a = 0; a < NA; ++a) {
            const int q = origin[a] + B::offset(col, a);
            in = in && q >= lo[r][a] && q <= hi[r][a];
            ridx -= q * rpb_mult[a];
          }
          const float xs = st[i] * p.scale_log2 + (in ? __ldg(rpb + ridx) * kLog2e : 0.f);
          st[i] = in ? fast_exp2(xs - lse_of(i)) : 0.f;
        }
      }
#pragma unroll
      for (int i = 0; i < kN / 2; i += 2) pa[i / 8][(i % 8) / 2] = pack2<T>(st[i], st[i + 1]);
      Exchange::put(slot, tid, pa);
      mbar_arrive(p_full + x);
    } else {  // dS^T = P^T (dP^T - delta)
      mbar_wait(p_full + x, x_phase);
      Exchange::get(slot, tid, pa);
#pragma unroll
      for (int i = 0; i < kN / 2; i += 2) {
        const float2 pr = unpack2<T>(pa[i / 8][(i % 8) / 2]);
        const float2 dl = *reinterpret_cast<const float2*>(ld + kN + 8 * (i / 4) + 2 * t4);
        pa[i / 8][(i % 8) / 2] = pack2<T>(pr.x * (st[i] - dl.x), pr.y * (st[i + 1] - dl.y));
      }
    }
    mbar_arrive(ld_empty + s);  // this thread's reads of the LSE / delta rows are done
    // dV += P^T dO (warpgroup 1) or dK += dS^T Q (warpgroup 2)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) wgmma_rs<T, HD>(acc, pa[kk], R::mn_major(role == 0 ? do_tile : q_tile, kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(acc);
    fence_regs(pa);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + s);  // this warp's reads of the stage are done
    if (role == 1 && has_rpb) add_drpb<T, NA, B>(p, pa, row_rpb[0], row_rpb[1], origin, rpb_mult, t4, hg, h, fixed, false, drpb_smem);
  }

  // dV through the K rows (read only by warpgroup 1) and dK * scale through the V rows (read
  // only by warpgroup 2), then whole-row stores.
  unsigned char* stage = smem + (role == 0 ? S::kK : S::kV);
  const float mult = role == 0 ? 1.f : p.scale;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int kr = wr + g4 + 8 * ((i / 2) % 2);
    const int col = 8 * (i / 4) + 2 * t4;
    *reinterpret_cast<uint32_t*>(stage + R::offset(kr, col)) = pack2<T>(acc[i] * mult, acc[i + 1] * mult);
  }
  named_sync(1 + role, 128);
  T* out = role == 0 ? head_base<T>(p.dv, p.dv_s, b, h_kv) : head_base<T>(p.dk, p.dk_s, b, h_kv);
  const int64_t* out_s = role == 0 ? p.dv_s : p.dk_s;
  constexpr int kChunks = HD / 8;
  for (int idx = tid; idx < kN * kChunks; idx += 128) {
    const int kr = idx / kChunks, ch = (idx % kChunks) * 8;
    int64_t off;
    if (box_row_offset<NA, B>(p, tile, tile.q0, kr, out_s, off))
      *reinterpret_cast<uint4*>(out + off + ch) = *reinterpret_cast<const uint4*>(stage + R::offset(kr, ch));
  }
  if (fixed) {  // the consumers' staged dRPB into the int64 table (producers have left)
    named_sync(5, 256);
    drpb_fixed_add(p, h_kv, reinterpret_cast<const int*>(drpb_smem), rpb_len, threadIdx.x - 128, 256);
  }
#endif
}

}  }  // namespace nattn::sm90
