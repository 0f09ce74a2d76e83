// Hopper (sm_90a) fused NA forward: TMA loads, wgmma products, warp specialization.
//
// A CTA serves one query box (tiles.cuh) of one (batch, head):
//   the producer, one thread: it loads the query box once and then the key and value
//     boxes covering the union of the queries' windows, each with one bulk tensor copy
//     per 64 channels into a ring of shared-memory slots; the copies complete on the
//     slot's "full" mbarriers, and the producer waits on the slot's "empty" mbarrier
//     before reusing it.
//   one or two consumer warpgroups, 64 queries each. Per key box: S = Q K^T (wgmma, both
//     operands in shared memory), the window mask (only on boxes that are not inside every
//     query's window) and RPB, online softmax in the accumulator registers, then
//     O += P V (wgmma, P from registers). Finally O / l and the LSE are written.
// Large windows use 128-query boxes: a producer warpgroup (registers handed to the
// consumers with setmaxnreg) and two consumer warpgroups that take turns issuing, one CTA
// per SM. Small windows use 64-query boxes: one consumer warpgroup that feeds its own
// two-slot ring (or, on two pairs, a producer warp), and several CTAs per SM hide each
// other's latencies.
// Dilation is the tensor maps' element stride (docs/kernels.md), so the copy engine
// gathers a dilation group directly; boxes reaching past the tensor are zero-filled.
#pragma once
#include <cuda.h>
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/common/softmax.cuh"
#include "nattn/common/window.cuh"
#include "nattn/sm90/forward_masks.cuh"
#include "nattn/sm90/ptx.cuh"
#include "nattn/sm90/smem_tile.cuh"
#include "nattn/sm90/tensor_map_spec.h"
#include "nattn/sm90/tiles.cuh"
#include "nattn/sm90/wgmma_ops.cuh"

// Build switch: 1 (default; 3% faster on 13x13 / 15x15 2-D windows, PERF.md twenty-fourth
// session) pipelines a 64-query CTA's key boxes of <= 96 keys (S of a box issued with P V of
// the previous one); 0 runs them one after the other (S and P never live at once).
#ifndef NATTN_SM90_LONE_PIPELINED
#define NATTN_SM90_LONE_PIPELINED 1
#endif
// Build switch: 1 has a 64-query CTA's consumer warpgroup feed its own ring (its thread 0
// issues the copies of a slot once the warpgroup has read it: 128 threads, so one more CTA
// per SM fits the registers: 4 at head dim 32, 3 at 64); 0 gives it a producer warp (160
// threads: 3 and 2 CTAs per SM).
#ifndef NATTN_SM90_LONE_FEED
#define NATTN_SM90_LONE_FEED 1
#endif

