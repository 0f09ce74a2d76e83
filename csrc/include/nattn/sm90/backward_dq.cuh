// Hopper (sm_90a) NA backward, dQ pass (deterministic: each dQ row is written once).
//
// The forward's CTA shape: warpgroup 0's first thread is the producer; it loads the query
// box's Q and dO rows once and then, per key box (64 or 96 keys) of the windows' union,
// K and V into a ring of stages. Warpgroups 1 and 2 own 64 queries each; per key box
//   S = Q K^T, dP = dO V^T           (wgmma, both operands in shared memory)
//   P = exp2(S scale log2e + bias - LSE log2e), masked as the forward masks
//   dS = P (dP - delta)              (delta = rowsum(dO O) - dLSE: computed here from the
//                                     staged dO where Params::delta_in_dq, else by
//                                     backward_delta.cuh's kernel)
//   dQ += dS K                       (wgmma, dS from registers, K MN-major)
// and at the end dQ * scale goes out through shared memory in 16-byte stores. With RPB it
// also records each query head's largest |dS| for the dK/dV pass's fixed-point dRPB.
// At head dims up to 64 each half of the query box has a CTA of its own (DqCta::kSplit):
// a producer warpgroup and one consumer warpgroup, two CTAs an SM.
#pragma once
#include <cuda.h>
#include <math.h>

#include <type_traits>

#include "nattn/common/drpb_fixed.cuh"
#include "nattn/sm90/backward_delta.cuh"
#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/forward.cuh"
#include "nattn/sm90/smem_tile.cuh"

// Build switch for A/B runs (benchmarks/build_variants.sh): 0 waits for each step's dQ
// product before the next step's S and dP are issued.
#ifndef NATTN_SM90_DQ_PIPELINED
#define NATTN_SM90_DQ_PIPELINED 1
#endif
// Build switch: 0 keeps one 384-thread CTA per query box at every head dim (DqCta).
#ifndef NATTN_SM90_DQ_SPLIT
#define NATTN_SM90_DQ_SPLIT 1
#endif

