// Hopper (sm_90a) square pair, persistent forms: the run of boxes a CTA walks and the copy
// protocol its kernels share (forward_squares_persistent.cuh, the forward;
// backward_dq_squares_persistent.cuh, the dQ pass; the dK/dV pass,
// backward_dkv_squares_persistent.cuh, takes the runs, the count and the row stores).
//
// A CTA walks a run of consecutive boxes of the flattened [batch, head, box] order (mostly
// along a row of boxes of one head), and the copies of the next box run during the current
// one:
//  - the query tile: once every warp holds what it needs of it (a count in shared memory:
//    square_run_count), the last of them copies what comes next: the next box's Q rows,
//    behind the next box's entry of the run (square_run_next; at the run's end an arrival on
//    the barrier, so that the warps see the end), or the dQ pass's dO rows of the box;
//  - K / V: the parts form one sequence over the run (part i of the k-th box is number 5 k +
//    i, in ring slot (5 k + i) mod 3); the last warp done with a part copies the sequence's
//    part three on into its slot: parts 3 and 4 of the same box, or parts 0, 1 and 2 of the
//    next one, which thus land during the current box's last chunks. A key box row r sits
//    at ring row (r + 4 rot) mod 12, rot = 2 k mod 3;
//  - results go from the registers to global memory (store_square_row: the query tile holds
//    the next box's rows), so nothing waits at a box's end.
// Each part's barrier completes once a box (phase k mod 2). A part is counted by each warp
// once a box, even and odd boxes apart; a count's fourth warp is its last
// (SquareRunRing::release_upto; csrc/tests/sm90_square_runs_check.cu replays the protocol).
#pragma once
#include "nattn/sm90/forward_squares.cuh"

