// Hopper (sm_90a) NA backward for the strip pairs, dQ pass: the strip forward's CTA and walk
// (forward_strips.cuh, strip_geometry.cuh) with the dQ pass's products.
//
// Thread 0 loads the query box's Q and dO rows and the window union's keys and values (2-D at
// once, 3-D a frame a ring slot, refilled by the last warp done with it, as the forward); each
// warp walks its strip's key rows in the forward's chunks, two key rows (32 keys, four n8
// tiles) at a time:
//   S = Q K^T, dP = dO V^T      (mma.sync m16n8k16; K and V read alike with ldmatrix)
//   P = exp2(S scale log2e + bias - LSE log2e) where the key is in the row's window, else 0
//   dS = P (dP - delta)         (delta = rowsum(dO O) - dLSE of the CTA's own rows, from its
//                                dO fragments and O read from global memory: strip_row_delta;
//                                the pass writes it for the dK/dV pass that runs next)
//   dQ += dS K                  (dS from the score fragments; K read transposed, as the
//                                forward reads V)
// Half-chunks that no lane of the warp keeps (a strip whose windows span 5 or 6 key rows)
// are skipped. At the end dQ * scale goes through the warp's rows of the query tile and out
// in one bulk tensor store of the box (dQ's map) or per-lane stores. With an RPB the pass
// records each query head's largest |dS| for the fixed-point dRPB of the dK/dV pass, which is
// the tensor-core family's (tc/backward_dkv.cuh; sm90/kernels.cuh, launch_backward_strips).
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/sm90/backward_delta.cuh"
#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/forward_strips.cuh"
#include "nattn/tc/mma.cuh"

namespace nattn { namespace sm90 {

// CTAs per SM the dQ pass is compiled for (its register cap): head dim 32 four (128
// registers; shared memory 36 KB in 2-D, 48 KB in 3-D), 64 three in 2-D (168; 72 KB) and two
// in 3-D (96 KB: Q, dO and two frames of keys and values; three with one frame a slot:
// NATTN_SM90_STRIP_STAGES_3D, forward_strips.cuh).
template <int NA, int HD, int STAGES>
constexpr int strip_dq_min_blocks() {
  return HD <= 32 ? 4 : NA == 3 && STAGES > 1 ? 2 : 3;
}

// O's elements of a lane's dO fragments (query box rows qr and qr + 8; the m16k16 A layout:
// o[kk][e] holds row e % 2, channels 16 kk + 8 (e / 2) + 2 t4 and the next), zero for a row
// past the grid. Issued before the wait for the CTA's rows, so their latency overlaps it.
template <typename T, int NA, int HD, class QB>
__device__ __forceinline__ void load_out_fragments(const Params& p, const CtaTile& tile, int qr, int t4, int b, int h,
                                                   uint32_t (&o)[HD / 16][4]) {
  const T* base = head_base<const T>(p.out, p.out_s, b, h) + 2 * t4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int64_t off;
    const bool ok = box_row_offset<NA, QB>(p, tile, tile.q0, qr + 8 * r, p.out_s, off);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        o[kk][r + 2 * c] = ok ? __ldg(reinterpret_cast<const unsigned*>(base + off + 16 * kk + 8 * c)) : 0u;
  }
}

// delta = rowsum(dO O) - dLSE of a lane's two rows from its dO and O fragments (the quad's
// four lanes hold a row's channels between them). The pass owns its rows: lane t4 = 0 writes
// their delta (Params::delta) for the dK/dV pass, which reads every query's.
template <typename T, int HD>
__device__ __forceinline__ void strip_row_delta(const Params& p, const uint32_t (&d)[HD / 16][4],
                                                const uint32_t (&o)[HD / 16][4], const bool (&ok)[2],
                                                const int64_t (&row)[2], int t4, float (&delta)[2]) {
  float acc[2] = {0.f, 0.f};
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e % 2] += pair_dot<T>(o[kk][e], d[kk][e]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(acc[r]);  // (every lane: a shuffle)
    delta[r] = ok[r] ? row_delta(p, row[r], sum) : 0.f;
    if (ok[r] && t4 == 0) p.delta[row[r]] = delta[r];
  }
}

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(StripCta<Tl, HD>::kThreads, strip_dq_min_blocks<NA, HD, StripCta<Tl, HD>::kStages>())
    backward_dq_strips_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                              const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                              const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_dq) {
#if NATTN_SM90_ENABLED
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  using Cta = StripCta<Tl, HD>;
  static_assert(Cta::kNa == NA, "a strip pair's NA dim");
  using S = StripSmem<Tl, HD, 2>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  constexpr int kStages = Cta::kStages;
  constexpr int kHalf = kStripChunkRows;  // score tiles (n8) of a half-chunk: two key rows
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* rows_full = bars;
  uint64_t* full = bars + 1;
  int* done = reinterpret_cast<int*>(smem + S::kDone);

  CtaTile tile;
  if (!cta_tile<NA, QB, KB>(p, blockIdx.x, tile)) return;  // uniform
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = kv_head(p, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;
  const int slabs = strip_slabs<NA, QB>(p, tile);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(rows_full, 1);
    for (int s = 0; s < kStages; ++s) mbar_init(full + s, 1);
    strip_walk_init<Cta>(done);
    fence_barrier_init();
  }
  __syncthreads();
  griddep_launch_dependents();  // (NATTN_SM90_PDL: the dK/dV pass may start its CTAs)
  auto load_slab = [&](int f) {
    load_strip_slab<NA, HD, Tl, C>(p, tile, f, h_kv, b, smem + S::kK, full, &map_k, &map_v);
  };
  if (threadIdx.x == 0) {  // the query box's Q and dO rows, then the first slabs
    int c[5];
    mbar_expect_tx(rows_full, 2 * R::kBytes);
    load_box_blocks<NA, QB, R>(p, tile, tile.q0, head_coords<HD>(p, kRowsQ, p.heads, h, b), smem + S::kQ, &map_q,
                               rows_full, c);
    load_box_blocks<NA, QB, R>(p, tile, tile.q0, head_coords<HD>(p, kRowsGradOut, p.heads, h, b), smem + S::kDo,
                               &map_do, rows_full, c);
    for (int f = 0; f < kStages && f < slabs; ++f) load_slab(f);
  }
  const bool has_rpb = p.rpb != nullptr;
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + Cta::kRpbGuard;
  stage_strip_rpb<Cta>(p, h, bias);

  StripLane lane_strip;
  strip_lane<NA, QB>(p, tile, warp, lane, lane_strip);
  const int chunks = lane_strip.chunks, row_mult = lane_strip.row_mult;
  // The rows' LSE (+inf for a row past the grid: no probability), in log2 units after the
  // wait for the rows, which hides the loads' latency (4% of video-3d's pass where it did not).
  float lse2[2];
  int64_t row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool ok = lane_strip.row_ok[r];
    row[r] = ok ? lse_row<NA, QB>(p, tile, 16 * warp + g4 + 8 * r, b, h) : 0;
    lse2[r] = ok ? __ldg(p.lse + row[r]) : INFINITY;
  }
  uint32_t oa[HD / 16][4];
  load_out_fragments<T, NA, HD, QB>(p, tile, 16 * warp + g4, t4, b, h, oa);

  // ldmatrix row addresses (forward_strips.cuh): K and V as the B operand of S and dP (n8
  // tiles: eight tile rows, 32 channels an x4), K transposed as dQ's (sixteen rows, 16
  // channels an x4), the warp's sixteen rows of Q and dO.
  const int strip_at = S::kK + strip_tile_row(lane_strip.sy, 0, 0) * kRowBytes;
  int k_lane[HD / 32], kt_lane[HD / 16];
