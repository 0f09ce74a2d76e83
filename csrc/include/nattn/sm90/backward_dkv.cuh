// Hopper (sm_90a) NA backward, dK/dV pass (and dRPB): the dQ pass's structure with the
// roles of keys and queries swapped.
//
// A CTA owns a 128-token box of keys of one (batch, KV head, dilation group). Warpgroup
// 0: its first warp's first thread loads the CTA's K and V rows once and then, per query
// box of the keys' inverse neighbourhood (tiles.cuh, cta_tile_inverse) and per query head
// of the KV head (GQA), that box's Q and dO rows into a ring of stages; its second warp
// stages the same boxes' LSE (log2 units) and delta rows, plain loads into shared memory,
// completing a stage barrier of 32 arrivals (and reusing a stage once all 256 consumer
// threads have arrived on its ld_empty barrier: each thread releases its own reads). Warpgroups 1 and 2 own 64 keys each; per
// query box
//   S^T = K Q^T, dP^T = V dO^T         (wgmma, both operands in shared memory)
//   P^T = exp2(S^T scale log2e + bias - LSE log2e), masked: the query inside the window
//   dS^T = P^T (dP^T - delta)
//   dV += P^T dO, dK += dS^T Q         (wgmma, P^T and dS^T from registers)
// with dRPB added per score (in shared memory when the table fits: in fixed point after the
// deterministic dQ pass, common/drpb_fixed.cuh, else float32, drpb.cuh). dK * scale
// and dV leave through the K and V rows' shared memory in 16-byte stores. No atomics on
// dK / dV: a KV head's every query head runs in the one CTA.
#pragma once
#include <cuda.h>
#include <math.h>

#include <type_traits>

#include "nattn/common/drpb.cuh"
#include "nattn/common/drpb_fixed.cuh"
#include "nattn/sm90/backward_delta.cuh"
#include "nattn/sm90/box_mask.cuh"
#include "nattn/sm90/forward.cuh"
#include "nattn/sm90/smem_tile.cuh"

// Build switch for A/B runs (benchmarks/build_variants.sh): 0 waits for each step's dK
// product before the next step's S^T is issued.
#ifndef NATTN_SM90_DKV_DEFER_DK
#define NATTN_SM90_DKV_DEFER_DK 1
#endif
// ... and 0 keeps the 1-D and 3-D dK product in its own step (kShiftDk below).
#ifndef NATTN_SM90_DKV_SHIFT_DK
#define NATTN_SM90_DKV_SHIFT_DK 1
#endif
// ... and 1 (default) gives the 3-D head-dim-128 deterministic instance's consumers 240
// registers (producers 24: 64512 a CTA, what a 384-thread CTA is launched with at one CTA per
// SM; with producers at 32 the consumers' setmaxnreg waited forever), where the shift of the
// dK product compiles without spills, and runs that shift (kWideRegs below): HunyuanVideo
// f+b 0.5% faster (PERF.md, twenty-fifth session). In 2-D at head dim 128 the same split ran
// no faster than the deferred dK wait, which stays.
#ifndef NATTN_SM90_DKV_WIDE_REGS
#define NATTN_SM90_DKV_WIDE_REGS 1
#endif
// ... and bit NA - 1 set (default: every NA dim): at head dim 128 dV's product is issued
// after dP^T's, in its own group, and left in flight while dS^T is computed (kDvLast below;
// PERF.md, thirty-eighth session: the dK/dV pass 1.0% faster on HunyuanVideo, 0.7% on FLUX,
// 2.9% on the 1-D anchor).
#ifndef NATTN_SM90_DKV_DV_LAST
#define NATTN_SM90_DKV_DV_LAST 7
#endif
// ... and 0 keeps one 384-thread CTA per key box at every head dim (DkvCta).
#ifndef NATTN_SM90_DKV_SPLIT
#define NATTN_SM90_DKV_SPLIT 1
#endif