namespace nattn { namespace sm90 {

constexpr int kThreads = 384;  // 128-query CTAs: producer warpgroup + two consumer warpgroups

// The CTA of a tile pair at head dim HD: threads, the CTAs per SM its register budget is
// sized for, and the ring depth. 64-query CTAs (128 threads, a self-fed consumer
// warpgroup; 160 with a producer warp where the self-fed loop spills) keep registers (<= 128
// at head dim 32, <= 168 at 64) and shared memory low enough for four or three per SM (three
// or two with the producer warp): small windows are bound by the latency of each CTA's short
// chain of products and softmax, which other CTAs hide (PERF.md sixth session: persistent
// CTAs, which need more registers, ran no faster; twenty-ninth session: one more CTA per SM
// made the 64-query forwards 6-16% faster). A small window's CTA walks only a few key boxes,
// so two slots suffice.
template <class Tl, int HD>
struct ForwardCta {
  static constexpr int kConsumers = Tl::kConsumers;
  // A 64-query CTA pipelines its boxes where its registers allow (key boxes of at most 96
  // keys: with 112 and 128 the S of one box beside the P of the previous one spilled).
  static constexpr bool kLonePipelined = kConsumers == 1 && NATTN_SM90_LONE_PIPELINED && Tl::K::kSize <= 96;
  // Self-fed (no producer warp) where the tighter register cap still holds the kernel: the
  // pipelined loop spilled at 128 registers in 2-D at head dim 32 and at 168 in 3-D at 64.
  static constexpr bool kThreeD = Tl::Q::extent(1) > 1 && Tl::Q::extent(2) > 1;
  static constexpr bool kSelfFed = kConsumers == 1 && NATTN_SM90_LONE_FEED &&
                                   !(kLonePipelined && (kThreeD ? HD == 64 : HD <= 32));
  static constexpr int kThreads = kConsumers == 2 ? 384 : kSelfFed ? 128 : 160;
  static constexpr int kMinBlocks = kConsumers == 2 ? 1 : (HD <= 32 ? 3 : 2) + (kSelfFed ? 1 : 0);
  // Head dim 256 (64-key boxes only): two stages keep the 64 KB query box and the ring
  // within a block's shared memory.
  static constexpr int kStages = kConsumers == 2 && HD <= 128 ? 3 : 2;
  // Split-KV (tiles.cuh, split_kv_built): its partial rows are box-local, so the epilogue
  // needs no token math (with global row indices it spilled in the 2-D / 3-D CTAs).
  static constexpr bool kSplitKv = split_kv_built(Tl::Q::extent(0), Tl::Q::extent(1), Tl::Q::extent(2), HD);
  // 64-query CTAs read the RPB of their head from shared memory (global loads of every
  // score's bias cost a register each: the kernel spilled).
  static constexpr int kRpbStageFloats = kConsumers == 2 ? 0 : kSmallRpbStageFloats;
  // Each consumer warpgroup may write its 64 rows of the output box with bulk tensor copies
  // (Params::out_map; the map's box is a warpgroup's share: the whole 64-query box, or half
  // a 128-query box along axis 0), but not the 1-D 64-query CTAs at head dim 32 (they sit at
  // their 128-register cap, and with the second epilogue path ptxas serialized their wgmma:
  // C7512, fp16) nor 128-query CTAs above head dim 64 (their walks are long; FLUX GNA ran
  // 1.4% slower with it, HunyuanVideo GNA 1% faster: PERF.md forty-first session).
  static constexpr bool kOutMap = kConsumers == 1 ? !(Tl::Q::extent(1) == 1 && HD <= 32) : HD <= 64;
  // The output map's box along axis 0.
  static constexpr int kOutRows0 = Tl::Q::extent(0) / kConsumers;
};

// Shared memory of the forward: the query box's rows, then a ring of STAGES key / value
// boxes (TileSmem layouts), then the mbarriers.
template <int HD, int QROWS, int NK, int STAGES>
struct FwdSmem {
  using Rows = TileSmem<HD, QROWS>;
  using Cols = TileSmem<HD, NK>;
  static constexpr int kStages = STAGES;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + Rows::kBytes;
  static constexpr int kV = kK + kStages * Cols::kBytes;
  static constexpr int kBars = kV + kStages * Cols::kBytes;  // q_full, k_full[S], v_full[S], empty[S]
  static constexpr int kBytes = kBars + 8 * (1 + 3 * kStages);
  static constexpr int kAlloc = kBytes + 1024;  // the base is rounded up to 1024 bytes
  static_assert(kAlloc <= 227 * 1024, "more shared memory than a Hopper block may have");
};

template <class Tl, int HD>
using ForwardSmem = FwdSmem<HD, Tl::Q::kSize, Tl::K::kSize, ForwardCta<Tl, HD>::kStages>;

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<bf16_t>(float lo, float hi) { return pack_bf16(lo, hi); }
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) { return pack_f16(lo, hi); }

// TMA coordinates (innermost first) of a box: channel, the spatial axes from last to
// first (real coordinates: group g plus dilation times the group coordinate), the outer
// axis (batch, or batch x heads: head_coords).
template <int NA>
__device__ __forceinline__ void box_coords(const Params& p, const CtaTile& t, const int* first, int channel,
                                           int outer, int* c) {
  c[0] = channel;
#pragma unroll
  for (int a = 0; a < NA; ++a) c[NA - a] = t.g[a] + p.dilation[a] * first[a];
  c[NA + 1] = outer;
}

// One channel block of a box (B: its Box type; ROW_BYTES: a tile row's bytes) into `dst`,
// completing on `bar`: one bulk tensor copy, or box_pieces of them along axis 0 where the
// box times the dilation is more than the copy engine's 256 elements (the map's box is then
// one piece: map_spec). c: box_coords' coordinates (axis 0's is moved piece by piece).
template <int NA, class B, int ROW_BYTES>
__device__ __forceinline__ void tma_load_box(const Params& p, unsigned char* dst, const CUtensorMap* map,
                                             uint64_t* bar, int* c) {
  constexpr int kInner = B::kSize / B::extent(0);  // tile rows per axis-0 step
  static_assert(B::extent(0) / box_pieces(B::extent(0), kMaxElementStride) * kInner % 8 == 0,
                "pieces hold whole 8-row swizzle atoms");
  const int d = p.dilation[0], n = box_pieces(B::extent(0), d);
  // Boxes that fit at the largest dilation (every 2-D and 3-D box) keep the one copy without
  // the runtime test (it made the 3-D head-dim-256 forward spill).
  if (B::extent(0) * kMaxElementStride <= kMaxBoxElements || n == 1) {
    tma_load<NA + 2>(dst, map, bar, c);
    return;
  }
  const int c0 = c[NA];
  for (int j = 0; j < n; ++j) {
    const BoxPiece piece = box_piece(B::extent(0), d, j);
    c[NA] = c0 + piece.offset;
    tma_load<NA + 2>(dst + piece.step * kInner * ROW_BYTES, map, bar, c);
  }
}

// Box B of one tensor (first element `origin`, head coordinates hc) into its tile `dst`
// (layout Tt, a TileSmem), one bulk tensor copy per channel block, completing on `bar`, whose
// bytes the caller expects (c: scratch for the copies' coordinates).
template <int NA, class B, class Tt>
__device__ __forceinline__ void load_box_blocks(const Params& p, const CtaTile& tile, const int* origin,
                                                const HeadCoords& hc, unsigned char* dst, const CUtensorMap* map,
                                                uint64_t* bar, int* c) {
  for (int cb = 0; cb < Tt::kBlocks; ++cb) {
    box_coords<NA>(p, tile, origin, hc.channel + cb * Tt::kChannels, hc.outer, c);
    tma_load_box<NA, B, Tt::kRowBytes>(p, dst + cb * Tt::kBlockBytes, map, bar, c);
  }
}

// Key and value box k (first element `origin`) into ring slot k % STAGES, completing on the
// slot's full mbarriers (hk / hv: head_coords; c: scratch for the copies' coordinates).
template <int NA, class KB, class C, int STAGES>
__device__ __forceinline__ void load_kv_box(const Params& p, const CtaTile& tile, const int* origin, int k,
                                            const HeadCoords& hk, const HeadCoords& hv, unsigned char* k_ring,
                                            unsigned char* v_ring, const CUtensorMap* map_k,
                                            const CUtensorMap* map_v, uint64_t* k_full, uint64_t* v_full, int* c) {
  const int s = k % STAGES;
  mbar_expect_tx(k_full + s, C::kBytes);
  load_box_blocks<NA, KB, C>(p, tile, origin, hk, k_ring + s * C::kBytes, map_k, k_full + s, c);
  mbar_expect_tx(v_full + s, C::kBytes);
  load_box_blocks<NA, KB, C>(p, tile, origin, hv, v_ring + s * C::kBytes, map_v, v_full + s, c);
}

// The [B, N, H] row (the LSE's) of row qr of the CTA's query box.
template <int NA, class QB>
__device__ __forceinline__ int64_t lse_row(const Params& p, const CtaTile& tile, int qr, int b, int h) {
  int64_t token;
  box_row_token<NA, QB>(p, tile, tile.q0, qr, token);
  return (int64_t(b) * p.tokens + token) * p.heads + h;
}

// Build switches: 1 (the default) moves a row's running max only where some row of the warp's
// step passes it by more than kLazyMaxSlack (log2 units; FlashAttention-4's conditional
// rescale), so that the warp mostly skips O's rescale: NATTN_SM90_LAZY_RESCALE for the
// mma.sync CTAs (strips, squares; strip_chunk_softmax), NATTN_SM90_LAZY_RESCALE_WGMMA for the
// wgmma forward (its rescale is skipped where alpha is 1). O and l keep one max between them,
// so the result is the same; a probability is then at most 2^kLazyMaxSlack (256: exact in
// fp16 and bf16, far from their ranges' ends).
#ifndef NATTN_SM90_LAZY_RESCALE
#define NATTN_SM90_LAZY_RESCALE 1
#endif
#ifndef NATTN_SM90_LAZY_RESCALE_WGMMA
#define NATTN_SM90_LAZY_RESCALE_WGMMA 1
#endif
constexpr float kLazyMaxSlack = 8.f;

// A row's running max m moves to max(m, mq) (mq: the step's, over the quad): the exponent
// offset m_use (0 for a row with nothing seen yet, which stays at zero) and the factor alpha
// that rescales the row sum l (and O).
__device__ __forceinline__ void move_row_max(float& m, float& l, float mq, float& m_use, float& alpha) {
  const float m_new = fmaxf(m, mq);
  m_use = m_new == -INFINITY ? 0.f : m_new;
  alpha = fast_exp2(m - m_use);
  m = m_new;
  l *= alpha;
}

// One online-softmax step of a lane's two rows, from the step's row maxima mx (the quad's,
// times mul).
__device__ __forceinline__ void online_max_step(float (&m)[2], float (&l)[2], const float (&mx)[2], float mul,
                                                float (&m_use)[2], float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) move_row_max(m[r], l[r], quad_max(mx[r] * mul), m_use[r], alpha[r]);
}

