// Hopper (sm_90a) square forward, persistent form (build switch NATTN_SM90_SQUARE_PERSIST, off
// by default; head dim 64, the ring kernel's tiles; an experiment, not yet GPU-run).
//
// Why: the square forward's warps spend about as long in their setup and epilogue as in their
// walk (ncu on mid-2d: 864 instructions a warp once, 47% of the stall samples, against 498 a
// chunk of four chunks; PERF.md sixty-eighth session): every CTA waits for its first copies
// and, with the bulk store, for the store's reads before it ends, while three CTAs an SM
// leave little to hide that behind. Here a CTA walks a run of query boxes (square_runs.cuh:
// the run and its copies): once every warp holds the box's Q fragments, the last of them
// copies the next box's Q rows into the query tile; the output goes from the registers, 16
// bytes a lane after a transpose in the quad.
#pragma once
#include "nattn/sm90/square_runs.cuh"

namespace nattn { namespace sm90 {

#ifndef NATTN_SM90_SQUARE_PERSIST
#define NATTN_SM90_SQUARE_PERSIST 0
#endif
template <int HD>
constexpr bool kSquarePersist = NATTN_SM90_SQUARE_PERSIST && kSquareForwardRing<HD>;

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(SquareCta<Tl, HD>::kThreads, SquareRunSmem<Tl, HD>::kMinBlocks)
    forward_squares_run_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                               const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v) {
#if NATTN_SM90_ENABLED
  static_assert(NA == 2 && kSquareForwardRing<HD>, "the persistent square forward: 2-D, the ring's head dims");
  using QB = typename Tl::Q;
  using Cta = SquareCta<Tl, HD>;
  using S = SquareRunSmem<Tl, HD>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  constexpr int kKeyRowBytes = kSquareKeyBox * kRowBytes;
  unsigned char* smem = aligned_smem();
  uint64_t* parts_full = reinterpret_cast<uint64_t*>(smem + S::kBars) + 1;
  int* counts = reinterpret_cast<int*>(smem + S::kCounts);  // [0]: Q reads, then the parts' (SquareRunRing)
  const SquareRunBox* run = reinterpret_cast<const SquareRunBox*>(smem + S::kRun);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g4 = lane / 4, t4 = lane % 4;
  // The run: boxes [begin, end) of the flattened order.
  const int per_cta = p.cta_run;
  const int begin = int(blockIdx.x) * per_cta;
  const int end = nattn_min(begin + per_cta, p.cta_tiles * p.heads * p.batch);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    square_run_init<NA, Tl, HD, 0>(p, smem, begin, end);
  }
  __syncthreads();
  if (run[0].index < 0) return;  // uniform
  if (threadIdx.x == 0) square_run_first_loads<NA, Tl, HD, 0>(p, smem, &map_q, &map_k, &map_v);
  const bool has_rpb = p.rpb != nullptr;
  float* bias = reinterpret_cast<float*>(smem + S::kBytes) + Cta::kRpbGuard;
  int staged_h = -1;  // the head whose RPB table is staged
  const bool fold = !has_rpb && p.scale_log2 > 0.f;
  const float mul = fold ? p.scale_log2 : 1.f;
  using Scores = float[2 * kStripChunkRows][4];