namespace nattn { namespace sm90 {

// Fraction bits of the fixed-point dRPB: a CTA's 128 keys bound a table entry's terms.
constexpr int kDrpbFixedBits = fixed_bits(2 * kWgRows);

// The KV-parallel dQ's fp32 staging of one consumer warpgroup: its 64 query rows x HD / 2
// channels (the warpgroups split the channels), as boxes of kInner channels in the layout the
// copy engine reads for a swizzled fp32 box (rows of 128 bytes, or 64 at head dim 32).
template <int HD>
struct DqStage {
  static constexpr int kChannels = HD / 2;
  static constexpr int kInner = HD >= 64 ? 32 : 16;  // floats per box row
  static constexpr int kRowBytes = kInner * 4;       // = the swizzle span
  static constexpr int kBoxes = kChannels / kInner;
  static constexpr int kBoxBytes = kWgRows * kRowBytes;
  static constexpr int kBytes = kBoxes * kBoxBytes;
  static __device__ __forceinline__ int offset(int row, int c) {
    const int chunk = (c % kInner) / 4;
    const int swz = kRowBytes == 128 ? (row & 7) : ((row >> 1) & 3);
    return (c / kInner) * kBoxBytes + row * kRowBytes + ((chunk ^ swz) << 4) + (c % 4) * 4;
  }
};

// The dK/dV pass's CTA for tile pair Tl at head dim HD (the dQ pass's DqCta, with keys):
// kSplit, a CTA per half of the key box with one consumer warpgroup, two CTAs an SM, which
// loads only the query boxes its half sees; not the KV-parallel dQ (DQ), whose dQ products
// take both halves' dS^T. kHalfMaps: the K and V maps hold half a key box (Half), which the
// KV-parallel kernel copies twice. Two CTAs an SM are launched with 128 registers a thread,
// which setmaxnreg divides (ptxas allocates the consumers' code by the raised count): 40 /
// 216 for 1-D and 2-D bf16, and fp16 with 96-query boxes; the rest (3-D, fp16 with 64-query
// boxes: kTightRegs) spilled there and 24 / 232 spilled 4 bytes in 3-D (the LSE / delta
// warp), so they take 32 / 224 (40 / 216 stays where it is: 32 / 224 ran fp16's 96-query
// boxes 1.5% slower, while splitting the rest at it ran them 2-9% faster than whole CTAs,
// PERF.md forty-seventh session).
template <typename T, int NA, class Tl, int HD, bool DQ>
struct DkvCta {
  using RB = typename Tl::Q;
  static constexpr bool kHalfMaps = NATTN_SM90_DKV_SPLIT && HD <= 64 && RB::kSize == kQueryRows;
  static constexpr bool kSplit = kHalfMaps && !DQ;
  static constexpr bool kTightRegs = !(NA < 3 && (std::is_same<T, bf16_t>::value || Tl::K::kSize > kWgRows));
  static constexpr int kThreads = kSplit ? 256 : 384;
  static constexpr int kMinBlocks = kSplit ? 2 : 1;
  static constexpr int kRows = kSplit ? kWgRows : kQueryRows;  // K / V rows in shared memory
  static constexpr int kConsumerThreads = kRows * 2;
  using Half = Box<RB::extent(0) / (kHalfMaps ? 2 : 1), RB::extent(1), RB::extent(2)>;
};

// Shared memory of the dK/dV pass: the CTA's K and V rows, STAGES (Q, dO) boxes, with DQ
// (the KV-parallel dQ) two sets of both warpgroups' dS^T and their dQ staging, STAGES (LSE,
// delta) rows, barriers, then the staged dRPB table (size known at launch, at most kDrpbRoom).
template <int HD, int NQ, bool DQ = false, int ROWS = kQueryRows>
struct DkvSmem {
  using Rows = TileSmem<HD, ROWS>;
  using Cols = TileSmem<HD, NQ>;
  using DsTile = TileSmem<NQ, kWgRows>;  // a warpgroup's dS^T: 64 keys x NQ queries, 16-bit
  using Stage = DqStage<HD>;
  static constexpr int kStages = DQ && HD >= 128 ? 2 : 3;
  static constexpr int kK = 0;
  static constexpr int kV = kK + Rows::kBytes;
  static constexpr int kQ = kV + Rows::kBytes;
  static constexpr int kDo = kQ + kStages * Cols::kBytes;
  static constexpr int kDs = kDo + kStages * Cols::kBytes;  // [step % 2][warpgroup]
  static constexpr int kDqStage = kDs + (DQ ? 4 * DsTile::kBytes : 0);  // [warpgroup]
  static constexpr int kLd = kDqStage + (DQ ? 2 * Stage::kBytes : 0);  // [stage][lse2 NQ | delta NQ] floats
  // kv_full, qd_full[S], ld_full[S], empty[S], ld_empty[S], ds_full[2], ds_free[2], dq_full[2],
  // dq_empty[2]
  static constexpr int kBars = kLd + kStages * 2 * NQ * 4;
  static constexpr int kDrpb = kBars + 8 * (1 + 4 * kStages + 8);
  static constexpr int kAllocFixed = kDrpb + 1024;  // the base is rounded up to 1024 bytes
  static constexpr int kMaxSmem = 227 * 1024;
  static constexpr int kDrpbRoom = int(kMaxDrpbSmemBytes) < kMaxSmem - kAllocFixed ? int(kMaxDrpbSmemBytes) : kMaxSmem - kAllocFixed;
  static_assert(kAllocFixed + (DQ ? 0 : kMaxDrpbSmemBytes) <= kMaxSmem, "more shared memory than a Hopper block may have");
};

// The dK/dV passes' copy thread: the CTA's K and V rows (tiles RT: from the key box's half
// `half` on, as many copies of box HB, the maps' box, as RT has rows for) once on kv_full,
// then per step the Q and dO rows of the walk's query box (CB, tiles CT) into ring stage
// step % STAGES once the consumers released it (empty), completing on qd_full. Steps
// [first, last) of the walk, step it in ring step it - first.
template <int NA, int HD, class HB, class CB, class RT, class CT, int STAGES>
__device__ __forceinline__ void produce_dkv_rows(const Params& p, const CtaTile& tile, int h_kv, int b, int half,
                                                 int first, int last, unsigned char* k_rows, unsigned char* v_rows,
                                                 unsigned char* q_ring, unsigned char* do_ring,
                                                 const CUtensorMap* map_k, const CUtensorMap* map_v,
                                                 const CUtensorMap* map_q, const CUtensorMap* map_do,
                                                 uint64_t* kv_full, uint64_t* qd_full, uint64_t* empty) {
  int c[5];
  const HeadCoords hk = head_coords<HD>(p, kRowsK, p.heads_kv, h_kv, b);
  const HeadCoords hv = head_coords<HD>(p, kRowsV, p.heads_kv, h_kv, b);
  mbar_expect_tx(kv_full, 2 * RT::kBytes);
  constexpr int kCopies = RT::kBlockBytes / RT::kRowBytes / HB::kSize;
  for (int j = 0; j < kCopies; ++j) {
    const int at[3] = {tile.q0[0] + (half + j) * HB::extent(0), tile.q0[1], tile.q0[2]};
    const int rows = j * HB::kSize * RT::kRowBytes;
    for (int cb = 0; cb < RT::kBlocks; ++cb) {
      box_coords<NA>(p, tile, at, hk.channel + cb * RT::kChannels, hk.outer, c);
      tma_load_box<NA, HB, RT::kRowBytes>(p, k_rows + cb * RT::kBlockBytes + rows, map_k, kv_full, c);
      box_coords<NA>(p, tile, at, hv.channel + cb * RT::kChannels, hv.outer, c);
      tma_load_box<NA, HB, RT::kRowBytes>(p, v_rows + cb * RT::kBlockBytes + rows, map_v, kv_full, c);
    }
  }
  BoxWalk<NA, CB> walk(tile);  // step it: query head h_kv * groups + walk.pass
  for (int it = 0; it < first; ++it) walk.next(tile);
  for (int it = 0; it < last - first; ++it, walk.next(tile)) {
    const int s = it % STAGES;
    if (it >= STAGES) mbar_wait(empty + s, ((it / STAGES) - 1) & 1);
    const int h = h_kv * p.groups + walk.pass;
    const int* origin = walk.origin;
    const HeadCoords hq = head_coords<HD>(p, kRowsQ, p.heads, h, b);
    const HeadCoords hdo = head_coords<HD>(p, kRowsGradOut, p.heads, h, b);
    mbar_expect_tx(qd_full + s, 2 * CT::kBytes);
    for (int cb = 0; cb < CT::kBlocks; ++cb) {
      box_coords<NA>(p, tile, origin, hq.channel + cb * CT::kChannels, hq.outer, c);
      tma_load_box<NA, CB, CT::kRowBytes>(p, q_ring + s * CT::kBytes + cb * CT::kBlockBytes, map_q, qd_full + s, c);
      box_coords<NA>(p, tile, origin, hdo.channel + cb * CT::kChannels, hdo.outer, c);
      tma_load_box<NA, CB, CT::kRowBytes>(p, do_ring + s * CT::kBytes + cb * CT::kBlockBytes, map_do, qd_full + s, c);
    }
  }
}

// The dK/dV passes' LSE / delta warp: per step, the query box's LSE (log2 units; +inf for
// padding: no probability) and delta rows into ld_rows[stage][LSE CB::kSize | delta
// CB::kSize], plain loads, once every consumer thread released the stage (ld_empty);
// completes ld_full with the warp's 32 arrivals. Steps [first, last), as produce_dkv_rows.
template <int NA, class CB, int STAGES>
__device__ __forceinline__ void produce_lse_delta(const Params& p, const CtaTile& tile, int h_kv, int b, int first,
                                                  int last, int lane, float* ld_rows, uint64_t* ld_full,
                                                  uint64_t* ld_empty) {
  constexpr int kNq = CB::kSize;
  BoxWalk<NA, CB> walk(tile);  // step it: query head h_kv * groups + walk.pass
  for (int it = 0; it < first; ++it) walk.next(tile);
  for (int it = 0; it < last - first; ++it, walk.next(tile)) {
    const int s = it % STAGES;
    if (it >= STAGES) mbar_wait(ld_empty + s, ((it / STAGES) - 1) & 1);
    const int h = h_kv * p.groups + walk.pass;
    const int* origin = walk.origin;
    float* ld = ld_rows + s * 2 * kNq;
    // The box's row 0 (always a real token: the walk's origins lie inside the union) and
    // each row's index as an offset from it, in 32 bits (fewer than 2^31 tokens x heads,
    // prepare_backward checks): with 64-bit token math per row this warp spilled at 24
    // registers (the wide-register split, kWideRegs).
    unsigned first = 0;
#pragma unroll
    for (int a = 0; a < NA; ++a) first = first * unsigned(p.spatial[a]) + unsigned(tile.g[a] + p.dilation[a] * origin[a]);
    const int64_t row0 = (int64_t(b) * p.tokens + first) * p.heads + h;  // [B, N, H] index
    const float* lse_box = p.lse + row0;
    const float* delta_box = p.delta + row0;
#pragma unroll
    for (int col = lane; col < kNq; col += 32) {
      bool ok = true;
      unsigned rel = 0;
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        if (CB::extent(a) > 1) ok = ok && origin[a] + CB::offset(col, a) < tile.len[a];  // (origins are real)
        rel = rel * unsigned(p.spatial[a]) + unsigned(p.dilation[a] * CB::offset(col, a));
      }
      const unsigned at = rel * unsigned(p.heads);
      ld[col] = ok ? lse_log2(lse_box[at]) : INFINITY;
      ld[kNq + col] = ok ? delta_box[at] : 0.f;
    }
    mbar_arrive(ld_full + s);
  }
}

// dRPB of one dK/dV step from its 16-bit dS^T (a lane's two key rows, whose RPB index parts
// are rpb0 / rpb1, against the query box CB at `origin`; masked scores have P = 0, so dS = 0
// exactly and add nothing): into the staged table in fixed point (`fixed`, after the
// deterministic dQ pass recorded the head's largest |dS|) or float32 (`staged`), else into
// the global gradient. Query head h, the hg-th of its KV head.
template <typename T, int NA, class CB>
__device__ __forceinline__ void add_drpb(const Params& p, const uint32_t (&ds_t)[CB::kSize / 16][4], int rpb0, int rpb1,
                                         const int* origin, const int* rpb_mult, int t4, int hg, int h, bool fixed,
                                         bool staged, float* drpb_smem) {
  const float fixed_scale = fixed ? drpb_fixed_scale(p.drpb_max[h], kDrpbFixedBits) : 0.f;
#pragma unroll
  for (int i = 0; i < CB::kSize / 2; i += 2) {
    const float2 ds = unpack2<T>(ds_t[i / 8][(i % 8) / 2]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float v = e ? ds.y : ds.x;
      if (v == 0.f) continue;
      const int col = 8 * (i / 4) + 2 * t4 + e;
      int ridx = (i / 2) % 2 ? rpb1 : rpb0;
#pragma unroll
      for (int a = 0; a < NA; ++a) ridx -= (origin[a] + CB::offset(col, a)) * rpb_mult[a];
      if (fixed)  // native integer atomic, no CAS loop
        atomicAdd(reinterpret_cast<int*>(drpb_smem) + hg * p.rpb_head_size + ridx, __float2int_rn(v * fixed_scale));
      else if (staged) atomicAdd(drpb_smem + hg * p.rpb_head_size + ridx, v);  // one address
      else atomicAdd(p.drpb + int64_t(h) * p.rpb_head_size + ridx, v);        // space each
    }
  }
}

// DQ_ATOMIC: also dQ, KV-parallel. Both warpgroups write their dS^T to shared memory; each
// then computes dQ_box = dS K over the CTA's 128 keys for half of the channels (wgmma, both
// operands MN-major), stages it in shared memory and adds it into Params::dq_accum (fp32,
// [B, *spatial, H, D]) with one bulk tensor reduction of the copy engine (map_dq).
template <typename T, int NA, int HD, class Tl, bool DQ_ATOMIC>
__global__ void __launch_bounds__(DkvCta<T, NA, Tl, HD, DQ_ATOMIC>::kThreads, DkvCta<T, NA, Tl, HD, DQ_ATOMIC>::kMinBlocks)
    backward_dkv_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_k,
                        const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_q,
                        const __grid_constant__ CUtensorMap map_do, const __grid_constant__ CUtensorMap map_dq) {
#if NATTN_SM90_ENABLED
  using RB = typename Tl::Q;  // the CTA's keys
  using CB = typename Tl::K;  // a query box
  constexpr int kNq = CB::kSize;
  using Cta = DkvCta<T, NA, Tl, HD, DQ_ATOMIC>;
  constexpr bool kSplit = Cta::kSplit;
  constexpr int kConsumerThreads = Cta::kConsumerThreads;
  using S = DkvSmem<HD, kNq, DQ_ATOMIC, Cta::kRows>;
  // (a staged dRPB table adds to this at launch: large ones leave one split CTA an SM)
  static_assert(!kSplit || 2 * (S::kAllocFixed + kSmemReservedPerCta) <= kSmemPerSm, "two split dK/dV CTAs an SM");
  using R = typename S::Rows;
  using C = typename S::Cols;
  constexpr int kRank = NA + 2;
  // Register split between the producer and consumer warpgroups (setmaxnreg).
  // (Not where query boxes are deeper than one frame, the 4x4x8 / 2x4x8 pair: with it the
  // consumers' shifted dK product spilled 8 bytes, and the LSE / delta warp at 24 registers.)
  constexpr bool kWideRegs = NATTN_SM90_DKV_WIDE_REGS && !DQ_ATOMIC && NA == 3 && HD == 128 && CB::extent(0) == 1;
  using Regs = typename std::conditional<
      kSplit, typename std::conditional<Cta::kTightRegs, RegisterSplit<32, 224, 1>, RegisterSplit<40, 216, 1>>::type,
      typename std::conditional<kWideRegs, RegisterSplit<24, 240>, DefaultRegisterSplit>::type>::type;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* kv_full = bars;
  uint64_t* qd_full = bars + 1;
  uint64_t* ld_full = bars + 1 + S::kStages;
  uint64_t* empty = bars + 1 + 2 * S::kStages;
  uint64_t* ld_empty = bars + 1 + 3 * S::kStages;
  uint64_t* ds_full = bars + 1 + 4 * S::kStages;  // KV-parallel dQ: a dS^T set written (both warpgroups)
  uint64_t* ds_free = ds_full + 2;                // ... and read by both warpgroups' dQ products
  uint64_t* dq_full = ds_free + 2;                // a warpgroup's dQ staged (for the writer warp)
  uint64_t* dq_empty = dq_full + 2;               // ... and read by its reduction
  float* drpb_smem = reinterpret_cast<float*>(smem + S::kDrpb);

  CtaTile tile;
  if (!cta_tile_inverse<NA, RB, CB>(p, kSplit ? blockIdx.x / 2 : blockIdx.x, tile)) return;  // uniform over the CTA
  // kSplit: the CTA's half of the key box (none past the dilation group's end)
  const int half = kSplit ? int(blockIdx.x % 2) : 0;
  if (kSplit && tile.q0[0] + half * Cta::Half::extent(0) >= tile.len[0]) return;
  if (kSplit && NATTN_SM90_SPLIT_OWN_WALK) narrow_to_half<NA, RB, CB, true>(p, tile, half);
  const int h_kv = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = warpgroup_index();
  const int steps = tile.tiles * p.groups;  // (query head, query box) pairs
  // 96-query boxes (the 16x8 / 4x24 pair) leave no registers for the RPB paths (prepare_backward
  // declines an RPB: with them the 2-D head-dim-64 instance spilled), the shifted dK product
  // or the LSE preload below (with those, spills or serialized wgmma, C7512; the preload at
  // 32 / 224 registers compiled clean but ran mid-2d 2% slower: PERF.md forty-eighth session).
  constexpr bool kWideCols = kNq > kWgRows;
  constexpr bool kRpb = !kWideCols;
  const bool stage_rpb = kRpb && p.rpb != nullptr && p.rpb_in_smem;
  // After the deterministic dQ pass a staged table is in fixed point (32-bit integers; the
  // launcher stages it only with the workspace); the KV-parallel dQ mode stages float32.
  const bool fixed = stage_rpb && !DQ_ATOMIC;
  // The staged table's entries: held from the prologue to the epilogue, the 64-bit count
  // spilled in the 4x4x8 / 2x4x8 pair's head-dim-32 instance, which counts in 32 bits (a
  // table staged in shared memory is small); a 32-bit count made other instances spill.
  using TableLen = typename std::conditional<(NA == 3 && HD <= 32 && CB::extent(0) > 1), int, int64_t>::type;
  const TableLen rpb_len = TableLen(int64_t(p.groups) * p.rpb_head_size);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_do);
    mbar_init(kv_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(qd_full + s, 1);
      mbar_init(ld_full + s, 32);  // every lane of the LSE / delta warp
      mbar_init(empty + s, kConsumerThreads / 32);  // one arrival per consumer warp
      mbar_init(ld_empty + s, kConsumerThreads);    // every consumer thread, after its last read of the stage's rows
    }
    for (int set = 0; set < 2; ++set) {
      mbar_init(ds_full + set, 256);  // every consumer thread, after its dS^T stores
      mbar_init(ds_free + set, 256);  // every consumer thread, once its dQ product read the set
      mbar_init(dq_full + set, 128);  // [warpgroup]: its every thread, after its staging stores
      mbar_init(dq_empty + set, 1);   // [warpgroup]: the writer, once the reduction read the staging
    }
    fence_barrier_init();
  }
  if (stage_rpb)
    for (TableLen i = threadIdx.x; i < rpb_len; i += Cta::kThreads) drpb_smem[i] = 0.f;
  __syncthreads();

  // Steps a warpgroup's keys are not seen from (seen_steps; one query head per KV head: with
  // several the walk repeats per head): kSplit loads only the others, else they are released.
  // The KV-parallel dQ computes every step: it needs both warpgroups' dS^T of each, zeros
  // included. Not in 1-D: 1 box in 34 at the 2048-key anchor, and the second loop bound made
  // the bf16 head-dim-128 instance spill.
  auto seen = [&](int cw, int& first_step, int& last_step) {
    first_step = 0, last_step = steps;
    if (!DQ_ATOMIC && NA > 1 && p.groups == 1) seen_steps<RB, CB, true>(p, tile, cw, first_step, last_step);
  };
  if (wg == 0) {  // ------------------------------------------------ producers
    regs_dealloc<Regs::kProducer>();
    int from = 0, to = steps;
    if (kSplit) seen(half, from, to);
    if (warp == 0 && lane == 0) {
      produce_dkv_rows<NA, HD, typename Cta::Half, CB, R, C, S::kStages>(
          p, tile, h_kv, b, half, from, to, smem + S::kK, smem + S::kV, smem + S::kQ, smem + S::kDo, &map_k, &map_v,
          &map_q, &map_do, kv_full, qd_full, empty);
    } else if (warp == 1) {
      produce_lse_delta<NA, CB, S::kStages>(p, tile, h_kv, b, from, to, lane, reinterpret_cast<float*>(smem + S::kLd),
                                            ld_full, ld_empty);
    } else if (DQ_ATOMIC && warp == 2 && lane == 0) {  // the dQ writer: each step's staged
      using St = DqStage<HD>;                           // dQ into Params::dq_accum
      BoxWalk<NA, CB> walk(tile);  // step it: query head h_kv * groups + walk.pass
      for (int it = 0; it < steps; ++it, walk.next(tile)) {
        const int h = h_kv * p.groups + walk.pass;
        const int* origin = walk.origin;
        int c[5];
        for (int cw = 0; cw < 2; ++cw) {
          mbar_wait(dq_full + cw, it & 1);
          const unsigned char* stage = smem + S::kDqStage + cw * St::kBytes;
#pragma unroll
          for (int j = 0; j < St::kBoxes; ++j) {
            box_coords<NA>(p, tile, origin, h * HD + cw * (HD / 2) + j * St::kInner, b, c);
            tma_reduce_add<kRank>(&map_dq, stage + j * St::kBoxBytes, c);
          }
          bulk_commit();
        }
        bulk_wait_read<1>();
        mbar_arrive(dq_empty + 0);
        bulk_wait_read<0>();
        mbar_arrive(dq_empty + 1);
      }
      bulk_wait<0>();  // the reductions are done before the CTA ends
    }
  } else {  // ------------------------------------------------------- consumers
    regs_alloc<Regs::kConsumer>();
    const int cw = kSplit ? half : wg - 1;  // the half of the key box: key rows 64 cw ..
    const int row0 = kSplit ? 0 : cw * kWgRows;  // its first row in the K and V tiles
    const int wr = (warp % 4) * 16;
    const int g4 = lane / 4, t4 = lane % 4;

    // The lane's two key rows: validity, the queries that see them (per axis), the key's
    // part of the RPB index (k - 1 - query + key per axis; the query part comes per score).
    // At 3-D each bound pair is packed into one register as two 16-bit halves (axes of at
    // most 32767 tokens, prepare_backward checks): with dK, dV, S^T and dP^T live, the twelve
    // plain bounds spilled.
    constexpr bool kPacked = NA == 3;
    int range[2][3][kPacked ? 1 : 2];
    auto set_range = [&](int r, int a, int lo, int hi) {
      if constexpr (kPacked) range[r][a][0] = (lo & 0xffff) | (hi << 16);
      else range[r][a][0] = lo, range[r][a][kPacked ? 0 : 1] = hi;
    };
    auto lo_of = [&](int r, int a) { return kPacked ? range[r][a][0] & 0xffff : range[r][a][0]; };
    auto hi_of = [&](int r, int a) { return kPacked ? range[r][a][0] >> 16 : range[r][a][kPacked ? 0 : 1]; };
    struct { int rpb; } row[2];
    bool row_ok[2];
    int rpb_mult[3] = {1, 1, 1};
    for (int a = NA - 2; a >= 0; --a) rpb_mult[a] = rpb_mult[a + 1] * p.rpb_size[a + 1];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int kr = cw * kWgRows + wr + g4 + 8 * r;
      row_ok[r] = true;
      row[r].rpb = 0;
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        const int j = tile.q0[a] + RB::offset(kr, a);
        row_ok[r] = row_ok[r] && j < tile.len[a];
        const int jc = nattn_min(j, tile.len[a] - 1);
        const AxisRange inv = key_inverse(jc, tile.len[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
        set_range(r, a, inv.start, inv.start + inv.count - 1);
        row[r].rpb += (p.kernel[a] - 1 + jc) * rpb_mult[a];
      }
    }
    // Query boxes whose every query sees every key of this warpgroup need no mask. At 3-D the
    // bounds of their origins packed as two 16-bit halves per axis, as the key rows' ranges
    // (the upper one may be negative: arithmetic shifts), which the 4x4x8 / 2x4x8 pair at head
    // dim 128 needed to keep its step loop free of spills.
    int full_lo[3], full_hi[3], full_box[3];
    unmasked_boxes<NA, RB, true, true>(p, tile, cw, full_lo, full_hi);
    if constexpr (kPacked) {
#pragma unroll
      for (int a = 0; a < NA; ++a) full_box[a] = (full_lo[a] & 0xffff) | ((full_hi[a] - (CB::extent(a) - 1)) << 16);
    }

    float dk[HD / 2], dv[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) dk[i] = dv[i] = 0.f;
    const bool has_rpb = kRpb && p.rpb != nullptr;
    const bool late_dp = has_rpb || HD == 128;
    const unsigned char* k_tile = smem + S::kK;
    const unsigned char* v_tile = smem + S::kV;
    mbar_wait(kv_full, 0);

    // KV-parallel dQ (DQ_ATOMIC): dQ[64 queries, this warpgroup's HD / 2 channels] =
    // dS[queries, the CTA's 128 keys] K[keys, channels], over both warpgroups' dS^T of a step
    // (two sets, steps alternating), staged in shared memory; the writer warp adds it into
    // Params::dq_accum (one bulk tensor reduction per box of St::kInner channels).
    using Ds = typename S::DsTile;
    using St = typename S::Stage;
    auto write_ds = [&](int set, const uint32_t (&ds)[kNq / 16][4]) {
      unsigned char* dst = smem + S::kDs + (set * 2 + cw) * Ds::kBytes;
#pragma unroll
      for (int i = 0; i < kNq / 2; i += 2) {
        const int r = (i / 2) % 2, kr = wr + g4 + 8 * r, col = 8 * (i / 4) + 2 * t4;
        // padding key rows are 0 here: their unmasked P could overflow (their K rows are 0)
        *reinterpret_cast<uint32_t*>(dst + Ds::offset(kr, col)) = row_ok[r] ? ds[i / 8][(i % 8) / 2] : 0u;
      }
      fence_proxy_async_smem();
      mbar_arrive(ds_full + set);
    };
    // A step's dQ product, once both warpgroups' dS^T of it are written, into the staging
    // once the writer warp's reduction of the previous step has read it.
    auto dq_product = [&](int step) {
      const int set = step % 2;
      const unsigned char* tiles = smem + S::kDs + set * 2 * Ds::kBytes;
      unsigned char* stage = smem + S::kDqStage + cw * St::kBytes;
      mbar_wait(ds_full + set, (step / 2) & 1);
      if (step >= 1) mbar_wait(dq_empty + cw, (step - 1) & 1);
      float dq[HD / 4];
      const int ch = cw * (HD / 2);  // the channel block, then the offset inside its swizzled rows
      const unsigned char* k_part = k_tile + (ch / R::kChannels) * R::kBlockBytes + (ch % R::kChannels) * 2;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQueryRows / 16; ++kk)
        wgmma_ss_tt<T, HD / 2>(dq, Ds::mn_major(tiles + (kk / 4) * Ds::kBytes, kk % 4),
                               smem_desc<R::kRowBytes>(k_part, R::kBlockBytes, 8 * R::kRowBytes,
                                                       16 * kk * R::kRowBytes),
                               kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dq);
#pragma unroll
      for (int i = 0; i < HD / 4; i += 2) {
        const int qr = wr + g4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t4;
        *reinterpret_cast<float2*>(stage + St::offset(qr, col)) = make_float2(dq[i], dq[i + 1]);
      }
      mbar_arrive(ds_free + set);
      fence_proxy_async_smem();
      mbar_arrive(dq_full + cw);
    };

    // Query boxes none of whose queries see this warpgroup's keys: only released, their copies
    // waited for as in the dQ pass (kSplit: not loaded; box it is in ring step it - ring0).
    int first_step, last_step;
    seen(cw, first_step, last_step);
    const int ring0 = kSplit ? first_step : 0;
    auto release_stage = [&](int it) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + (it - ring0) % S::kStages);  // the stage's Q and dO are read
    };
    auto release_only = [&](int it) {
      const int s = it % S::kStages, phase = (it / S::kStages) & 1;
      mbar_wait(qd_full + s, phase);
      mbar_wait(ld_full + s, phase);
      mbar_arrive(ld_empty + s);
      release_stage(it);
    };
    // kDeferDk: a step's dK product is waited for only once the next step's S^T is issued, so
    // that S^T follows dK on the tensor pipe instead of after this warpgroup's wait (a step is
    // one dependent chain: S^T -> P^T -> dV, dP^T -> dS^T -> dK); the step's Q / dO stage is
    // released then. dK (and its A operand, dS^T) stay in flight across the loop's back edge:
    // their registers are the same in every step, so ptxas keeps the products pipelined (an
    // S^T issued at the end of a step was not: C7515). Not with the KV-parallel dQ, whose
    // staging and products read dS^T after dK. 2-D at head dim 128 only: the 1-D and 3-D
    // instances (every head dim) made ptxas serialize every wgmma of the kernel
    // ("insufficient register resources for the wgmma pipeline", C7511), and at head dim 64
    // kShiftDk measured faster (PERF.md, twenty-third session).
    constexpr bool kDeferDk = NATTN_SM90_DKV_DEFER_DK && !DQ_ATOMIC && NA == 2 && HD == 128;
    // kShiftDk (1-D, 2-D up to head dim 64, 3-D at 64 and, with kWideRegs, 128): step it
    // issues its S^T, then step it - 1's dK product (dS^T kept in da_prev), and computes P^T
    // while that product runs, as the dQ pass does with dQ (backward_dq.cuh); every product
    // is waited for inside its step. Not in 3-D at head dim 32 (spills), nor at 128 in 232
    // registers (spills; in 2-D kDeferDk instead).
    constexpr bool kShiftDk = NATTN_SM90_DKV_SHIFT_DK && !DQ_ATOMIC && !kDeferDk && (NA < 3 || HD == 64 || kWideRegs) &&
                              !kWideCols;
    uint32_t pa[kNq / 16][4], da[kNq / 16][4], da_prev[kShiftDk ? kNq / 16 : 1][4];
    auto issue_dk = [&](int it, const uint32_t (&a)[kNq / 16][4]) {
      const unsigned char* q_tile = smem + S::kQ + ((it - ring0) % S::kStages) * C::kBytes;
#pragma unroll
      for (int kk = 0; kk < kNq / 16; ++kk) wgmma_rs<T, HD>(dk, a[kk], C::mn_major(q_tile, kk), 1);
      wgmma_commit();
    };
    // kDvLast: dP^T's product first, in its own group, so that dS^T is computed while dV's
    // runs (head dim 128, where dP^T is issued late).
    constexpr bool kDvLast = !DQ_ATOMIC && HD == 128 && ((NATTN_SM90_DKV_DV_LAST >> (NA - 1)) & 1) != 0;
    BoxWalk<NA, CB> walk(tile);  // step it: query head h_kv * groups + walk.pass, box it % tiles
    for (int it = 0; it < first_step; ++it, walk.next(tile))
      if (!kSplit) release_only(it);
    for (int it = first_step; it < last_step; ++it, walk.next(tile)) {
      const int s = (it - ring0) % S::kStages, phase = ((it - ring0) / S::kStages) & 1;
      const int hg = walk.pass, h = h_kv * p.groups + hg;
      const unsigned char* q_tile = smem + S::kQ + s * C::kBytes;
      const unsigned char* do_tile = smem + S::kDo + s * C::kBytes;
      const float* ld = reinterpret_cast<const float*>(smem + S::kLd) + s * 2 * kNq;
      float st[kNq / 2], dpt[kNq / 2];
      // dP^T = V dO^T, issued.
      auto issue_dp = [&](float (&acc)[kNq / 2], const unsigned char* dot) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
          wgmma_ss<T, kNq>(acc, R::k_major(v_tile, row0, kk), C::k_major(dot, 0, kk), kk > 0);
      };
      mbar_wait(qd_full + s, phase);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        wgmma_ss<T, kNq>(st, R::k_major(k_tile, row0, kk), C::k_major(q_tile, 0, kk), kk > 0);
      // dP^T with S^T, or (late_dp) only once P^T is packed: with the general RPB mask, or
      // at head dim 128, S^T, dP^T, dK and dV left too few registers (spills).
      if (!late_dp) issue_dp(dpt, do_tile);
      wgmma_commit();
      const bool dk_behind = kShiftDk && it > first_step;
      if (kDeferDk && it > first_step) {
        wgmma_wait<1>();  // the previous step's dK product is done; S^T may still run
        fence_regs(dk);
        fence_regs(da);
        release_stage(it - 1);
      }
      if (dk_behind) {
        if constexpr (kShiftDk) issue_dk(it - 1, da_prev);
        wgmma_wait<1>();  // S^T (and dP^T) are in; the previous step's dK product may still run
      } else if (kShiftDk && kDvLast) {
        // an empty group in the previous dK product's place: the same wait counts on every
        // path (with two, ptxas serialized the kernel's wgmma, C7514)
        wgmma_commit();
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      fence_regs(st);
      fence_regs(dpt);
      mbar_wait(ld_full + s, phase);
      // The LSE (log2) of the lane's query columns col(i) = 8 (i / 4) + 2 t4 + i % 2, in 8-byte
      // loads once per step (per score, the masked paths loaded each of them twice); not in
      // 3-D at head dim 128, where the 16 registers made the kernel spill.
      constexpr bool kPreload = !(NA == 3 && HD >= 128) && !kWideCols;
      float2 lse_c[kNq / 8];
      if constexpr (kPreload) {
#pragma unroll
        for (int j = 0; j < kNq / 8; ++j) lse_c[j] = *reinterpret_cast<const float2*>(ld + 8 * j + 2 * t4);
      }
      auto lse_of = [&](int i) {
        if constexpr (kPreload) return i % 2 ? lse_c[i / 4].y : lse_c[i / 4].x;
        else return ld[8 * (i / 4) + 2 * t4 + i % 2];
      };

      const int* origin = walk.origin;
      bool full = true;
#pragma unroll
      for (int a = 0; a < NA; ++a)
        if constexpr (kPacked) full = full && origin[a] >= (full_box[a] & 0xffff) && origin[a] <= full_box[a] >> 16;
        else full = full && origin[a] >= full_lo[a] && origin[a] + CB::extent(a) - 1 <= full_hi[a];
      // P^T first, so that dV += P^T dO runs while dS^T is computed.
      if (full && !has_rpb) {
#pragma unroll
        for (int i = 0; i < kNq / 2; ++i) st[i] = fast_exp2(fmaf(st[i], p.scale_log2, -lse_of(i)));
      } else if (!has_rpb) {  // padding key rows need no mask here: they are never stored
        int lo0[3], hi0[3], lo1[3], hi1[3];
#pragma unroll
        for (int a = 0; a < NA; ++a) lo0[a] = lo_of(0, a), hi0[a] = hi_of(0, a), lo1[a] = lo_of(1, a), hi1[a] = hi_of(1, a);
        const RowPairMask<NA, CB> mask(lo0, hi0, lo1, hi1, origin, t4);
#pragma unroll
        for (int i = 0; i < kNq / 2; ++i) {
          // (2-D with 64-query boxes keeps the predicated form: there the select took ~90 more
          // instructions and spilled at head dim 64, sass_diff)
          if constexpr (NA == 2 && !kWideCols)
            st[i] = mask.in(i) ? fast_exp2(fmaf(st[i], p.scale_log2, -lse_of(i))) : 0.f;
          else
            st[i] = kept(mask.in(i), fast_exp2(fmaf(st[i], p.scale_log2, -lse_of(i))));
        }
      } else {  // RPB: the general test (padding key rows excluded: they would reach dRPB)
        const float* rpb = p.rpb + int64_t(h) * p.rpb_head_size;
#pragma unroll
        for (int i = 0; i < kNq / 2; ++i) {
          const int r = (i / 2) % 2;
          const int col = 8 * (i / 4) + 2 * t4 + (i % 2);
          bool in = row_ok[r];
          int ridx = row[r].rpb;
#pragma unroll
          for (int a = 0; a < NA; ++a) {
            const int q = origin[a] + CB::offset(col, a);
            in = in && q >= lo_of(r, a) && q <= hi_of(r, a);
            ridx -= q * rpb_mult[a];
          }
          const float x = st[i] * p.scale_log2 + (in ? __ldg(rpb + ridx) * kLog2e : 0.f);
          st[i] = in ? fast_exp2(x - lse_of(i)) : 0.f;
        }
      }
#pragma unroll
      for (int i = 0; i < kNq / 2; i += 2) pa[i / 8][(i % 8) / 2] = pack2<T>(st[i], st[i + 1]);
      // dS^T = P^T (dP^T - delta), packed as dK's A operand; at head dim 128 with P^T back from
      // its 16-bit copy (an fp32 one would not fit in registers next to dK and dV).
      auto ds_packed = [&]() {
#pragma unroll
        for (int i = 0; i < kNq / 2; i += 2) {
          const float2 pr = HD >= 128 ? unpack2<T>(pa[i / 8][(i % 8) / 2]) : make_float2(st[i], st[i + 1]);
          const float2 dl = *reinterpret_cast<const float2*>(ld + kNq + 8 * (i / 4) + 2 * t4);  // delta
          dpt[i] = pr.x * (dpt[i] - dl.x);
          dpt[i + 1] = pr.y * (dpt[i + 1] - dl.y);
        }
#pragma unroll
        for (int i = 0; i < kNq / 2; i += 2) da[i / 8][(i % 8) / 2] = pack2<T>(dpt[i], dpt[i + 1]);
      };
      // With dP^T in (!late_dp), dS^T before dV's product is issued: read while a product
      // was in flight, the S^T / dP^T accumulators made ptxas serialize every wgmma of the
      // kernel (C7514); dV's and dK's products then run back to back.
      // (kShiftDk: after dV's product, whatever late_dp: beside the previous step's dK product
      // in flight, the 16-bit dS^T written here made ptxas serialize the kernel's wgmma, C7515)
      if (!late_dp && !kShiftDk) ds_packed();
      wgmma_fence();
      if constexpr (kDvLast) {
        issue_dp(dpt, do_tile);
        wgmma_commit();
      }
#pragma unroll
      for (int kk = 0; kk < kNq / 16; ++kk) wgmma_rs<T, HD>(dv, pa[kk], C::mn_major(do_tile, kk), 1);
      if (late_dp && !kDvLast) issue_dp(dpt, do_tile);
      wgmma_commit();
      // (kShiftDk: also dV's product, not in flight across steps; with kDvLast after dS^T, below)
      if (late_dp || kShiftDk) {
        if constexpr (kDvLast) wgmma_wait<1>();
        else wgmma_wait<0>();
        fence_regs(dpt);
      }
      if (dk_behind) {
        fence_regs(dk);
        if constexpr (kShiftDk) fence_regs(da_prev);
        release_stage(it - 1);
      }
      if (late_dp || kShiftDk) ds_packed();
      if constexpr (kDvLast && kShiftDk) {  // dV's product is done before dS^T moves to da_prev
        wgmma_wait<0>();                    // (in flight into the next step, ptxas serialized
        fence_regs(dv);                     // the kernel's wgmma in 1-D, C7514)
        fence_regs(pa);
      }
      mbar_arrive(ld_empty + s);  // this thread's reads of the LSE / delta rows are done
      if constexpr (kShiftDk) {
#pragma unroll
        for (int i = 0; i < kNq / 16; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) da_prev[i][j] = da[i][j];
      } else {
        wgmma_fence();
        issue_dk(it, da);
      }
      if (!kDeferDk && !kShiftDk) {
        wgmma_wait<0>();
        fence_regs(dk);
        fence_regs(da);
        release_stage(it);
      }
      fence_regs(dv);
      fence_regs(pa);
      if constexpr (DQ_ATOMIC) {
        // This step's dS^T into its set, then the previous step's dQ product (deferred by a
        // step, so that a warpgroup waits for the other one's dS^T only when it is a whole
        // step ahead). Writing dS^T while dK's product runs spilled registers in fp16.
        if (it >= 2) mbar_wait(ds_free + it % 2, ((it / 2) - 1) & 1);
        write_ds(it % 2, da);
        if (it >= 1) dq_product(it - 1);
      }
      if (has_rpb) add_drpb<T, NA, CB>(p, da, row[0].rpb, row[1].rpb, origin, rpb_mult, t4, hg, h, fixed, stage_rpb, drpb_smem);
    }
    if ((kDeferDk || kShiftDk) && last_step > first_step) {  // the last step's dK product
      if constexpr (kShiftDk) {
        wgmma_fence();
        issue_dk(last_step - 1, da_prev);
      }
      wgmma_wait<0>();
      fence_regs(dk);
      release_stage(last_step - 1);
    }
    if (!kSplit)
      for (int it = last_step; it < steps; ++it) release_only(it);

    if constexpr (DQ_ATOMIC) {
      if (steps > 0) {  // the last step's dQ, then its reduction finishes before the CTA goes
        dq_product(steps - 1);
        // The dK / dV stores below overwrite the K rows that both warpgroups' dQ products read.
        named_sync(3, 256);
      }
    }
    // dK * scale and dV through the warpgroup's own K and V rows, then whole-row stores.
    unsigned char* stage_k = smem + S::kK;
    unsigned char* stage_v = smem + S::kV;
