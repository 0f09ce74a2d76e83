// Hopper (sm_90a) NA backward for the square pair, dQ pass: the square forward's CTA and walk
// (forward_squares.cuh, square_geometry.cuh) with the dQ pass's products.
//
// Thread 0 loads the 8 x 8 query box's Q rows and the 20 x 20 union of its windows' keys and
// values in the forward's five parts of four key rows (an mbarrier each); once every warp
// holds its 4 x 4 square's Q fragments, the box's dO rows replace Q's in the query tile (a
// tile of their own would leave one CTA an SM at head dim 64, and dO's m16 fragments read
// by the lanes from global memory took a quarter of the pass waiting on half-used sectors:
// PERF.md sixty-fourth session), and the last parts follow them. Each warp holds its
// square's Q and dO as m16 A fragments and walks the square's key rows in half-chunks of two
// key rows (32 keys, four n8 tiles):
//   S = Q K^T, dP = dO V^T      (mma.sync m16n8k16; K and V read alike with ldmatrix)
//   P = exp2(S scale log2e + bias - LSE log2e) where the key is in the row's window, else 0
//   dS = P (dP - delta)         (delta = rowsum(dO O) - dLSE of the square's rows from the
//                                dO tile and O's rows, read in 16-byte pieces; written for
//                                the dK/dV pass that runs next: square_row_delta)
//   dQ += dS K                  (dS from the score fragments; K read transposed, as the
//                                forward reads V)
// A half-chunk no lane of the warp keeps (the last rows of a window of 9 to 12 rows) is
// skipped. At the end dQ * scale goes through the warp's rows of the query tile and out in one
// bulk tensor store of the box (dQ's map) or per-lane stores. With an RPB the pass records
// each query head's largest |dS| for the fixed-point dRPB of the dK/dV pass.
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/drpb_fixed.cuh"
#include "nattn/common/softmax.cuh"
#include "nattn/sm90/backward_delta.cuh"
#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/forward_squares.cuh"
#include "nattn/tc/mma.cuh"

