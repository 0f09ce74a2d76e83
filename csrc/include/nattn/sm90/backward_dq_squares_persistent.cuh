// Hopper (sm_90a) square dQ pass, persistent form (build switch NATTN_SM90_SQUARE_DQ_PERSIST,
// off by default; head dim 64, the ring's tiles; an experiment, not yet GPU-run).
//
// Why: as the square forward's (forward_squares_persistent.cuh), the dQ pass's warps spend
// more than half their stall samples in setup and epilogue (ncu on mid-2d: 1190 instructions
// a warp once, 52% of the samples; PERF.md sixty-eighth session). Here a CTA walks a run of
// consecutive boxes of the flattened [batch, head, box] order and the copies of the next box
// run during the current one. The query tile holds, in turn:
//   Q(k)      until every warp holds its Q fragments; the last of them (a count) copies
//   dO(k)     into the tile (grad_full); once every warp holds its dO fragments and delta,
//             the last of them finds the next box and copies
//   Q(k + 1)  (rows_full; with no next box it arrives on the barrier: the run's end).
// Q, dO and the ring take what three CTAs an SM can have only this way: dO in a tile of its
// own passes it (77824 bytes at head dim 64 against 75776), and the rotating ring leaves no
// slot free for it (the whole-box kernel's early dO borrows the ring's last K slot).
// K / V parts form the forward's one sequence over the run (square_runs.cuh). dQ goes from the
// registers to global memory (store_square_row, scaled), delta to Params::delta as the
// whole-box kernel writes it, and with an RPB each warp's largest |dS| once a box.
// csrc/tests/sm90_square_runs_check.cu replays this protocol too (its dQ runs).
#pragma once
#include "nattn/sm90/backward_dq_squares.cuh"
#include "nattn/sm90/square_runs.cuh"

namespace nattn { namespace sm90 {

#ifndef NATTN_SM90_SQUARE_DQ_PERSIST
#define NATTN_SM90_SQUARE_DQ_PERSIST 0
#endif
template <int HD>
constexpr bool kSquareDqPersist = NATTN_SM90_SQUARE_DQ_PERSIST && kSquareDqRing<HD>;

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(SquareCta<Tl, HD>::kThreads, SquareRunSmem<Tl, HD, 1>::kMinBlocks)
    backward_dq_squares_run_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                                   const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                                   const __grid_constant__ CUtensorMap map_v) {
#if NATTN_SM90_ENABLED
  static_assert(NA == 2 && kSquareDqRing<HD>, "the persistent square dQ pass: 2-D, the ring's head dims");
  using QB = typename Tl::Q;
  using Cta = SquareCta<Tl, HD>;
  using S = SquareRunSmem<Tl, HD, 1>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  constexpr int kKeyRowBytes = kSquareKeyBox * kRowBytes;
  constexpr int kHalf = 4;  // n8 score tiles of a half-chunk: two key rows of 16 columns
  unsigned char* smem = aligned_smem();
  uint64_t* parts_full = reinterpret_cast<uint64_t*>(smem + S::kBars) + 1;
  uint64_t* grad_full = parts_full + kSquareParts;
  int* counts = reinterpret_cast<int*>(smem + S::kCounts);  // [0]: Q reads, the parts', dO reads
  const SquareRunBox* run = reinterpret_cast<const SquareRunBox*>(smem + S::kRun);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;
  // The run: boxes [begin, end) of the flattened order.
  const int per_cta = p.cta_run;
  const int begin = int(blockIdx.x) * per_cta;
  const int end = nattn_min(begin + per_cta, p.cta_tiles * p.heads * p.batch);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    square_run_init<NA, Tl, HD, 1>(p, smem, begin, end);
  }
  __syncthreads();
  griddep_launch_dependents();  // (NATTN_SM90_PDL: the dK/dV pass may start its CTAs)
  if (run[0].index < 0) return;  // uniform
  if (threadIdx.x == 0) square_run_first_loads<NA, Tl, HD, 1>(p, smem, &map_q, &map_k, &map_v);
  const bool has_rpb = p.rpb != nullptr;
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + Cta::kRpbGuard;
  int staged_h = -1;  // the head whose RPB table is staged