// The same, lazily (NATTN_SM90_LAZY_RESCALE): the maxima move (as online_max_step) only where
// some row of the warp (the whole warp calls it) passes its max by more than kLazyMaxSlack,
// else they stay (alpha 1, m_use the old max; 0 for a row with nothing seen yet). Returns
// whether they moved: O needs its rescale only then.
__device__ __forceinline__ bool lazy_max_step(float (&m)[2], float (&l)[2], const float (&mx)[2], float mul,
                                              float (&m_use)[2], float (&alpha)[2]) {
  float mq[2];
  bool grow = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mq[r] = quad_max(mx[r] * mul);
    grow = grow || mq[r] > m[r] + kLazyMaxSlack;  // (m = -inf: any finite score)
  }
  if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
    for (int r = 0; r < 2; ++r) move_row_max(m[r], l[r], mq[r], m_use[r], alpha[r]);
    return true;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m_use[r] = m[r] == -INFINITY ? 0.f : m[r];
    alpha[r] = 1.f;
  }
  return false;
}

// O / l of a lane's two accumulator rows (query box rows qr and qr + kRowStep: the square
// CTAs' second row is two square rows on, forward_squares.cuh) into the query tile `stage`
// (layout R): element 4 n + 2 r + e of o is row r, channel 8 n + 2 t4 + e (the m16n8
// accumulator layout of wgmma and mma.sync alike).
template <typename T, int HD, class R, int kRowStep = 8>
__device__ __forceinline__ void stage_output(unsigned char* stage, const float* o, const float (&inv)[2], int qr,
                                             int t4) {
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int r = (i / 2) % 2;
    *reinterpret_cast<uint32_t*>(stage + R::offset(qr + kRowStep * r, 8 * (i / 4) + 2 * t4)) =
        pack2<T>(o[i] * inv[r], o[i + 1] * inv[r]);
  }
}