namespace nattn { namespace sm90 {

// delta = rowsum(dO O) - dLSE of a lane's two rows (box rows row0 and row0 +
// kSquareLaneRowStep): channels 8 t4 + 32 j .. + 7 of dO from the query tile and of O from o
// (the lane's 16-byte pieces of the rows, zero past the grid); the quad's four lanes sum a
// row. Lane t4 = 0 writes the rows' delta (Params::delta) for the dK/dV pass, which reads
// every query's.
template <typename T, int HD, class R>
__device__ __forceinline__ void square_row_delta(const Params& p, const unsigned char* tile_do, int row0, int t4,
                                                 const uint4 (&o)[2][HD / 32], const bool (&ok)[2],
                                                 const int64_t (&row)[2], float (&delta)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < HD / 32; ++j)
      acc += piece_dot<T>(
          o[r][j], *reinterpret_cast<const uint4*>(tile_do + R::offset(row0 + kSquareLaneRowStep * r, 8 * t4 + 32 * j)));
    const float sum = quad_sum(acc);  // (every lane: a shuffle)
    delta[r] = ok[r] ? row_delta(p, row[r], sum) : 0.f;
    if (ok[r] && t4 == 0) p.delta[row[r]] = delta[r];
  }
}

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(SquareCta<Tl, HD>::kThreads, SquareSmem<Tl, HD, kSquareDqRing<HD>>::kMinBlocks)
    backward_dq_squares_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                               const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                               const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_dq) {
#if NATTN_SM90_ENABLED
  static_assert(NA == 2, "the square pair is 2-D");
  using QB = typename Tl::Q;
  using Cta = SquareCta<Tl, HD>;
  constexpr bool kRing = kSquareDqRing<HD>;
  using S = SquareSmem<Tl, HD, kRing>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  constexpr int kKeyRowBytes = kSquareKeyBox * kRowBytes;
  constexpr int kHalf = 4;  // n8 score tiles of a half-chunk: two key rows of 16 columns
  unsigned char* smem = aligned_smem();
  uint64_t* rows_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* parts_full = rows_full + 1;
  uint64_t* grad_full = parts_full + kSquareParts;

  CtaTile tile;
  if (!cta_tile<NA, QB, typename Tl::K>(p, blockIdx.x, tile)) return;  // uniform
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = kv_head(p, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(rows_full, 1);
    for (int i = 0; i < kSquareParts; ++i) mbar_init(parts_full + i, 1);
    mbar_init(grad_full, 1);
#if NATTN_SM90_SQUARE_DQ_RING  // (the ring's code under #if: switched off, the whole-box kernel's SASS is the one measured before it)
    if constexpr (kRing)
      for (int i = 0; i < kSquareRingParts; ++i) reinterpret_cast<int*>(smem + S::kCounts)[i] = 0;
    square_keep_tile<kRing, S>(tile, smem);  // (forward_squares.cuh)
#endif
    fence_barrier_init();
  }
  __syncthreads();
  griddep_launch_dependents();  // (NATTN_SM90_PDL: the dK/dV pass may start its CTAs)
#if NATTN_SM90_SQUARE_DQ_EARLY_DO
  // (early dO: the ring's last K slot holds dO's rows until its part comes)
  constexpr bool kEarlyDo = kRing;
  constexpr int kDoAt = kEarlyDo ? S::kK + kSquareEarlyParts * S::Part::kBytes : S::kQ;
  static_assert(kDoAt % 1024 == 0, "the dO tile's swizzle starts at a 1024-byte period");
  static_assert(!kEarlyDo || R::kBytes <= S::Part::kBytes, "dO's rows fit the K slot they borrow");
  // Q's rows (and dO's) and the first parts (forward_squares.cuh; as a lambda, the form whose
  // SASS ran the GPU tests)
  auto first_loads = [&] {
    load_square_rows<NA, HD, Tl>(p, tile, kRowsQ, h, b, smem, &map_q, rows_full);
    if constexpr (kEarlyDo) load_square_rows<NA, HD, Tl>(p, tile, kRowsGradOut, h, b, smem, &map_do, grad_full, kDoAt);
    load_square_parts<NA, HD, Tl, kRing>(p, tile, h_kv, b, smem, &map_k, &map_v, 0, kSquareEarlyParts);
  };
  if (threadIdx.x == 0) first_loads();
#else
  constexpr int kDoAt = S::kQ;
  if (threadIdx.x == 0) {  // Q's rows and the first parts (forward_squares.cuh)
    load_square_rows<NA, HD, Tl>(p, tile, kRowsQ, h, b, smem, &map_q, rows_full);
    load_square_parts<NA, HD, Tl, kRing>(p, tile, h_kv, b, smem, &map_k, &map_v, 0, kSquareEarlyParts);
  }
#endif
  const bool has_rpb = p.rpb != nullptr;
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + Cta::kRpbGuard;
  stage_strip_rpb<Cta>(p, h, bias);

  SquareLane sq;
  square_lane<QB>(p, tile, warp, lane, sq);
  const int chunks = sq.chunks, row_mult = sq.row_mult;
  const int row0 = square_query_row(warp, g4);  // (the lane's second row: kSquareLaneRowStep on)
  // The rows' LSE (+inf for a row past the grid: no probability) and O's pieces for delta:
  // their loads are in flight while the tiles arrive.
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

  // ldmatrix addresses (forward_squares.cuh): the square's first key plus a tile's first key
  // plus the lane's offset for the tile's walk-row parity; K and V as the B operand of S and
  // dP, K transposed as dQ's.
#if NATTN_SM90_SQUARE_DQ_RING
  // (ring: key row r of the union at slot row square_ring_row(r), with its swizzle phase)
  const unsigned char* keys_at = smem + S::kK + ((kRing ? 0 : sq.sy * kSquareKeyBox) + sq.sx) * kRowBytes;
  auto row_at = [&](int walk_row) {  // walk row `walk_row`'s keys
    if constexpr (kRing)
      return keys_at + square_ring_row(sq.sy + walk_row) * kKeyRowBytes;
    else
      return keys_at + walk_row * kKeyRowBytes;
  };
#else
  const unsigned char* keys_at = smem + S::kK + (sq.sy * kSquareKeyBox + sq.sx) * kRowBytes;
#endif
  int k_off[2][HD / 32], kt_off[2][HD / 16];
  square_fragment_offsets<C, HD>(sq.sy, sq.sx, lane, 0, k_off, kt_off);

  uint32_t qa[HD / 16][4], da[HD / 16][4];
  mbar_wait(rows_full, 0);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    tc::ldmatrix_x4(qa[kk], smem + S::kQ + R::offset(square_query_row(warp, lane % 16), 16 * kk + 8 * (lane / 16)));
#if NATTN_SM90_SQUARE_DQ_EARLY_DO
  // The rest of the parts once the tile they go to is read (ring: up to the ring's size; the
  // warps' releases copy the rest).
  auto load_late_parts = [&] {
    __syncthreads();
    if (threadIdx.x == 0) {
      fence_proxy_async_smem();  // (the tile's reads before the copy engine's writes)
      if constexpr (!kEarlyDo) load_square_rows<NA, HD, Tl>(p, tile, kRowsGradOut, h, b, smem, &map_do, grad_full);
      load_square_parts<NA, HD, Tl, kRing>(p, tile, h_kv, b, smem, &map_k, &map_v, kSquareEarlyParts,
                                           kRing ? kSquareRingParts : kSquareParts);
    }
  };
  if constexpr (!kEarlyDo) load_late_parts();  // every warp's Q fragments are read: dO's rows replace them
#else
  __syncthreads();  // every warp's Q fragments are read: dO's rows replace them
  if (threadIdx.x == 0) {
    fence_proxy_async_smem();  // (the tile's reads before the copy engine's writes)
    load_square_rows<NA, HD, Tl>(p, tile, kRowsGradOut, h, b, smem, &map_do, grad_full);
    // (ring: the parts up to the ring's size; the warps' releases copy the rest)
    load_square_parts<NA, HD, Tl, kRing>(p, tile, h_kv, b, smem, &map_k, &map_v, kSquareEarlyParts,
                                         kRing ? kSquareRingParts : kSquareParts);
  }
#endif
  mbar_wait(grad_full, 0);
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    tc::ldmatrix_x4(da[kk], smem + kDoAt + R::offset(square_query_row(warp, lane % 16), 16 * kk + 8 * (lane / 16)));
  float dlt[2];
  square_row_delta<T, HD, R>(p, smem + kDoAt, row0, t4, o_rows, sq.row_ok, row, dlt);
#if NATTN_SM90_SQUARE_DQ_EARLY_DO
  if constexpr (kEarlyDo) load_late_parts();  // every warp's dO fragments and delta are read: part 2 replaces them
#endif
#pragma unroll
  for (int r = 0; r < 2; ++r) lse2[r] = lse_log2(lse2[r]);

  float dq[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[n][e] = 0.f;
  unsigned ds_max = 0;  // with RPB: the lane's largest |dS|, as float bits

  // Half-chunk `half` of chunk ch: walk rows 4 ch + 2 half and the next; score tile jj is
  // the chunk's tile j = kHalf half + jj (walk row j / 2, columns 8 (j % 2) ..).
  auto half_chunk = [&](auto rpb_tag, int ch, int half, const uint32_t (&w)[2], const int (&bias_at)[2]) {
    constexpr bool kRpb = decltype(rpb_tag)::value;
#if !NATTN_SM90_SQUARE_DQ_RING
    const unsigned char* half_at = keys_at + (kStripChunkRows * ch + 2 * half) * kKeyRowBytes;
#endif
    float sc[kHalf][4], dp[kHalf][4];
#pragma unroll
    for (int jj = 0; jj < kHalf; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[jj][e] = dp[jj][e] = 0.f;
#if NATTN_SM90_SQUARE_DQ_RING
      const unsigned char* at = row_at(kStripChunkRows * ch + 2 * half + jj / 2) + 8 * (jj % 2) * kRowBytes;
#else
      const unsigned char* at = half_at + (jj / 2) * kKeyRowBytes + 8 * (jj % 2) * kRowBytes;
#endif
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
#if NATTN_SM90_SQUARE_DQ_RING
      const unsigned char* at = row_at(kStripChunkRows * ch + 2 * half + i);
#else
      const unsigned char* at = half_at + i * kKeyRowBytes;
#endif
#pragma unroll
      for (int x = 0; x < HD / 16; ++x) {
        uint32_t kb[4];
        tc::ldmatrix_x4_trans(kb, at + kt_off[i][x]);
        M::run(dq[2 * x], pa, kb);
        M::run(dq[2 * x + 1], pa, kb + 2);
      }
    }
  };
#if NATTN_SM90_SQUARE_DQ_RING
  SquareRing<NA, HD, Tl> ring;  // (forward_squares.cuh)
  auto release_after = [&](int ch) {  // (ch = -1: before the walk)
    if constexpr (kRing)
      ring.release_after(ch, chunks, sq.sy, lane, smem, parts_full, p, square_late_tile<kRing, S>(tile, smem), h_kv, b,
                         &map_k, &map_v);
  };
#endif
  instanced(has_rpb, [&](auto rpb_tag) {
#if NATTN_SM90_SQUARE_DQ_RING
    release_after(-1);
#endif
    for (int ch = 0; ch < chunks; ++ch) {
      mbar_wait(parts_full + square_first_part(sq.sy, ch), 0);  // (ring: each part has its own barrier too)
      mbar_wait(parts_full + square_last_part(sq.sy, ch), 0);
      const uint32_t w[2] = {square_chunk_word(sq.word[0], ch), square_chunk_word(sq.word[1], ch)};
      const int bias_at[2] = {sq.bias_at[0] + strip_chunk_bias(row_mult, ch), sq.bias_at[1] + strip_chunk_bias(row_mult, ch)};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        constexpr uint32_t kHalfBits = (1u << (2 * kHalf)) - 1u;  // bits 2 j + e of the half's tiles
        if (!__any_sync(0xffffffffu, ((w[0] | w[1]) >> (2 * kHalf * half)) & kHalfBits)) continue;
        half_chunk(rpb_tag, ch, half, w, bias_at);
      }
#if NATTN_SM90_SQUARE_DQ_RING
      release_after(ch);
#endif
    }
  });
#if NATTN_SM90_SQUARE_DQ_RING
  if constexpr (kRing) SquareRing<NA, HD, Tl>::drain(parts_full);
#endif

  if (p.drpb_max) {  // every lane gets here
    ds_max = __reduce_max_sync(0xffffffffu, ds_max);
    if (lane == 0) atomicMax(p.drpb_max + h, ds_max);
  }
  // dQ * scale into the warp's own rows of the query tile (only this warp read them), then the
  // box's rows out through dQ's map (Params::out_map) or per lane (forward.cuh's epilogue).
  const float scale[2] = {p.scale, p.scale};
  unsigned char* stage = smem + S::kQ;
  __syncwarp();  // every lane's Q fragments are read
  stage_output<T, HD, R, kSquareLaneRowStep>(stage, &dq[0][0], scale, row0, t4);
#if NATTN_SM90_SQUARE_DQ_RING
  const CtaTile& late = square_late_tile<kRing, S>(tile, smem);
#else
  const CtaTile& late = tile;
#endif
  store_output_rows<T, NA, HD, QB, R, true>(p, late, &map_dq, stage, 0, QB::extent(0), h, b,
                                            RowsOut{p.dq, p.dq_s, p.heads, kRowsGradQ});
#endif
}

}  }  // namespace nattn::sm90