namespace nattn { namespace sm90 {

// Its output stores: 16 (the default) 16 bytes a lane after a transpose in the quad, 4 the
// lane's bf16 / fp16 pairs as they are (a store writes 16 bytes of each of 8 rows).
#ifndef NATTN_SM90_SQUARE_RUN_STORES
#define NATTN_SM90_SQUARE_RUN_STORES 16
#endif
static_assert(NATTN_SM90_SQUARE_RUN_STORES == 16 || NATTN_SM90_SQUARE_RUN_STORES == 4, "16- or 4-byte stores");

// A box of a CTA's run: its place in the flattened [batch, head, box] order (index < 0: the
// run's end), its head (the dK/dV pass: KV head) and batch, and its tile.
struct SquareRunBox {
  CtaTile tile;
  int index, h, b, pad;
};

// The first box of the run at or after `index` (below `end`) that the whole-box grid runs:
// query boxes QB of p.heads heads (cta_tile), or with kKeys the dK/dV pass's key boxes QB of
// p.heads_kv KV heads (cta_tile_inverse, KB its query box).
template <int NA, class QB, class KB, bool kKeys = false>
NATTN_HD void square_run_box(const Params& p, int index, int end, SquareRunBox& out) {
  const int per = p.cta_tiles;  // boxes a (batch, head)
  for (; index < end; ++index) {
    const int hb = index / per;
    const unsigned i = unsigned(index - hb * per);
    if (kKeys ? cta_tile_inverse<NA, QB, KB>(p, i, out.tile) : cta_tile<NA, QB, KB>(p, i, out.tile)) {
      const int heads = kKeys ? p.heads_kv : p.heads;
      out.index = index;
      out.h = hb % heads;
      out.b = hb / heads;
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

// Thread 0, before the CTA's first barrier: the barriers (rows_full, the parts', kGrad:
// grad_full), the counts zeroed and the run's first box (run[0]; the run is boxes
// [begin, end)).
template <int NA, class Tl, int HD, int kGrad>
__device__ __forceinline__ void square_run_init(const Params& p, unsigned char* smem, int begin, int end) {
  using S = SquareRunSmem<Tl, HD, kGrad>;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  for (int i = 0; i < 1 + kSquareParts + kGrad; ++i) mbar_init(bars + i, 1);
  int* counts = reinterpret_cast<int*>(smem + S::kCounts);
  for (int i = 0; i < 1 + 2 * kSquareParts + kGrad; ++i) counts[i] = 0;
  square_run_box<NA, typename Tl::Q, typename Tl::K>(p, begin, end, reinterpret_cast<SquareRunBox*>(smem + S::kRun)[0]);
  fence_barrier_init();
}

// Thread 0, after that barrier (run[0] holds a box): its Q rows and its parts 0-2.
template <int NA, class Tl, int HD, int kGrad>
__device__ __forceinline__ void square_run_first_loads(const Params& p, unsigned char* smem, const CUtensorMap* map_q,
                                                       const CUtensorMap* map_k, const CUtensorMap* map_v) {
  using S = SquareRunSmem<Tl, HD, kGrad>;
  const SquareRunBox& first = reinterpret_cast<const SquareRunBox*>(smem + S::kRun)[0];
  load_square_rows<NA, HD, Tl>(p, first.tile, kRowsQ, first.h, first.b, smem, map_q,
                               reinterpret_cast<uint64_t*>(smem + S::kBars));
  load_square_parts<NA, HD, Tl, true>(p, first.tile, kv_head(p, first.h), first.b, smem, map_k, map_v, 0,
                                      kSquareRingParts);
}

// Every thread at the run's box k (phase k mod 2): the box once its Q rows landed (the wait
// makes its run entry visible), null at the run's end; with an RPB the head's table is
// restaged where the run changes head (a CTA barrier: the warps are all past the box before).
template <class Tl, int HD, int kGrad>
__device__ __forceinline__ const SquareRunBox* square_run_start(const Params& p, unsigned char* smem, int phase,
                                                                float* bias, int& staged_h) {
  using S = SquareRunSmem<Tl, HD, kGrad>;
  mbar_wait(reinterpret_cast<uint64_t*>(smem + S::kBars), phase);
  const SquareRunBox* box = reinterpret_cast<const SquareRunBox*>(smem + S::kRun) + phase;
  if (box->index < 0) return nullptr;  // uniform
  if (p.rpb != nullptr && box->h != staged_h) {
    __syncthreads();
    stage_strip_rpb<SquareCta<Tl, HD>>(p, box->h, bias);
    staged_h = box->h;
  }
  return box;
}

// A warp done reading the query tile (the whole warp calls it) counts itself; the fourth
// warp's lane 0 runs last().
template <class F>
__device__ __forceinline__ void square_run_count(int* count, int lane, F&& last) {
  __syncwarp();  // (the warp's reads of the tile)
  if (lane == 0) {
    __threadfence_block();
    if (atomicAdd(count, 1) % 4 == 3) {
      __threadfence_block();
      last();
    }
  }
}

// The last reader of the query tile at box k (phase k mod 2): the run's next box into
// run[phase ^ 1] and its Q rows into the tile, or at the run's end an arrival on rows_full.
template <int NA, class Tl, int HD, int kGrad>
__device__ __forceinline__ void square_run_next(const Params& p, unsigned char* smem, const SquareRunBox& box,
                                                int phase, int end, const CUtensorMap* map_q) {
  using S = SquareRunSmem<Tl, HD, kGrad>;
  uint64_t* rows_full = reinterpret_cast<uint64_t*>(smem + S::kBars);
  SquareRunBox& next = reinterpret_cast<SquareRunBox*>(smem + S::kRun)[phase ^ 1];
  square_run_box<NA, typename Tl::Q, typename Tl::K>(p, box.index + 1, end, next);
  if (next.index >= 0) {
    fence_proxy_async_smem();  // (the query tile's reads before the copy engine's writes)
    load_square_rows<NA, HD, Tl>(p, next.tile, kRowsQ, next.h, next.b, smem, map_q, rows_full);
  } else {
    mbar_arrive(rows_full);  // (the run's end)
  }
}

// Thread 0 before the CTA ends, the loop ended at box k (run[k mod 2] empty): the copies of
// the run's last box, k - 1, landed (a part no warp reads too).
template <class Tl, int HD, int kGrad>
__device__ __forceinline__ void square_run_drain(unsigned char* smem, int k) {
  using S = SquareRunSmem<Tl, HD, kGrad>;
  uint64_t* parts_full = reinterpret_cast<uint64_t*>(smem + S::kBars) + 1;
  for (int i = 0; i < kSquareParts; ++i) mbar_wait(parts_full + i, (k - 1) & 1);
}

}  }  // namespace nattn::sm90