// The producer's walk over a CTA's key boxes (the forward and the dQ pass): each box once the
// consumers have released its slot (its "empty" mbarrier). Boxes [first, last) of the walk
// (a half-box dQ CTA's seen steps; every box by default), box k in slot (k - first) % STAGES.
template <int NA, int HD, class KB, class C, int STAGES>
__device__ __forceinline__ void produce_kv_ring(const Params& p, const CtaTile& tile, int h_kv, int b,
                                                unsigned char* k_ring, unsigned char* v_ring,
                                                const CUtensorMap* map_k, const CUtensorMap* map_v,
                                                uint64_t* k_full, uint64_t* v_full, uint64_t* empty,
                                                int first = 0, int last = -1) {
  const HeadCoords hk = head_coords<HD>(p, kRowsK, p.heads_kv, h_kv, b);
  const HeadCoords hv = head_coords<HD>(p, kRowsV, p.heads_kv, h_kv, b);
  int c[5];
  BoxWalk<NA, KB> walk(tile);
  for (int k = 0; k < first; ++k) walk.next(tile);
  const int n = (last < 0 ? tile.tiles : last) - first;
  for (int j = 0; j < n; ++j, walk.next(tile)) {
    if (j >= STAGES) mbar_wait(empty + j % STAGES, ((j / STAGES) - 1) & 1);
    load_kv_box<NA, KB, C, STAGES>(p, tile, walk.origin, j, hk, hv, k_ring, v_ring, map_k, map_v, k_full, v_full, c);
  }
}

// Where store_output_rows writes: the tensor (pointer, element strides), its heads and its
// kRows* bit in Params::map_heads_outer (its map's head coordinates).
struct RowsOut {
  void* ptr;
  const int64_t* s;
  int heads, bit;
};

