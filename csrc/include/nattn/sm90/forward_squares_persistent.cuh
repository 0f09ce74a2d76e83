// Hopper (sm_90a) square forward, persistent form (build switch NATTN_SM90_SQUARE_PERSIST, off
// by default; head dim 64, the ring kernel's tiles; an experiment, not yet GPU-run).
//
// Why: the square forward's warps spend about as long in their setup and epilogue as in their
// walk (ncu on mid-2d: 864 instructions a warp once, 47% of the stall samples, against 498 a
// chunk of four chunks; PERF.md sixty-eighth session): every CTA waits for its first copies
// and, with the bulk store, for the store's reads before it ends, while three CTAs an SM
// leave little to hide that behind. Here a CTA walks a run of query boxes one after another
// (consecutive boxes of the flattened [batch, head, box] order, so mostly along a row of boxes
// of one head) and the copies of the next box run during the current one:
//  - Q: once every warp holds the box's Q fragments, the last of them (a count) copies the
//    next box's Q rows into the query tile, behind the next box's entry in shared memory
//    (SquareRunBox; with no next box it arrives on the barrier, so that the warps see the end);
//  - K / V: the parts form one sequence over the run (part i of the k-th box is number 5 k +
//    i, in ring slot (5 k + i) mod 3); the last warp done with a part copies the sequence's
//    part three on into its slot: parts 3 and 4 of the same box, or parts 0, 1 and 2 of the
//    next one, which thus land during the current box's last chunks. A key box row r sits
//    at ring row (r + 4 rot) mod 12, rot = 2 k mod 3;
//  - the output goes from the registers to global memory (no staging tile: the query tile
//    holds the next Q), 16 bytes a lane after a transpose in the quad, so nothing waits at a
//    box's end.
// Each part's barrier completes once a box (phase k mod 2). A part is counted by each warp
// once a box, even and odd boxes apart; a count's fourth warp is its last
// (SquareRunRing::release_upto; csrc/tests/sm90_square_runs_check.cu replays the protocol).
#pragma once
#include "nattn/sm90/forward_squares.cuh"

namespace nattn { namespace sm90 {

#ifndef NATTN_SM90_SQUARE_PERSIST
#define NATTN_SM90_SQUARE_PERSIST 0
#endif
template <int HD>
constexpr bool kSquarePersist = NATTN_SM90_SQUARE_PERSIST && kSquareForwardRing<HD>;
// Its output stores: 16 (the default) 16 bytes a lane after a transpose in the quad, 4 the
// lane's bf16 / fp16 pairs as they are (a store writes 16 bytes of each of 8 rows).
#ifndef NATTN_SM90_SQUARE_RUN_STORES
#define NATTN_SM90_SQUARE_RUN_STORES 16
#endif
static_assert(NATTN_SM90_SQUARE_RUN_STORES == 16 || NATTN_SM90_SQUARE_RUN_STORES == 4, "16- or 4-byte stores");

// A box of a CTA's run: its place in the flattened [batch, head, box] order (index < 0: the
// run's end), its head and batch, and its tile.
struct SquareRunBox {
  CtaTile tile;
  int index, h, b, pad;
};

// The first box of the run at or after `index` (below `end`) that holds queries (cta_tile).
template <int NA, class QB, class KB>
NATTN_HD void square_run_box(const Params& p, int index, int end, SquareRunBox& out) {
  const int per = p.cta_tiles;  // boxes a (batch, head)
  for (; index < end; ++index) {
    const int hb = index / per;
    if (cta_tile<NA, QB, KB>(p, unsigned(index - hb * per), out.tile)) {
      out.index = index;
      out.h = hb % p.heads;
      out.b = hb / p.heads;
      return;
    }
  }
  out.index = -1;
}

// The ring row of key box row r of a box whose part 0 sits in slot rot, from r + 4 rot (< 36).
NATTN_HD int square_run_ring_row(int shifted) {
  shifted = shifted >= kSquareRingRows ? shifted - kSquareRingRows : shifted;
  return shifted >= kSquareRingRows ? shifted - kSquareRingRows : shifted;
}

// kGrad 1: the persistent square dQ pass's (backward_dq_squares_persistent.cuh), with a barrier
// for dO's rows and a count of their reads after the parts' counts.
template <class Tl, int HD, int kGrad = 0>
struct SquareRunSmem {
  using Ring = SquareSmem<Tl, HD, true>;
  using Rows = typename Ring::Rows;
  using Cols = typename Ring::Cols;
  using Part = typename Ring::Part;
  // (the ring kernel's tiles and barriers at the same places: load_square_rows / _parts)
  static constexpr int kQ = Ring::kQ, kK = Ring::kK, kV = Ring::kV;
  static constexpr int kBars = Ring::kBars;  // rows_full, parts_full[kSquareParts] (kGrad: grad_full)
  // Q reads, then each part's for even and odd boxes (SquareRunRing::release_upto), then
  // (kGrad) dO's reads
  static constexpr int kCounts = kBars + 8 * (1 + kSquareParts + kGrad);
  static constexpr int kGradCount = 1 + 2 * kSquareParts;
  static constexpr int kRun = (kCounts + 4 * (1 + 2 * kSquareParts + kGrad) + 15) / 16 * 16;  // SquareRunBox[2]
  static constexpr int kBytes = kRun + 2 * int(sizeof(SquareRunBox));
  static constexpr int kAlloc = kBytes + 1024;
  static constexpr int kMinBlocks = 3;
  static constexpr int kRpbFloats = Ring::kRpbFloats;
  static_assert(kMinBlocks * (kAlloc + kSmemReservedPerCta) <= kSmemPerSm, "the CTAs per SM");
};

// A warp's counts of the current box's parts, and the copies its last counts issue.
template <int NA, int HD, class Tl, int kGrad = 0>
struct SquareRunRing {
  using S = SquareRunSmem<Tl, HD, kGrad>;
  int released = 0;  // parts 0 .. released - 1 of the box counted