  int rot = 0;  // the ring slot of the box's part 0
  int k = 0;
  for (;; ++k) {
    const int phase = k & 1;
    const SquareRunBox* at = square_run_start<Tl, HD, 1>(p, smem, phase, bias, staged_h);
    if (at == nullptr) break;  // uniform: the run's end
    const SquareRunBox& box = *at;
    const CtaTile tile = box.tile;
    const int h = box.h, b = box.b;
    SquareLane sq;
    square_lane<QB>(p, tile, warp, lane, sq);
    const int chunks = sq.chunks, row_mult = sq.row_mult;
    const int row0 = square_query_row(warp, g4);  // (the lane's second row: kSquareLaneRowStep on)
    // The rows' LSE (+inf past the grid: no probability) and O's pieces for delta.
    float lse2[2];
    int64_t row[2];
    uint4 o_rows[2][HD / 32];
    const T* out = head_base<const T>(p.out, p.out_s, b, h) + 8 * t4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const bool ok = sq.row_ok[r];
      row[r] = ok ? lse_row<NA, QB>(p, tile, row0 + kSquareLaneRowStep * r, b, h) : 0;
      lse2[r] = ok ? __ldg(p.lse + row[r]) : INFINITY;
      int64_t off;
      const bool in = box_row_offset<NA, QB>(p, tile, tile.q0, row0 + kSquareLaneRowStep * r, p.out_s, off);
#pragma unroll
      for (int j = 0; j < HD / 32; ++j)
        o_rows[r][j] = in ? __ldg(reinterpret_cast<const uint4*>(out + off + 32 * j)) : make_uint4(0u, 0u, 0u, 0u);
    }
    const unsigned char* keys_at = smem + S::kK + sq.sx * kRowBytes;
    int k_off[2][HD / 32], kt_off[2][HD / 16];
    square_fragment_offsets<C, HD>(sq.sy, sq.sx, lane, 0, k_off, kt_off);