// A consumer warpgroup's 64 rows of the output box (rows 64 cw .., staged in the query tile
// `stage`, layout R) go out. With the output's own map (kMap and Params::out_map: its box is a
// warpgroup's rows, rows0 of them along axis 0) one bulk tensor copy per channel block, issued
// by the warpgroup's thread 0 (rows past the tensor are not written); else 16-byte stores per
// lane, which cost ~110 instructions a warp with their 64-bit addresses at head dim 32, the
// most of any part of a small window's epilogue. Every thread of the warpgroup calls it (named
// barrier 1 + cw); the forward kernels and the strip CTAs (forward_strips.cuh) end with it,
// and so do the strip pairs' backward passes, out = dQ (backward_dq_strips.cuh) or dK and dV
// (backward_dkv_strips.cuh, whose box is the key box at tile.q0; Params::out_map says
// whether their maps are encoded).
template <typename T, int NA, int HD, class QB, class R, bool kMap>
__device__ __forceinline__ void store_output_rows(const Params& p, const CtaTile& tile, const CUtensorMap* map_o,
                                                  unsigned char* stage, int cw, int rows0, int h, int b,
                                                  const RowsOut& out_to) {
  if (kMap && p.out_map) {
    fence_proxy_async_smem();
    named_sync(1 + cw, 128);
    if (threadIdx.x % 128 == 0) {
      const HeadCoords ho = head_coords<HD>(p, out_to.bit, out_to.heads, h, b);
      const int first[3] = {tile.q0[0] + cw * rows0, tile.q0[1], tile.q0[2]};
      int c[5];
      for (int cb = 0; cb < R::kBlocks; ++cb) {
        box_coords<NA>(p, tile, first, ho.channel + cb * R::kChannels, ho.outer, c);
        // one piece (prepare_forward); a warpgroup's rows are whole swizzle atoms
        tma_store<NA + 2>(map_o, stage + cb * R::kBlockBytes + cw * kWgRows * R::kRowBytes, c);
      }
      bulk_commit();
      bulk_wait_read<0>();  // the CTA's shared memory must outlive the copy's reads
    }
    return;
  }
  named_sync(1 + cw, 128);
  T* out = head_base<T>(out_to.ptr, out_to.s, b, h);
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x % 128; idx < kWgRows * kChunks; idx += 128) {
    const int qr = cw * kWgRows + idx / kChunks, ch = idx % kChunks;
    int64_t off;
    const bool ok = box_row_offset<NA, QB>(p, tile, tile.q0, qr, out_to.s, off);
    if (ok)
      *reinterpret_cast<uint4*>(out + off + ch * 8) = *reinterpret_cast<const uint4*>(stage + R::offset(qr, ch * 8));
  }
}