  // The warp is done with the box's parts before `upto` (the whole warp calls it). A count's
  // fourth warp copies the part three on in the run's sequence into the part's slot, once the
  // part itself has landed (a warp counts the parts it skips too). Even and odd boxes count
  // apart: a warp may count box k + 1's last parts (skipped: a short walk) while another
  // still walks box k, but no warp reaches box k + 2 before every warp has finished box k
  // (box k + 2's Q rows are copied once every warp holds box k + 1's).
  __device__ __forceinline__ void release_upto(int upto, int lane, unsigned char* smem, const Params& p,
                                               const SquareRunBox& box, const SquareRunBox& next, int rot,
                                               int phase, const CUtensorMap* map_k, const CUtensorMap* map_v) {
    if (released >= upto) return;
    __syncwarp();  // (the warp's reads of the parts)
    if (lane == 0) {
      int* counts = reinterpret_cast<int*>(smem + S::kCounts) + 1 + (phase ? kSquareParts : 0);
      uint64_t* parts_full = reinterpret_cast<uint64_t*>(smem + S::kBars) + 1;
      for (int q = released; q < upto; ++q) {
        __threadfence_block();  // (this warp's reads before its count)
        if (atomicAdd(counts + q, 1) % 4 != 3) continue;
        __threadfence_block();  // (every warp's reads before the copy)
        mbar_wait(parts_full + q, phase);
        fence_proxy_async_smem();
        if (q + kSquareRingParts < kSquareParts) {
          load_square_parts<NA, HD, Tl, true>(p, box.tile, kv_head(p, box.h), box.b, smem, map_k, map_v,
                                              q + kSquareRingParts, q + kSquareRingParts + 1, rot);
        } else if (next.index >= 0) {  // (the next box's part 0, 1 or 2: its slot is this one's)
          const int j = q + kSquareRingParts - kSquareParts;
          load_square_parts<NA, HD, Tl, true>(p, next.tile, kv_head(p, next.h), next.b, smem, map_k, map_v, j,
                                              j + 1, (rot + kSquareParts) % kSquareRingParts);
        }
      }
    }
    released = upto;
  }
};

// Row r of a lane's O fragments times inv, to the row's output at `row` (its channel 0; every
// lane of the warp calls it, `ok` says whether the row is stored). The lane holds channels
// 8 n + 2 t4, + 1 of n-tile n: with 16-byte stores a 4 x 4 transpose of each four n-tiles'
// words in the quad (two xor shuffles: bit 1, then bit 0 of t4) leaves lane t4 the 8
// channels of n-tile 4 c + t4, so a quad writes 64 contiguous bytes of the row.
template <typename T, int HD>
__device__ __forceinline__ void store_square_row(T* row, bool ok, const float (&o)[HD / 8][4], int r, float inv,
                                                 int t4) {
#if NATTN_SM90_SQUARE_RUN_STORES == 16
#pragma unroll
  for (int c = 0; c < HD / 32; ++c) {
    uint32_t a[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = pack2<T>(o[4 * c + j][2 * r] * inv, o[4 * c + j][2 * r + 1] * inv);
    const bool b1 = t4 & 2, b0 = t4 & 1;
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // (a[t4][j] <-> a[t4 ^ 2][j ^ 2] where bit 1 of j and t4 differ)
      const uint32_t got = __shfl_xor_sync(0xffffffffu, b1 ? a[i] : a[2 + i], 2);
      if (b1) a[i] = got; else a[2 + i] = got;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // (the same on bit 0)
      const uint32_t got = __shfl_xor_sync(0xffffffffu, b0 ? a[2 * i] : a[2 * i + 1], 1);
      if (b0) a[2 * i] = got; else a[2 * i + 1] = got;
    }
    if (ok) *reinterpret_cast<uint4*>(row + 8 * (4 * c + t4)) = make_uint4(a[0], a[1], a[2], a[3]);
  }
#else
  if (!ok) return;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
    *reinterpret_cast<uint32_t*>(row + 8 * n + 2 * t4) = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
#endif
}

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(SquareCta<Tl, HD>::kThreads, SquareRunSmem<Tl, HD>::kMinBlocks)
    forward_squares_run_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                               const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v) {
#if NATTN_SM90_ENABLED
  static_assert(NA == 2 && kSquareForwardRing<HD>, "the persistent square forward: 2-D, the ring's head dims");
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  using Cta = SquareCta<Tl, HD>;
  using S = SquareRunSmem<Tl, HD>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  using M = tc::Mma<T>;
  constexpr int kRowBytes = C::kRowBytes;
  constexpr int kKeyRowBytes = kSquareKeyBox * kRowBytes;
  unsigned char* smem = aligned_smem();
  uint64_t* rows_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* parts_full = rows_full + 1;
  int* counts = reinterpret_cast<int*>(smem + S::kCounts);  // [0]: Q reads, then the parts' (SquareRunRing)
  SquareRunBox* run = reinterpret_cast<SquareRunBox*>(smem + S::kRun);
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
    mbar_init(rows_full, 1);
    for (int i = 0; i < kSquareParts; ++i) mbar_init(parts_full + i, 1);
    for (int i = 0; i < 1 + 2 * kSquareParts; ++i) counts[i] = 0;
    square_run_box<NA, QB, KB>(p, begin, end, run[0]);
    fence_barrier_init();
  }
  __syncthreads();
  if (run[0].index < 0) return;  // uniform
  if (threadIdx.x == 0) {
    const SquareRunBox& first = run[0];
    load_square_rows<NA, HD, Tl>(p, first.tile, kRowsQ, first.h, first.b, smem, &map_q, rows_full);
    load_square_parts<NA, HD, Tl, true>(p, first.tile, kv_head(p, first.h), first.b, smem, &map_k, &map_v, 0,
                                        kSquareRingParts);
  }
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
    // The box's Q rows (copied behind its entry of the run: the wait makes the entry visible).
    mbar_wait(rows_full, phase);
    const SquareRunBox& box = run[phase];
    if (box.index < 0) break;  // uniform
    const CtaTile tile = box.tile;
    const int h = box.h, b = box.b;
    if (has_rpb && h != staged_h) {  // (the CTA's warps are all past the previous box's walk)
      __syncthreads();
      stage_strip_rpb<Cta>(p, h, bias);
      staged_h = h;
    }
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
    __syncwarp();
    if (lane == 0) {
      __threadfence_block();
      if (atomicAdd(counts, 1) % 4 == 3) {
        __threadfence_block();
        SquareRunBox& next = run[phase ^ 1];
        square_run_box<NA, QB, KB>(p, box.index + 1, end, next);
        if (next.index >= 0) {
          fence_proxy_async_smem();  // (the query tile's reads before the copy engine's writes)
          load_square_rows<NA, HD, Tl>(p, next.tile, kRowsQ, next.h, next.b, smem, &map_q, rows_full);
        } else {
          mbar_arrive(rows_full);  // (the run's end)
        }
      }
    }
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
  // Before the CTA ends: the copies of the run's last box landed (a part no warp reads too).
  if (threadIdx.x == 0)  // (the loop ended at box k with run[k mod 2] empty: the last box was k - 1)
    for (int i = 0; i < kSquareParts; ++i) mbar_wait(parts_full + i, (k - 1) & 1);
#endif
}

}  }  // namespace nattn::sm90