#pragma unroll
  for (int x = 0; x < HD / 32; ++x) k_lane[x] = C::offset(lane % 8, 8 * (lane / 8) + 32 * x);
#pragma unroll
  for (int x = 0; x < HD / 16; ++x) kt_lane[x] = C::offset(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16) + 16 * x);
  // A narrow walk's dS K step reads its second eight keys 16 box rows on (8 more than kt_lane).
  const int kt_pair_shift = ((lane / 8) % 2) * 8 * kRowBytes;

  uint32_t qa[HD / 16][4], da[HD / 16][4];
  mbar_wait(rows_full, 0);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    tc::ldmatrix_x4(qa[kk], smem + S::kQ + R::offset(16 * warp + lane % 16, 16 * kk + 8 * (lane / 16)));
    tc::ldmatrix_x4(da[kk], smem + S::kDo + R::offset(16 * warp + lane % 16, 16 * kk + 8 * (lane / 16)));
  }
  float dlt[2];
  strip_row_delta<T, HD>(p, da, oa, lane_strip.row_ok, row, t4, dlt);
#pragma unroll
  for (int r = 0; r < 2; ++r) lse2[r] = lse_log2(lse2[r]);

  float dq[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[n][e] = 0.f;
  unsigned ds_max = 0;  // with RPB: the lane's largest |dS|, as float bits

  // Chunk ch of the strip's walk over the slot at `slot_at` (the strip's first row), frame part
  // `frame_bias` of the RPB index: two half-chunks of two key rows each. kStep 2: the narrow
  // walk (strip_geometry.cuh, forward_strips.cuh): one chunk whose tile j is the wide
  // numbering's 2 j, so a half-chunk is four key rows of 8 columns.
  auto chunk = [&](auto rpb_tag, auto step_tag, const unsigned char* slot_at, int ch, int frame_bias) {
    constexpr bool kRpb = decltype(rpb_tag)::value;
    constexpr int kStep = decltype(step_tag)::value;
    const uint32_t w[2] = {strip_chunk_word(lane_strip.word[0], ch), strip_chunk_word(lane_strip.word[1], ch)};
    const int bias_at[2] = {lane_strip.bias_at[0] + frame_bias + strip_chunk_bias(row_mult, ch),
                            lane_strip.bias_at[1] + frame_bias + strip_chunk_bias(row_mult, ch)};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // score tiles j = kHalf half .. + kHalf - 1 of the chunk: mask bits 2 kStep j + e % 2
      constexpr uint32_t kHalfBits = kStep == 2 ? 0xffffu : (1u << (2 * kHalf)) - 1u;
      if (!__any_sync(0xffffffffu, ((w[0] | w[1]) >> (2 * kStep * kHalf * half)) & kHalfBits)) continue;
      float sc[kHalf][4], dp[kHalf][4];
#pragma unroll
      for (int jj = 0; jj < kHalf; ++jj) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[jj][e] = dp[jj][e] = 0.f;
        const unsigned char* at = slot_at + strip_tile_row(0, ch, kStep * (kHalf * half + jj)) * kRowBytes;
#pragma unroll
        for (int x = 0; x < HD / 32; ++x) {
          uint32_t kb[4], vb[4];
          tc::ldmatrix_x4(kb, at + k_lane[x]);
          M::run(sc[jj], qa[2 * x], kb);
          M::run(sc[jj], qa[2 * x + 1], kb + 2);
          tc::ldmatrix_x4(vb, at + C::kBytes + k_lane[x]);
          M::run(dp[jj], da[2 * x], vb);
          M::run(dp[jj], da[2 * x + 1], vb + 2);
        }
      }
#pragma unroll
      for (int jj = 0; jj < kHalf; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, j = kStep * (kHalf * half + jj);
          float x = sc[jj][e] * p.scale_log2;
          if constexpr (kRpb)  // (the guards keep a masked key's index inside shared memory)
            x += bias[bias_at[r] + strip_bias_offset(row_mult, j, e)];
          const float ds = kept(strip_kept(w[r], j, e), fast_exp2(x - lse2[r]) * (dp[jj][e] - dlt[r]));
          if constexpr (kRpb) ds_max = drpb_abs_max(ds_max, ds);
          sc[jj][e] = ds;
        }
#pragma unroll
      for (int i = 0; i < kHalf / 2; ++i) {  // tiles 2 i and 2 i + 1 of the half: a k16 step of dS K
        const uint32_t pa[4] = {M::pack(sc[2 * i][0], sc[2 * i][1]), M::pack(sc[2 * i][2], sc[2 * i][3]),
                                M::pack(sc[2 * i + 1][0], sc[2 * i + 1][1]),
                                M::pack(sc[2 * i + 1][2], sc[2 * i + 1][3])};
        // (narrow: the second tile's keys are the next key row's, 16 box rows on)
        const unsigned char* at =
            slot_at + strip_tile_row(0, ch, kStep * (kHalf * half + 2 * i)) * kRowBytes + (kStep - 1) * kt_pair_shift;
#pragma unroll
        for (int x = 0; x < HD / 16; ++x) {
          uint32_t kb[4];
          tc::ldmatrix_x4_trans(kb, at + kt_lane[x]);
          M::run(dq[2 * x], pa, kb);
          M::run(dq[2 * x + 1], pa, kb + 2);
        }
      }
    }
  };
  auto walk = [&](auto rpb_tag, auto step_tag) {
    const int steps = decltype(step_tag)::value == 2 ? 1 : chunks;
    strip_walk_slabs<Cta>(
        slabs, lane_strip, full, done,
        [&](int slot, int fi) {
          for (int ch = 0; ch < steps; ++ch)
            chunk(rpb_tag, step_tag, smem + strip_at + slot * S::kSlot, ch, fi * lane_strip.frame_mult);
        },
        load_slab);
  };
  strip_walk_instances(has_rpb, lane_strip, walk);

  if (p.drpb_max) {  // every lane gets here
    ds_max = __reduce_max_sync(0xffffffffu, ds_max);
    if (lane == 0) atomicMax(p.drpb_max + h, ds_max);
  }
  // dQ * scale into the warp's own rows of the query tile (only this warp read them), then the
  // box's rows out through dQ's map (Params::out_map) or per lane (forward.cuh's epilogue).
  const float scale[2] = {p.scale, p.scale};
  unsigned char* stage = smem + S::kQ;
  __syncwarp();  // every lane's Q fragments are read
  stage_output<T, HD, R>(stage, &dq[0][0], scale, 16 * warp + g4, t4);  // (dq[n][e]: the m16n8 layout)
  store_output_rows<T, NA, HD, QB, R, true>(p, tile, &map_dq, stage, 0, QB::extent(0), h, b,
                                            RowsOut{p.dq, p.dq_s, p.heads, kRowsGradQ});
#endif
}

}  }  // namespace nattn::sm90