    uint32_t qa[HD / 16][4], da[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      tc::ldmatrix_x4(qa[kk], smem + S::kQ + R::offset(square_query_row(warp, lane % 16), 16 * kk + 8 * (lane / 16)));
    // Every warp holds its Q fragments: the box's dO rows replace them.
    square_run_count(counts, lane, [&] {
      fence_proxy_async_smem();  // (the query tile's reads before the copy engine's writes)
      load_square_rows<NA, HD, Tl>(p, tile, kRowsGradOut, h, b, smem, &map_do, grad_full);
    });
    mbar_wait(grad_full, phase);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      tc::ldmatrix_x4(da[kk], smem + S::kQ + R::offset(square_query_row(warp, lane % 16), 16 * kk + 8 * (lane / 16)));
    float dlt[2];
    square_row_delta<T, HD, R>(p, smem + S::kQ, row0, t4, o_rows, sq.row_ok, row, dlt);
    // Every warp holds its dO fragments and delta: the next box's Q rows replace them.
    square_run_count(counts + S::kGradCount, lane,
                     [&] { square_run_next<NA, Tl, HD, 1>(p, smem, box, phase, end, &map_q); });
    const SquareRunBox& next = run[phase ^ 1];  // (read by the copies of the next box's parts only)
#pragma unroll
    for (int r = 0; r < 2; ++r) lse2[r] = lse_log2(lse2[r]);

    float dq[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[n][e] = 0.f;
    unsigned ds_max = 0;  // with RPB: the lane's largest |dS|, as float bits
    const int ring_sy = sq.sy + kSquarePartRows * rot;  // (ring rows: square_run_ring_row)
    auto row_at = [&](int walk_row) { return keys_at + square_run_ring_row(ring_sy + walk_row) * kKeyRowBytes; };

    // Half-chunk `half` of chunk ch (backward_dq_squares.cuh's, with the run's ring rows).
    auto half_chunk = [&](auto rpb_tag, int ch, int half, const uint32_t (&w)[2], const int (&bias_at)[2]) {
      constexpr bool kRpb = decltype(rpb_tag)::value;
      float sc[kHalf][4], dp[kHalf][4];
#pragma unroll
      for (int jj = 0; jj < kHalf; ++jj) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[jj][e] = dp[jj][e] = 0.f;
        const unsigned char* at = row_at(kStripChunkRows * ch + 2 * half + jj / 2) + 8 * (jj % 2) * kRowBytes;
#pragma unroll
        for (int x = 0; x < HD / 32; ++x) {  // (the walk row's parity is jj / 2's: 4 ch + 2 half is even)
          uint32_t kb[4], vb[4];
          tc::ldmatrix_x4(kb, at + k_off[jj / 2][x]);
          M::run(sc[jj], qa[2 * x], kb);
          M::run(sc[jj], qa[2 * x + 1], kb + 2);
          tc::ldmatrix_x4(vb, at + C::kBytes + k_off[jj / 2][x]);
          M::run(dp[jj], da[2 * x], vb);
          M::run(dp[jj], da[2 * x + 1], vb + 2);
        }
      }
#pragma unroll
      for (int jj = 0; jj < kHalf; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, j = kHalf * half + jj;
          float x = sc[jj][e] * p.scale_log2;
          if constexpr (kRpb)  // (the guards keep a masked key's index inside shared memory)
            x += bias[bias_at[r] + strip_bias_offset(row_mult, j, e)];
          const float ds = kept(strip_kept(w[r], j, e), fast_exp2(x - lse2[r]) * (dp[jj][e] - dlt[r]));
          if constexpr (kRpb) ds_max = drpb_abs_max(ds_max, ds);
          sc[jj][e] = ds;
        }
#pragma unroll
      for (int i = 0; i < kHalf / 2; ++i) {  // tiles 2 i and 2 i + 1 (one key row): a k16 step of dS K
        const uint32_t pa[4] = {M::pack(sc[2 * i][0], sc[2 * i][1]), M::pack(sc[2 * i][2], sc[2 * i][3]),
                                M::pack(sc[2 * i + 1][0], sc[2 * i + 1][1]),
                                M::pack(sc[2 * i + 1][2], sc[2 * i + 1][3])};
        const unsigned char* at = row_at(kStripChunkRows * ch + 2 * half + i);
#pragma unroll
        for (int x = 0; x < HD / 16; ++x) {
          uint32_t kb[4];
          tc::ldmatrix_x4_trans(kb, at + kt_off[i][x]);
          M::run(dq[2 * x], pa, kb);
          M::run(dq[2 * x + 1], pa, kb + 2);
        }
      }
    };
    SquareRunRing<NA, HD, Tl, 1> ring;
    auto release_upto = [&](int upto) {
      ring.release_upto(upto, lane, smem, p, box, next, rot, phase, &map_k, &map_v);
    };
    instanced(has_rpb, [&](auto rpb_tag) {
      release_upto(square_first_part(sq.sy, 0));
      for (int ch = 0; ch < chunks; ++ch) {
        mbar_wait(parts_full + square_first_part(sq.sy, ch), phase);
        mbar_wait(parts_full + square_last_part(sq.sy, ch), phase);
        const uint32_t w[2] = {square_chunk_word(sq.word[0], ch), square_chunk_word(sq.word[1], ch)};
        const int bias_at[2] = {sq.bias_at[0] + strip_chunk_bias(row_mult, ch), sq.bias_at[1] + strip_chunk_bias(row_mult, ch)};
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          constexpr uint32_t kHalfBits = (1u << (2 * kHalf)) - 1u;  // bits 2 j + e of the half's tiles
          if (!__any_sync(0xffffffffu, ((w[0] | w[1]) >> (2 * kHalf * half)) & kHalfBits)) continue;
          half_chunk(rpb_tag, ch, half, w, bias_at);
        }
        release_upto(ch + 1 < chunks ? square_first_part(sq.sy, ch + 1) : kSquareParts);
      }
    });

    if (p.drpb_max) {  // every lane gets here
      ds_max = __reduce_max_sync(0xffffffffu, ds_max);
      if (lane == 0) atomicMax(p.drpb_max + h, ds_max);
    }
    // dQ * scale from the registers to dQ's rows (the query tile holds the next box's Q).
    T* dq_head = head_base<T>(p.dq, p.dq_s, b, h);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t off;
      const bool ok = box_row_offset<NA, QB>(p, tile, tile.q0, row0 + kSquareLaneRowStep * r, p.dq_s, off);
      store_square_row<T, HD>(dq_head + off, ok, dq, r, p.scale, t4);
    }
    rot = (rot + kSquareParts) % kSquareRingParts;
  }
  if (threadIdx.x == 0) square_run_drain<Tl, HD, 1>(smem, k);  // (the copies of the run's last box landed)
#endif
}

}  }  // namespace nattn::sm90