#pragma unroll
    for (int i = 0; i < HD / 2; i += 2) {
      const int kr = row0 + wr + g4 + 8 * ((i / 2) % 2);
      const int col = 8 * (i / 4) + 2 * t4;
      *reinterpret_cast<uint32_t*>(stage_k + R::offset(kr, col)) = pack2<T>(dk[i] * p.scale, dk[i + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(stage_v + R::offset(kr, col)) = pack2<T>(dv[i], dv[i + 1]);
    }
    named_sync(1 + cw, 128);
    T* out_k = head_base<T>(p.dk, p.dk_s, b, h_kv);
    T* out_v = head_base<T>(p.dv, p.dv_s, b, h_kv);
    constexpr int kChunks = HD / 8;
    for (int idx = threadIdx.x - 128 * wg; idx < kWgRows * kChunks; idx += 128) {
      const int kr = cw * kWgRows + idx / kChunks, ch = idx % kChunks;
      int64_t off_k, off_v;
      const bool ok = box_row_offset<NA, RB>(p, tile, tile.q0, kr, p.dk_s, off_k);
      box_row_offset<NA, RB>(p, tile, tile.q0, kr, p.dv_s, off_v);
      const int sr = row0 + idx / kChunks;  // its row in the staging
      if (ok) {
        *reinterpret_cast<uint4*>(out_k + off_k + ch * 8) = *reinterpret_cast<const uint4*>(stage_k + R::offset(sr, ch * 8));
        *reinterpret_cast<uint4*>(out_v + off_v + ch * 8) = *reinterpret_cast<const uint4*>(stage_v + R::offset(sr, ch * 8));
      }
    }
    if (fixed) {  // the consumers' staged dRPB into the int64 table (producers have left)
      named_sync(5, kConsumerThreads);
      drpb_fixed_add(p, h_kv, reinterpret_cast<const int*>(drpb_smem), rpb_len, threadIdx.x - 128, kConsumerThreads);
    } else if (stage_rpb) {  // ... or into the float32 gradient
      named_sync(5, kConsumerThreads);
      float* dst = p.drpb + int64_t(h_kv) * p.groups * p.rpb_head_size;
      for (TableLen i = threadIdx.x - 128; i < rpb_len; i += kConsumerThreads)
        if (drpb_smem[i] != 0.f) atomicAdd(dst + i, drpb_smem[i]);
    }
  }
#endif
}

}  }  // namespace nattn::sm90