template <typename T, int NA, int HD, class Tl>
__global__ void __launch_bounds__(ForwardCta<Tl, HD>::kThreads, ForwardCta<Tl, HD>::kMinBlocks)
    forward_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_q,
                   const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                   const __grid_constant__ CUtensorMap map_o) {
#if NATTN_SM90_ENABLED
  using QB = typename Tl::Q;
  using KB = typename Tl::K;
  using Cta = ForwardCta<Tl, HD>;
  constexpr int kNk = KB::kSize;  // keys per box
  constexpr bool kPair = Cta::kConsumers == 2;
  using S = ForwardSmem<Tl, HD>;
  using R = typename S::Rows;
  using C = typename S::Cols;
  unsigned char* smem = aligned_smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBars);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + S::kStages;
  uint64_t* empty = v_full + S::kStages;

  // Split-KV (Params::kv_splits > 1): CTA blockIdx.x = box * splits + split walks a slice
  // of its query box's key boxes along axis 0 (the union shrinks to it: no register of its
  // own in the loops) and leaves a partial output for split_kv_merge.cuh. Built where its
  // epilogue fits the registers (ForwardCta::kSplitKv; prepare_forward declines elsewhere).
  const int splits = Cta::kSplitKv ? p.kv_splits : 1;
  CtaTile tile;
  if (!cta_tile<NA, QB, KB>(p, splits > 1 ? blockIdx.x / splits : blockIdx.x, tile)) return;  // uniform
  if (splits > 1) {
    const int per = (tile.nk[0] + splits - 1) / splits;
    const int first = int(blockIdx.x % splits) * per;
    const int count = nattn_max(0, nattn_min(tile.nk[0], first + per) - first);
    tile.tiles = tile.tiles / tile.nk[0] * count;  // 0: a slice past the last row of key boxes
    tile.lo[0] += first * KB::extent(0);
    tile.nk[0] = count;
  }
  const int h = blockIdx.y, b = blockIdx.z;
  const int h_kv = kv_head(p, h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wg = threadIdx.x / 128;
  // 128-query CTAs: warpgroup 0 produces, 1 and 2 consume; 64-query CTAs: warpgroup 0
  // consumes, warp 4 produces (or, Cta::kSelfFed, warpgroup 0's thread 0 issues the copies).
  const bool producer = kPair ? wg == 0 : !Cta::kSelfFed && warp == 4;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_q);
    prefetch_tensor_map(&map_k);
    prefetch_tensor_map(&map_v);
    mbar_init(q_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(empty + s, 4 * Cta::kConsumers);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  // The query box, one bulk tensor copy per channel block (c: scratch coordinates).
  auto copy_query_box = [&](int* c) {
    mbar_expect_tx(q_full, R::kBytes);
    load_box_blocks<NA, QB, R>(p, tile, tile.q0, head_coords<HD>(p, kRowsQ, p.heads, h, b), smem + S::kQ, &map_q,
                               q_full, c);
  };
  if (producer) {  // ---------------------------------------------- producer
    if (kPair) regs_dealloc<DefaultRegisterSplit::kProducer>();
    if (lane != 0 || (kPair && warp != 0)) return;
    int c[5];
    copy_query_box(c);
    produce_kv_ring<NA, HD, KB, C, S::kStages>(p, tile, h_kv, b, smem + S::kK, smem + S::kV, &map_k, &map_v,
                                              k_full, v_full, empty);
    return;
  }

  // A self-fed 64-query CTA: its thread 0 copies the query box and the ring's first boxes
  // here, and each next box once the warpgroup has read a slot (`release`).
  auto feed_box = [&](const int* origin, int k) {
    int c[5];
    load_kv_box<NA, KB, C, S::kStages>(p, tile, origin, k, head_coords<HD>(p, kRowsK, p.heads_kv, h_kv, b),
                                       head_coords<HD>(p, kRowsV, p.heads_kv, h_kv, b), smem + S::kK,
                                       smem + S::kV, &map_k, &map_v, k_full, v_full, c);
  };
  if constexpr (Cta::kSelfFed) {
    if (threadIdx.x == 0) {
      int c[5];
      copy_query_box(c);
      BoxWalk<NA, KB> first(tile);
      for (int k = 0; k < S::kStages && k < tile.tiles; ++k, first.next(tile)) feed_box(first.origin, k);
    }
  }

  // ---------------------------------------------------------------- consumers
  if (kPair) regs_alloc<DefaultRegisterSplit::kConsumer>();
  const int cw = kPair ? wg - 1 : 0;  // consumer warpgroup: query rows 64 cw ..
  const int wr = (warp % 4) * 16;     // the warp's first row inside the warpgroup
  const int g4 = lane / 4, t4 = lane % 4;
  int rpb_mult[3] = {1, 1, 1};
  for (int a = NA - 2; a >= 0; --a) rpb_mult[a] = rpb_mult[a + 1] * p.rpb_size[a + 1];
  const bool has_rpb = p.rpb != nullptr;
  // 64-query CTAs: the RPB table of the current box's head in shared memory.
  float* rpb_smem = reinterpret_cast<float*>(smem + S::kBytes);
  const float* bias_table = !has_rpb ? nullptr : kPair ? p.rpb : rpb_smem;
  if (!kPair && has_rpb) {  // behind the mbarriers
    const float* src = p.rpb + int64_t(h) * p.rpb_head_size;
    for (int i = threadIdx.x; i < int(p.rpb_head_size); i += 128) rpb_smem[i] = __ldg(src + i);
    named_sync(1, 128);
  }

  // The lane's two rows (wr + g4 and + 8): validity, windows, RPB row part.
  RowWindow row[2];
  bool row_ok[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r].rpb = kPair ? h * int(p.rpb_head_size) : 0;  // 64-query CTAs: the head's table only
    row_ok[r] = row_window<NA, QB>(p, tile.q0, tile.len, cw * kWgRows + wr + g4 + 8 * r, rpb_mult, row[r]);
  }
  // Key boxes inside the window of every query of this warpgroup need no mask.
  int full_lo[3], full_hi[3];
  unmasked_boxes<NA, QB, false, kPair>(p, tile, cw, full_lo, full_hi);

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  unsigned char* q_tile = smem + S::kQ;

  // S = Q K^T of key box k, issued (completes at the next wgmma wait).
  auto issue_s = [&](int k, float (&sc)[kNk / 2]) {
    const int s = k % S::kStages;
    const unsigned char* k_tile = smem + S::kK + s * C::kBytes;
    mbar_wait(k_full + s, (k / S::kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_ss<T, kNk>(sc, R::k_major(q_tile, cw * kWgRows, kk), C::k_major(k_tile, 0, kk), kk > 0);
    wgmma_commit();
  };
  // O += P V of key box k, issued.
  auto issue_pv = [&](int k, const uint32_t (&pa)[kNk / 16][4]) {
    const int s = k % S::kStages;
    const unsigned char* v_tile = smem + S::kV + s * C::kBytes;
    mbar_wait(v_full + s, (k / S::kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kNk / 16; ++kk) wgmma_rs<T, HD>(o, pa[kk], C::mn_major(v_tile, kk), 1);
    wgmma_commit();
  };
  // Scale, mask (boxes not inside every window), bias; online softmax: sc becomes P in
  // fp32, m and l move on, and alpha is the factor O must be rescaled by. Called once per
  // key box, in order: `walk` moves on to the next box.
  BoxWalk<NA, KB> walk(tile);
  auto softmax = [&](float (&sc)[kNk / 2], float (&alpha)[2]) {
    const int* origin = walk.origin;
    bool full = true;
#pragma unroll
    for (int a = 0; a < NA; ++a)
      full = full && origin[a] >= full_lo[a] && origin[a] + KB::extent(a) - 1 <= full_hi[a];
    float mx[2] = {-INFINITY, -INFINITY};
    // Without RPB (and with a positive scale) the scores stay raw: the row max is taken on
    // them and the scale folds into the exponent's FFMA below. (A negative scale would turn
    // the max into a min: those scale first.)
    const bool fold = !has_rpb && p.scale_log2 > 0.f;
    const float mul = fold ? p.scale_log2 : 1.f, pre = fold ? 1.f : p.scale_log2;
    const Bias bias{bias_table, {rpb_mult[0], rpb_mult[1], rpb_mult[2]}};
    if (full) {
      if (!fold) {
#pragma unroll
        for (int i = 0; i < kNk / 2; ++i) sc[i] *= pre;
      }
      if (has_rpb) {  // every score in the window: only the bias to add
        const int origin_part = bias_base<NA>(RowWindow{{0, 0, 0}, {0, 0, 0}, 0}, origin, t4, bias);
#pragma unroll
        for (int i = 0; i < kNk / 2; ++i)
          sc[i] += bias_table[row[(i / 2) % 2].rpb + origin_part + bias_offset<NA, KB>(i, bias)] * kLog2e;
      }
#pragma unroll
      for (int i = 0; i < kNk / 2; ++i) mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], sc[i]);
    } else if (fold) {
      mask_box_plain<NA, KB>(sc, row, origin, t4, mx);
    } else {
      mask_box<NA, KB>(sc, row, origin, t4, pre, bias, mx);
    }
    walk.next(tile);
    float m_use[2];
#if NATTN_SM90_LAZY_RESCALE_WGMMA
    lazy_max_step(m, l, mx, mul, m_use, alpha);  // (alpha 1 where the maxima stay: rescale_o skips)
#else
    online_max_step(m, l, mx, mul, m_use, alpha);
#endif
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
  // Slot k % STAGES is read: the producer may refill it, or (self-fed) thread 0 does, once
  // every warp's products have read it, with box k + STAGES (found from the consumers'
  // walk, which is at box walk_box by then).
  auto release = [&](int k, int walk_box) {
    if constexpr (Cta::kSelfFed) {
      if (k + S::kStages < tile.tiles) {
        named_sync(2, 128);
        if (threadIdx.x == 0) {
          BoxWalk<NA, KB> at = walk;
          for (int i = walk_box; i < k + S::kStages; ++i) at.next(tile);
          feed_box(at.origin, k + S::kStages);
        }
      }
    } else {
      (void)walk_box;
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + k % S::kStages);
    }
  };
  // O *= alpha. Once the row maxima settle (most boxes of a large window) alpha is 1: skipped.
  auto rescale_o = [&](const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) o[i] *= alpha[(i / 2) % 2];
    }
  };

  // Pipelined as FlashAttention-3 does: while the tensor cores run P_{k-1} V_{k-1}, the
  // warpgroup computes the softmax of box k (issued just before). Two consumer warpgroups
  // also take turns issuing (barriers 3 and 4), so one's softmax overlaps the other's
  // products; a lone warpgroup overlaps with the SM's other CTAs instead.
  // A 64-query CTA pipelines its boxes too where its registers allow (ForwardCta).
  constexpr bool kLonePipelined = Cta::kLonePipelined;
  const int my_turn = 3 + cw, their_turn = 4 - cw;
  float sc[kNk / 2], alpha[2];
  uint32_t pa[kNk / 16][4];
  mbar_wait(q_full, 0);  // also before the epilogue reuses the Q buffer (a split may walk nothing)
  if (tile.tiles == 0) {
    // a split-KV slice past the union's last row of key boxes: no keys, LSE -inf
  } else if ((!kPair && !kLonePipelined) || HD > 128) {
    // A lone warpgroup with larger key boxes runs its boxes one after the other (S and P
    // never live at once: registers for two CTAs per SM); the SM's other CTA fills the
    // waits. So do the two warpgroups at head dim 256, whose O takes 128 registers a thread
    // (the pipelined loop below, with S of the next box live beside P, spilled there).
    for (int k = 0; k < tile.tiles; ++k) {
      issue_s(k, sc);
      wgmma_wait<0>();
      fence_regs(sc);
      softmax(sc, alpha);
      if (k > 0) rescale_o(alpha);
      pack_p(sc, pa);
      issue_pv(k, pa);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release(k, k + 1);  // (softmax moved the walk on)
    }
  } else {
    issue_s(0, sc);
    wgmma_wait<0>();
    fence_regs(sc);
    softmax(sc, alpha);
    pack_p(sc, pa);
    if (kPair && cw == 1 && tile.tiles > 1) named_arrive(their_turn, 256);  // warpgroup 0 goes first
    for (int k = 1; k < tile.tiles; ++k) {
      if (kPair) named_sync(my_turn, 256);
      issue_s(k, sc);
      issue_pv(k - 1, pa);
      if (kPair && (cw == 0 || k + 1 < tile.tiles)) named_arrive(their_turn, 256);
      wgmma_wait<1>();  // S of box k is in; P_{k-1} V_{k-1} may still run
      fence_regs(sc);
      softmax(sc, alpha);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release(k - 1, k + 1);
      rescale_o(alpha);
      pack_p(sc, pa);
    }
    issue_pv(tile.tiles - 1, pa);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    release(tile.tiles - 1, tile.tiles);
  }

  // O / l through shared memory (the warpgroup's own query rows, no longer read), then
  // 16-byte stores of whole rows; the LSE from the lanes holding column 0.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    inv[r] = inv_row_sum(l[r]);
  }
  if (Cta::kSplitKv && p.o_part) {  // split-KV: this slice's rows, fp32, normalised by its own sum, and its LSE
    // Box-local: the CTA's slot (batch, head, box x split) holds its QB::kSize rows in box
    // order; split_kv_merge.cuh maps them to tokens (no per-axis math here: registers).
    const int64_t slot = (int64_t(b) * p.heads + h) * gridDim.x + blockIdx.x;
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // one row at a time: one 64-bit address live
      if (!row_ok[r]) continue;
      const int64_t row_id = slot * QB::kSize + (cw * kWgRows + wr + g4 + 8 * r);
      if (t4 == 0) p.lse_part[row_id] = row_lse(m[r], l[r]);
      float* dst = p.o_part + row_id * HD + 2 * t4;
#pragma unroll
      for (int i = 0; i < HD / 2; i += 2)
        if ((i / 2) % 2 == r) *reinterpret_cast<float2*>(dst + 8 * (i / 4)) = make_float2(o[i] * inv[r], o[i + 1] * inv[r]);
    }
    return;
  }
  unsigned char* stage = q_tile;
  stage_output<T, HD, R>(stage, o, inv, cw * kWgRows + wr + g4, t4);
  if (t4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (row_ok[r]) p.lse[lse_row<NA, QB>(p, tile, cw * kWgRows + wr + g4 + 8 * r, b, h)] = row_lse(m[r], l[r]);
    }
  }
  store_output_rows<T, NA, HD, QB, R, Cta::kOutMap>(p, tile, &map_o, stage, cw, Cta::kOutRows0, h, b,
                                                    RowsOut{p.out, p.out_s, p.heads, kRowsOut});
#endif
}

}  }  // namespace nattn::sm90