namespace nattn { namespace sm90 {

// The dQ pass's CTA for tile pair Tl at head dim HD. kSplit: a CTA per half of the query
// box (along axis 0, Half), with a producer warpgroup and one consumer warpgroup, two CTAs
// an SM. The passes of a small window walk a few key boxes each, and a 384-thread CTA (one
// an SM) spent a third of its warps' time in its prologue and epilogue, which nothing else
// on the SM overlapped (Nsight, mid-2d: PERF.md forty-sixth session); two independent CTAs
// overlap one's prologue with the other's steps, and each loads only the key boxes its half
// sees. Head dims up to 64: two CTAs' rings then fit the shared memory, and the consumers
// the 128 registers a thread that two 256-thread CTAs an SM are launched with.
template <class Tl, int HD>
struct DqCta {
  using Q = typename Tl::Q;
  static constexpr bool kSplit = NATTN_SM90_DQ_SPLIT && HD <= 64 && Q::kSize == kQueryRows;
  static constexpr int kThreads = kSplit ? 256 : 384;
  static constexpr int kMinBlocks = kSplit ? 2 : 1;
  static constexpr int kRows = kSplit ? kWgRows : kQueryRows;  // Q / dO rows in shared memory
  using Half = Box<Q::extent(0) / (kSplit ? 2 : 1), Q::extent(1), Q::extent(2)>;  // what a CTA's copies hold
  using Regs = typename std::conditional<kSplit, RegisterSplit<24, 232, 1>, DefaultRegisterSplit>::type;
};

// Shared memory of the dQ pass: the CTA's Q and dO rows, then STAGES (K, V) boxes.
template <int HD, int NK, int ROWS = kQueryRows>
struct DqSmem {
  using Rows = TileSmem<HD, ROWS>;
  using Cols = TileSmem<HD, NK>;
  static constexpr int kStages = 3;
  static constexpr int kQ = 0;
  static constexpr int kDo = kQ + Rows::kBytes;
  static constexpr int kK = kDo + Rows::kBytes;
  static constexpr int kV = kK + kStages * Cols::kBytes;
  static constexpr int kBars = kV + kStages * Cols::kBytes;  // rows_full, k_full[S], v_full[S], empty[S]
  static constexpr int kBytes = kBars + 8 * (1 + 3 * kStages);
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  static_assert(kAlloc <= 227 * 1024, "more shared memory than a Hopper block may have");
};

// A dQ pass lane's query row qr of box QB (at the CTA's q0): its window and RPB row part
// (head h's table base included), its [B, N, H] index, its LSE in log2 units (+inf for a
// padding row: no probability) and its delta (0 there, and where this pass computes it:
// Params::delta_in_dq). False for a padding row.
template <int NA, class QB>
__device__ __forceinline__ bool dq_query_row(const Params& p, const CtaTile& tile, int b, int h, int qr,
                                             const int* rpb_mult, RowWindow& row, float& lse2, float& dlt,
                                             int64_t& idx) {
  row.rpb = h * int(p.rpb_head_size);
  const bool ok = row_window<NA, QB>(p, tile.q0, tile.len, qr, rpb_mult, row);
  int64_t token;
  box_row_token<NA, QB>(p, tile, tile.q0, qr, token);
  idx = (int64_t(b) * p.tokens + token) * p.heads + h;
  lse2 = ok ? lse_log2(p.lse[idx]) : INFINITY;
  dlt = ok && !p.delta_in_dq ? p.delta[idx] : 0.f;
  return ok;
}

// The fused delta's O pieces of a lane: row qr's channels t4 HD / 4 .. (t4 + 1) HD / 4 - 1,
// as HD / 32 16-byte loads (zeros for a padding row). Issued before the staged rows' wait.
template <typename T, int NA, int HD, class QB>
__device__ __forceinline__ void load_out_pieces(const Params& p, const CtaTile& tile, int b, int h, int qr, int t4,
                                                bool ok, uint4 (&piece)[HD / 32]) {
  int64_t off;
  box_row_offset<NA, QB>(p, tile, tile.q0, qr, p.out_s, off);  // (ok: the caller's)
  const T* row = head_base<const T>(p.out, p.out_s, b, h) + off + t4 * (HD / 4);
#pragma unroll
  for (int j = 0; j < HD / 32; ++j)
    piece[j] = ok ? *reinterpret_cast<const uint4*>(row + 8 * j) : make_uint4(0u, 0u, 0u, 0u);
}

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(DqCta<Tl, HD>::kThreads, DqCta<Tl, HD>::kMinBlocks)
    backward_dq_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                       const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v) {
#if NATTN_SM90_ENABLED
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  constexpr int kNk = KB::kSize;
  using Cta = DqCta<Tl, HD>;
  constexpr bool kSplit = Cta::kSplit;
  using S = DqSmem<HD, kNk, Cta::kRows>;
  static_assert(!kSplit || 2 * (S::kAlloc + kSmemReservedPerCta) <= kSmemPerSm, "two split dQ CTAs an SM");
  using R = typename S::Rows;
  using C = typename S::Cols;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* rows_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = bars + 1 + S::kStages;
  uint64_t* empty = bars + 1 + 2 * S::kStages;

  CtaTile tile;
  if (!cta_tile<NA, QB, KB>(p, kSplit ? blockIdx.x / 2 : blockIdx.x, tile)) return;  // uniform over the CTA
  // kSplit: the CTA's half of the box (none past the dilation group's end)
  const int half = kSplit ? int(blockIdx.x % 2) : 0;
  if (kSplit && tile.q0[0] + half * Cta::Half::extent(0) >= tile.len[0]) return;
  if (kSplit && NATTN_SM90_SPLIT_OWN_WALK) narrow_to_half<NA, QB, KB, false>(p, tile, half);
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
      mbar_init(empty + s, Cta::kRows / 16);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // ------------------------------------------------ producer
    regs_dealloc<Cta::Regs::kProducer>();
    if (warp != 0 || lane != 0) return;
    int c[5];
    const HeadCoords hq = head_coords<HD>(p, kRowsQ, p.heads, h, b);
    const HeadCoords hdo = head_coords<HD>(p, kRowsGradOut, p.heads, h, b);
    const int first[3] = {tile.q0[0] + half * Cta::Half::extent(0), tile.q0[1], tile.q0[2]};
    mbar_expect_tx(rows_full, 2 * R::kBytes);
    for (int cb = 0; cb < R::kBlocks; ++cb) {
      box_coords<NA>(p, tile, first, hq.channel + cb * R::kChannels, hq.outer, c);
      tma_load_box<NA, typename Cta::Half, R::kRowBytes>(p, smem + S::kQ + cb * R::kBlockBytes, &map_q, rows_full, c);
      box_coords<NA>(p, tile, first, hdo.channel + cb * R::kChannels, hdo.outer, c);
      tma_load_box<NA, typename Cta::Half, R::kRowBytes>(p, smem + S::kDo + cb * R::kBlockBytes, &map_do, rows_full, c);
    }
    int from = 0, to = -1;  // kSplit: only the boxes the half sees
    if (kSplit) seen_steps<QB, KB, false>(p, tile, half, from, to);
    produce_kv_ring<NA, HD, KB, C, S::kStages>(p, tile, h_kv, b, smem + S::kK, smem + S::kV, &map_k, &map_v,
                                              k_full, v_full, empty, from, to);
    return;
  }