  int rot = 0;  // the ring slot of the box's part 0
  int k = 0;
  for (;; ++k) {
    const int phase = k & 1;
    const SquareRunBox* at = square_run_start<Tl, HD, 0>(p, smem, phase, bias, staged_h);
    if (at == nullptr) break;  // uniform: the run's end
    const SquareRunBox& box = *at;
    const CtaTile tile = box.tile;
    const int h = box.h, b = box.b;
    SquareLane sq;
    square_lane<QB>(p, tile, warp, lane, sq);
    const int chunks = sq.chunks, row_mult = sq.row_mult;
    const unsigned char* keys_at = smem + S::kK + sq.sx * kRowBytes;
    int k_off[2][HD / 32], v_off[2][HD / 16];
    square_fragment_offsets<C, HD>(sq.sy, sq.sx, lane, C::kBytes, k_off, v_off);
    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      tc::ldmatrix_x4(qa[kk], smem + S::kQ + R::offset(square_query_row(warp, lane % 16), 16 * kk + 8 * (lane / 16)));
    // The last warp to hold its Q fragments finds the next box and copies its Q rows.
    square_run_count(counts, lane, [&] { square_run_next<NA, Tl, HD, 0>(p, smem, box, phase, end, &map_q); });
    const SquareRunBox& next = run[phase ^ 1];  // (read by the copies of the next box's parts only)

    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int ring_sy = sq.sy + kSquarePartRows * rot;  // (ring rows: square_run_ring_row)
    // Walk row 4 ch + i's keys: from the chunk's first row where its rows stay below the
    // ring's end (kWrap false: immediate row offsets), else each row's slot (as the ring kernel).
    auto row_at = [&](auto wrap_tag, const unsigned char* chunk_at, int ch, int i) {
      if constexpr (decltype(wrap_tag)::value)
        return keys_at + square_run_ring_row(ring_sy + kStripChunkRows * ch + i) * kKeyRowBytes;
      else
        return chunk_at + i * kKeyRowBytes;
    };
    auto chunk_at_of = [&](int ch) { return keys_at + square_run_ring_row(ring_sy + kStripChunkRows * ch) * kKeyRowBytes; };
    auto scores = [&](auto wrap_tag, int ch, Scores& sc) {
      const unsigned char* chunk_at = chunk_at_of(ch);
#pragma unroll
      for (int j = 0; j < 2 * kStripChunkRows; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
        const unsigned char* at = row_at(wrap_tag, chunk_at, ch, j / 2) + 8 * (j % 2) * kRowBytes;
#pragma unroll
        for (int x = 0; x < HD / 32; ++x) {
          uint32_t kb[4];
          tc::ldmatrix_x4(kb, at + k_off[(j / 2) % 2][x]);
          M::run(sc[j], qa[2 * x], kb);
          M::run(sc[j], qa[2 * x + 1], kb + 2);
        }
      }
    };
    auto consume = [&](auto rpb_tag, auto wrap_tag, Scores& sc, int ch, bool first) {
      constexpr bool kRpb = decltype(rpb_tag)::value;
      const uint32_t w[2] = {square_chunk_word(sq.word[0], ch), square_chunk_word(sq.word[1], ch)};
      const int bias_at[2] = {sq.bias_at[0] + strip_chunk_bias(row_mult, ch), sq.bias_at[1] + strip_chunk_bias(row_mult, ch)};
      strip_chunk_softmax<kRpb, 1, HD>(sc, w, bias_at, bias, row_mult, p.scale_log2, fold, mul, m, l, o, first);
      const unsigned char* chunk_at = chunk_at_of(ch);
#pragma unroll
      for (int i = 0; i < kStripChunkRows; ++i) {
        const uint32_t pa[4] = {M::pack(sc[2 * i][0], sc[2 * i][1]), M::pack(sc[2 * i][2], sc[2 * i][3]),
                                M::pack(sc[2 * i + 1][0], sc[2 * i + 1][1]),
                                M::pack(sc[2 * i + 1][2], sc[2 * i + 1][3])};
        const unsigned char* at = row_at(wrap_tag, chunk_at, ch, i);
#pragma unroll
        for (int x = 0; x < HD / 16; ++x) {
          uint32_t vb[4];
          tc::ldmatrix_x4_trans(vb, at + v_off[i % 2][x]);
          M::run(o[2 * x], pa, vb);
          M::run(o[2 * x + 1], pa, vb + 2);
        }
      }
    };
    SquareRunRing<NA, HD, Tl> ring;
    auto release_upto = [&](int upto) {
      ring.release_upto(upto, lane, smem, p, box, next, rot, phase, &map_k, &map_v);
    };
    instanced(has_rpb, [&](auto rpb_tag) {
      release_upto(square_first_part(sq.sy, 0));
      for (int ch = 0; ch < chunks; ++ch) {
        mbar_wait(parts_full + square_first_part(sq.sy, ch), phase);
        mbar_wait(parts_full + square_last_part(sq.sy, ch), phase);
        auto chunk = [&](auto wrap_tag) {
          Scores sc;
          scores(wrap_tag, ch, sc);
          consume(rpb_tag, wrap_tag, sc, ch, ch == 0);
        };
        // (a chunk whose rows pass the ring's end, warp-uniform: the per-row slot addresses)
        if (square_run_ring_row(ring_sy + kStripChunkRows * ch) > kSquareRingRows - kStripChunkRows)
          chunk(std::true_type{});
        else
          chunk(std::false_type{});
        release_upto(ch + 1 < chunks ? square_first_part(sq.sy, ch + 1) : kSquareParts);
      }
    });

    // O / l from the registers to the output (the query tile holds the next box's Q), the
    // LSE from the lanes holding column 0.
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = quad_sum(l[r]);
      inv[r] = inv_row_sum(l[r]);
    }
    const int row0 = square_query_row(warp, g4);
    T* out = head_base<T>(p.out, p.out_s, b, h);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t off;
      const bool ok = box_row_offset<NA, QB>(p, tile, tile.q0, row0 + kSquareLaneRowStep * r, p.out_s, off);
      store_square_row<T, HD>(out + off, ok, o, r, inv[r], t4);
      if (t4 == 0 && sq.row_ok[r])
        p.lse[lse_row<NA, QB>(p, tile, row0 + kSquareLaneRowStep * r, b, h)] = row_lse(m[r], l[r]);
    }
    rot = (rot + kSquareParts) % kSquareRingParts;
  }
  if (threadIdx.x == 0) square_run_drain<Tl, HD, 0>(smem, k);  // (the copies of the run's last box landed)
#endif
}

}  }  // namespace nattn::sm90