  // ---------------------------------------------------------------- consumers
  regs_alloc<Cta::Regs::kConsumer>();
  const int cw = kSplit ? half : wg - 1;  // the half of the box: query rows 64 cw ..
  const int row0 = kSplit ? 0 : cw * kWgRows;  // its first row in the Q and dO tiles
  const int wr = (warp % 4) * 16;
  const int g4 = lane / 4, t4 = lane % 4;

  // The lane's two rows: windows, RPB row part, LSE (log2 units) and delta (or, fused, the
  // O pieces it is computed from once dO is staged).
  RowWindow row[2];
  float lse2[2], dlt[2];
  int64_t row_idx[2];
  bool row_ok[2];
  uint4 o_piece[2][HD / 32];
  int rpb_mult[3] = {1, 1, 1};
  for (int a = NA - 2; a >= 0; --a) rpb_mult[a] = rpb_mult[a + 1] * p.rpb_size[a + 1];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qr = cw * kWgRows + wr + g4 + 8 * r;
    row_ok[r] = dq_query_row<NA, QB>(p, tile, b, h, qr, rpb_mult, row[r], lse2[r], dlt[r], row_idx[r]);
    if (p.delta_in_dq) load_out_pieces<T, NA, HD, QB>(p, tile, b, h, qr, t4, row_ok[r], o_piece[r]);
  }
  // Key boxes inside every window of this warpgroup's queries need no mask.
  int full_lo[3], full_hi[3];
  unmasked_boxes<NA, QB, false, true>(p, tile, cw, full_lo, full_hi);

  float dq[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) dq[i] = 0.f;
  const bool has_rpb = p.rpb != nullptr;
  unsigned ds_max = 0;  // with RPB: the largest |dS| of the lane's scores, as float bits
  const unsigned char* q_tile = smem + S::kQ;
  const unsigned char* do_tile = smem + S::kDo;
  mbar_wait(rows_full, 0);
  if (p.delta_in_dq) {  // delta = rowsum(dO O) - dLSE: the quad's lanes hold a quarter of a row each
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int sr = row0 + wr + g4 + 8 * r;  // the row in the staged dO tile
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < HD / 32; ++j)
        dot += piece_dot<T>(o_piece[r][j], *reinterpret_cast<const uint4*>(do_tile + R::offset(sr, t4 * (HD / 4) + 8 * j)));
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      if (row_ok[r]) {
        dlt[r] = row_delta(p, row_idx[r], dot);
        if (t4 == 0) p.delta[row_idx[r]] = dlt[r];  // for the dK/dV pass
      }
    }
  }

  // Key boxes this warpgroup's queries do not see (seen_steps): only released. Their copies are
  // waited for even so: a warpgroup releasing slots unread could run a whole ring ahead and
  // arrive twice on one phase of `empty`, letting the producer refill a slot the other
  // warpgroup still reads. kSplit: the producer loads only the seen boxes, box k into ring
  // step k - ring0.
  int first_step, last_step;
  seen_steps<QB, KB, false>(p, tile, cw, first_step, last_step);
  const int ring0 = kSplit ? first_step : 0;
  auto release_slot = [&](int k) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + (k - ring0) % S::kStages);
  };
  auto release_only = [&](int k) {
    const int s = k % S::kStages, phase = (k / S::kStages) & 1;
    mbar_wait(k_full + s, phase);
    mbar_wait(v_full + s, phase);
    release_slot(k);
  };
  // kPipelined: step k issues its S and dP, then the previous step's dQ product, and computes
  // its dS while that dQ product runs (as the forward overlaps its softmax with P V); dS
  // waits in ds_prev for the next step. Every product is waited for inside its step: in
  // flight across the loop's back edge, ptxas serialized the kernel's wgmma (C7511).
  constexpr bool kPipelined = NATTN_SM90_DQ_PIPELINED;
  uint32_t ds_prev[kNk / 16][4];
  auto issue_dq = [&](int k, const uint32_t (&ds)[kNk / 16][4]) {
    const unsigned char* k_tile = smem + S::kK + ((k - ring0) % S::kStages) * C::kBytes;
#pragma unroll
    for (int kk = 0; kk < kNk / 16; ++kk) wgmma_rs<T, HD>(dq, ds[kk], C::mn_major(k_tile, kk), 1);
    wgmma_commit();
  };
  BoxWalk<NA, KB> walk(tile);
  for (int k = 0; k < first_step; ++k, walk.next(tile))
    if (!kSplit) release_only(k);
  for (int k = first_step; k < last_step; ++k, walk.next(tile)) {
    const int s = (k - ring0) % S::kStages, phase = ((k - ring0) / S::kStages) & 1;
    const unsigned char* k_tile = smem + S::kK + s * C::kBytes;
    const unsigned char* v_tile = smem + S::kV + s * C::kBytes;
    float sc[kNk / 2], dp[kNk / 2];
    mbar_wait(k_full + s, phase);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_ss<T, kNk>(sc, R::k_major(q_tile, row0, kk), C::k_major(k_tile, 0, kk), kk > 0);
    mbar_wait(v_full + s, phase);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_ss<T, kNk>(dp, R::k_major(do_tile, row0, kk), C::k_major(v_tile, 0, kk), kk > 0);
    wgmma_commit();
    const bool dq_behind = kPipelined && k > first_step;
    if (dq_behind) {
      issue_dq(k - 1, ds_prev);
      wgmma_wait<1>();  // S and dP are in; the previous step's dQ product may still run
    } else {
      wgmma_wait<0>();
    }
    fence_regs(sc);
    fence_regs(dp);

    // P (masked unless the box is inside every window), then dS = P (dP - delta) in sc.
    const int* origin = walk.origin;
    bool full = true;
#pragma unroll
    for (int a = 0; a < NA; ++a)
      full = full && origin[a] >= full_lo[a] && origin[a] + KB::extent(a) - 1 <= full_hi[a];
    if (full && !has_rpb) {
#pragma unroll
      for (int i = 0; i < kNk / 2; ++i) {
        const int r = (i / 2) % 2;
        sc[i] = fast_exp2(fmaf(sc[i], p.scale_log2, -lse2[r])) * (dp[i] - dlt[r]);
      }
    } else if (!has_rpb) {
      const RowPairMask<NA, KB> mask(row[0].lo, row[0].hi, row[1].lo, row[1].hi, origin, t4);
#pragma unroll
      for (int i = 0; i < kNk / 2; ++i) {
        const int r = (i / 2) % 2;
        sc[i] = kept(mask.in(i), fast_exp2(fmaf(sc[i], p.scale_log2, -lse2[r])) * (dp[i] - dlt[r]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < kNk / 2; ++i) {
        const int r = (i / 2) % 2;
        const int col = 8 * (i / 4) + 2 * t4 + (i % 2);
        bool in = true;
        int rpb_col = 0;
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          const int key = origin[a] + KB::offset(col, a);
          in = in && key >= row[r].lo[a] && key <= row[r].hi[a];
          rpb_col += key * rpb_mult[a];
        }
        float x = sc[i] * p.scale_log2;
        if (in && has_rpb) x += __ldg(p.rpb + row[r].rpb + rpb_col) * kLog2e;
        sc[i] = in ? fast_exp2(x - lse2[r]) * (dp[i] - dlt[r]) : 0.f;
        ds_max = drpb_abs_max(ds_max, sc[i]);
      }
    }
    uint32_t ds[kNk / 16][4];
#pragma unroll
    for (int i = 0; i < kNk / 2; i += 2) ds[i / 8][(i % 8) / 2] = pack2<T>(sc[i], sc[i + 1]);

    if (kPipelined) {
      if (dq_behind) {
        wgmma_wait<0>();
        fence_regs(dq);
        fence_regs(ds_prev);
        release_slot(k - 1);
      }
#pragma unroll
      for (int i = 0; i < kNk / 16; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) ds_prev[i][j] = ds[i][j];
    } else {
      wgmma_fence();
      issue_dq(k, ds);
      wgmma_wait<0>();
      fence_regs(dq);
      fence_regs(ds);
      release_slot(k);
    }
  }
  if (kPipelined && last_step > first_step) {  // the last step's dQ product
    wgmma_fence();
    issue_dq(last_step - 1, ds_prev);
    wgmma_wait<0>();
    fence_regs(dq);
    release_slot(last_step - 1);
  }
  if (!kSplit)
    for (int k = last_step; k < tile.tiles; ++k) release_only(k);

  if (p.drpb_max) {  // every lane of the consumer warps gets here
    ds_max = __reduce_max_sync(0xffffffffu, ds_max);
    if (lane == 0) atomicMax(p.drpb_max + h, ds_max);
  }
  // dQ * scale through the warpgroup's own Q rows (no longer read), then whole-row stores.
  unsigned char* stage = smem + S::kQ;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int r = (i / 2) % 2;
    const int qr = row0 + wr + g4 + 8 * r;
    const int col = 8 * (i / 4) + 2 * t4;
    *reinterpret_cast<uint32_t*>(stage + R::offset(qr, col)) = pack2<T>(dq[i] * p.scale, dq[i + 1] * p.scale);
  }
  named_sync(1 + cw, 128);
  T* out = head_base<T>(p.dq, p.dq_s, b, h);
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x - 128 * wg; idx < kWgRows * kChunks; idx += 128) {
    const int qr = cw * kWgRows + idx / kChunks, ch = idx % kChunks;
    int64_t off;
    if (box_row_offset<NA, QB>(p, tile, tile.q0, qr, p.dq_s, off))
      *reinterpret_cast<uint4*>(out + off + ch * 8) =
          *reinterpret_cast<const uint4*>(stage + R::offset(row0 + idx / kChunks, ch * 8));
  }
#endif
}

}  }  // namespace nattn::sm90
