// Host launchers of the Hopper (sm90) family: problem checks, tensor maps, launch.
#pragma once
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "nattn/common/device.h"  // poison_workspace
#include "nattn/common/drpb.cuh"
#include "nattn/common/registry.h"
#include "nattn/common/smem_opt_in.cuh"
#include "nattn/sm90/backward_delta.cuh"
#include "nattn/sm90/backward_dq_accum.cuh"
#include "nattn/sm90/backward_dkv.cuh"
#include "nattn/sm90/backward_dq.cuh"
#include "nattn/sm90/backward_dkv_squares.cuh"
#include "nattn/sm90/backward_dkv_squares_persistent.cuh"
#include "nattn/sm90/backward_dkv_strips.cuh"
#include "nattn/sm90/backward_dq_squares.cuh"
#include "nattn/sm90/backward_dq_squares_persistent.cuh"
#include "nattn/sm90/backward_dq_strips.cuh"
#include "nattn/sm90/backward_wide.cuh"
#include "nattn/sm90/forward.cuh"
#include "nattn/sm90/forward_squares.cuh"
#include "nattn/sm90/forward_squares_persistent.cuh"
#include "nattn/sm90/forward_strips.cuh"
#include "nattn/sm90/launch.h"
#include "nattn/sm90/split_kv_merge.cuh"
#include "nattn/sm90/tensor_map.h"
#include "nattn/tc/kernels.cuh"

namespace nattn { namespace sm90 {

// What prepare_forward leaves for launch_forward (in Params::prepared).
struct ForwardLaunch {
  CUtensorMap q, k, v;
  CUtensorMap o;    // the output's map, for the warpgroups' bulk stores (out_map: encoded)
  int heads_outer;  // Params::map_heads_outer of the maps
  int out_map;      // Params::out_map
};
static_assert(sizeof(ForwardLaunch) <= kPrepareBytes, "workspace too small");

// A bulk store's map (into dst) for the rows of a box (box: the extents one store covers) of
// the output-like tensor at ptr (strides s, `heads` heads): encoded unless
// NATTN_SM90_OUT_STORES=lanes (read on every call: the GPU tier checks the per-lane stores
// with it) or the copy engine cannot address the box in one piece. Returns whether it was; a
// map with its heads next to the batch sets `bit` (the tensor's kRows*) in heads_outer.
template <int HD, typename T>
bool encode_store_map(const Params& p, const int64_t* s, void* ptr, int heads, const int* box, CUtensorMap* dst, int bit,
                      int& heads_outer) {
  memset(dst, 0, sizeof *dst);  // passed unread when not encoded
  const char* stores = getenv("NATTN_SM90_OUT_STORES");
  if ((stores && !strcmp(stores, "lanes")) || box_pieces(box[0], p.dilation[0]) != 1) return false;
  MapSpec m;
  constexpr bool kBf16 = sizeof(T) == 2 && !std::is_same<T, __half>::value;
  if (map_spec(p, s, heads, HD, box, m) || encode(dst, m, ptr, kBf16)) return false;
  if (m.heads_outer) heads_outer |= bit;
  return true;
}

template <typename T, int NA, int HD, class Tl>
const char* prepare_forward(const Params& p, void* workspace) {
  if (p.dim != HD || p.dim_v != HD) return "head dims must both equal the instance's (32, 64, 128 or 256)";
  int qbox[3], kbox[3];
  for (int a = 0; a < 3; ++a) {
    qbox[a] = Tl::Q::extent(a);
    kbox[a] = Tl::K::extent(a);
  }
  if constexpr (Tl::kStrips) {  // forward_strips.cuh: the union must fit the key box
    if (const char* why = strip_declines(p, qbox, kbox)) return why;
    strip_key_map_box(NA, kbox);
  }
  if constexpr (Tl::kSquares) {  // forward_squares.cuh: the same, windows up to 13 x 13
    if (const char* why = square_declines(p)) return why;
    square_key_map_box(kbox);
  }
  MapSpec mq, mk, mv;
  const char* why = map_spec(p, p.q_s, p.heads, HD, qbox, mq);
  if (!why) why = map_spec(p, p.k_s, p.heads_kv, HD, kbox, mk);
  if (!why) why = map_spec(p, p.v_s, p.heads_kv, HD, kbox, mv);
  if (why) return why;
  if (p.kv_splits > 1 && !ForwardCta<Tl, HD>::kSplitKv)
    return "split-KV (kv_splits > 1) is not built for the 3-D 64-query pairs at head dim 32 (registers): "
           "name a 128-query pair";
  if (num_cta_tiles<typename Tl::Q>(p) *
          (p.kv_splits > 1 ? nattn_max(p.kv_splits, merge_chunks<HD, typename Tl::Q>()) : 1) > 0x7fffffff)
    return "too many query boxes (times kv_splits, or the merge's blocks per box) for the grid";
  if (Tl::kConsumers == 1 && p.rpb && p.rpb_head_size > ForwardCta<Tl, HD>::kRpbStageFloats)
    return "an RPB table above 4096 entries per head needs a 128-query tile pair (64-query pairs stage it in shared memory)";
  ForwardLaunch* l = static_cast<ForwardLaunch*>(workspace);
  constexpr bool kBf16 = sizeof(T) == 2 && !std::is_same<T, __half>::value;
  if ((why = encode(&l->q, mq, p.q, kBf16))) return why;
  if ((why = encode(&l->k, mk, p.k, kBf16))) return why;
  if ((why = encode(&l->v, mv, p.v, kBf16))) return why;
  l->heads_outer = (mq.heads_outer ? kRowsQ : 0) | (mk.heads_outer ? kRowsK : 0) | (mv.heads_outer ? kRowsV : 0);
  // Each consumer warpgroup stores its rows of the output box with the copy engine where it
  // can address the output in one piece (else per lane; NATTN_SM90_OUT_STORES=lanes, read on
  // every call, forces that: the GPU tier checks the path with it). One piece: the epilogue
  // has no piece loop.
  using Cta = ForwardCta<Tl, HD>;
  const int obox[3] = {Cta::kOutRows0, qbox[1], qbox[2]};
  l->out_map = 0;
  memset(&l->o, 0, sizeof l->o);  // passed unread when not encoded
  if (Cta::kOutMap) l->out_map = encode_store_map<HD, T>(p, p.out_s, p.out, p.heads, obox, &l->o, kRowsOut, l->heads_outer);
  return nullptr;
}

// A strip pair's forward (forward_strips.cuh): one CTA of four warps per query box.
template <typename T, int NA, int HD, class Tl>
void launch_forward_strips(const Params& p, const ForwardLaunch* l, cudaStream_t stream) {
  using S = StripSmem<Tl, HD>;
  constexpr int most = S::kAlloc + S::kRpbFloats * int(sizeof(float));
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] { return allow_smem(forward_strips_kernel<T, NA, HD, Tl>, most); });
  const int rpb_floats = p.rpb ? int(p.rpb_head_size) + 2 * StripCta<Tl, HD>::kRpbGuard : 0;
  const int smem = S::kAlloc + rpb_floats * int(sizeof(float));
  const dim3 grid(unsigned(num_cta_tiles<typename Tl::Q>(p)), unsigned(p.heads), unsigned(p.batch));
  forward_strips_kernel<T, NA, HD, Tl><<<grid, StripCta<Tl, HD>::kThreads, smem, stream>>>(p, l->q, l->k, l->v, l->o);
}

// The persistent square kernels' grid (forward_squares_persistent.cuh and the dQ and dK/dV
// passes' persistent forms): as many CTAs as the SMs hold at `smem` bytes each (min_blocks at
// most: fewer when a large RPB table takes shared memory), each walking a run of consecutive
// boxes of the flattened [batch, head, box] order (`per` boxes a batch entry and head, rp.cta_tiles;
// the run's length rp.cta_run); NATTN_SM90_SQUARE_RUN=N (read on every call, for A/B runs)
// names the run's length.
inline dim3 square_run_grid(Params& rp, int64_t per, int heads, int smem, int min_blocks) {
  rp.cta_tiles = int(per);
  const int64_t boxes = per * heads * rp.batch;
  int device = 0;
  cudaGetDevice(&device);
  const int sms = nattn::host::device_sms(device), smem_sm = nattn::host::device_smem_per_sm(device);
  const int per_sm = nattn_max(1, nattn_min(min_blocks, smem_sm > 0 ? smem_sm / (smem + kSmemReservedPerCta) : 1));
  const int64_t slots = int64_t(nattn_max(sms, 1)) * per_sm;
  const char* named = getenv("NATTN_SM90_SQUARE_RUN");
  int64_t run = named && atoi(named) > 0 ? atoi(named) : (boxes + slots - 1) / slots;
  rp.cta_run = int(run > 1 ? run : 1);
  return dim3(unsigned((boxes + rp.cta_run - 1) / rp.cta_run));
}

// The persistent square forward (build switch NATTN_SM90_SQUARE_PERSIST).
template <typename T, int NA, int HD, class Tl>
void launch_forward_square_runs(const Params& p, const ForwardLaunch* l, cudaStream_t stream) {
  using S = SquareRunSmem<Tl, HD>;
  constexpr int most = S::kAlloc + S::kRpbFloats * int(sizeof(float));
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] { return allow_smem(forward_squares_run_kernel<T, NA, HD, Tl>, most); });
  const int rpb_floats = p.rpb ? int(p.rpb_head_size) + 2 * SquareCta<Tl, HD>::kRpbGuard : 0;
  const int smem = S::kAlloc + rpb_floats * int(sizeof(float));
  Params rp = p;
  const dim3 grid = square_run_grid(rp, num_cta_tiles<typename Tl::Q>(p), p.heads, smem, S::kMinBlocks);
  forward_squares_run_kernel<T, NA, HD, Tl><<<grid, SquareCta<Tl, HD>::kThreads, smem, stream>>>(rp, l->q, l->k, l->v);
}

// The square pair's forward (forward_squares.cuh): one CTA of four warps per query box.
template <typename T, int NA, int HD, class Tl>
void launch_forward_squares(const Params& p, const ForwardLaunch* l, cudaStream_t stream) {
  if constexpr (kSquarePersist<HD>) {
    launch_forward_square_runs<T, NA, HD, Tl>(p, l, stream);
    return;
  }
  using S = SquareSmem<Tl, HD, kSquareForwardRing<HD>>;
  constexpr int most = S::kAlloc + S::kRpbFloats * int(sizeof(float));
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] { return allow_smem(forward_squares_kernel<T, NA, HD, Tl>, most); });
  const int rpb_floats = p.rpb ? int(p.rpb_head_size) + 2 * SquareCta<Tl, HD>::kRpbGuard : 0;
  const int smem = S::kAlloc + rpb_floats * int(sizeof(float));
  const dim3 grid(unsigned(num_cta_tiles<typename Tl::Q>(p)), unsigned(p.heads), unsigned(p.batch));
  forward_squares_kernel<T, NA, HD, Tl><<<grid, SquareCta<Tl, HD>::kThreads, smem, stream>>>(p, l->q, l->k, l->v, l->o);
}

// The forward of the other pairs (forward.cuh).
template <typename T, int NA, int HD, class Tl>
void launch_forward_boxes(const Params& p, const ForwardLaunch* l, cudaStream_t stream) {
  using Cta = ForwardCta<Tl, HD>;
  constexpr int base = ForwardSmem<Tl, HD>::kAlloc;
  constexpr int most = base + Cta::kRpbStageFloats * int(sizeof(float));
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] { return allow_smem(forward_kernel<T, NA, HD, Tl>, most); });
  const int smem = base + (Cta::kRpbStageFloats && p.rpb ? int(p.rpb_head_size * sizeof(float)) : 0);
  const unsigned boxes = unsigned(num_cta_tiles<typename Tl::Q>(p));
  if (Cta::kSplitKv && p.kv_splits > 1) {  // split-KV: partial outputs in a stream-ordered fp32 workspace, then the merge
    Params sp = p;
    // box-local partial rows: (batch, head, box, split) slots of QB::kSize rows
    const size_t rows = size_t(p.batch) * p.heads * boxes * size_t(p.kv_splits) * Tl::Q::kSize;
    const size_t o_bytes = rows * HD * sizeof(float), l_bytes = rows * sizeof(float);
    if (cudaMallocAsync(reinterpret_cast<void**>(&sp.o_part), o_bytes + l_bytes, stream) == cudaSuccess) {
      sp.lse_part = sp.o_part + rows * HD;
      nattn::host::poison_workspace(sp.o_part, o_bytes + l_bytes, stream);
      const dim3 grid(boxes * unsigned(p.kv_splits), unsigned(p.heads), unsigned(p.batch));
      forward_kernel<T, NA, HD, Tl><<<grid, Cta::kThreads, smem, stream>>>(sp, l->q, l->k, l->v, l->o);
      split_kv_merge_kernel<T, NA, HD, Tl><<<dim3(boxes * unsigned(merge_chunks<HD, typename Tl::Q>()),
                                                   unsigned(p.heads), unsigned(p.batch)), kMergeThreads, 0, stream>>>(sp);
      cudaFreeAsync(sp.o_part, stream);
      return;
    }
    (void)cudaGetLastError();  // no workspace: the unsplit kernel instead
    sp.kv_splits = 1;
    forward_kernel<T, NA, HD, Tl><<<dim3(boxes, unsigned(p.heads), unsigned(p.batch)), Cta::kThreads, smem, stream>>>(
        sp, l->q, l->k, l->v, l->o);
    return;
  }
  const dim3 grid(boxes, unsigned(p.heads), unsigned(p.batch));
  forward_kernel<T, NA, HD, Tl><<<grid, Cta::kThreads, smem, stream>>>(p, l->q, l->k, l->v, l->o);
}

template <typename T, int NA, int HD, class Tl>
void launch_forward(const Params& problem, cudaStream_t stream) {
  const ForwardLaunch* l = static_cast<const ForwardLaunch*>(problem.prepared);
  Params p = problem;
  p.map_heads_outer = l->heads_outer;
  p.out_map = l->out_map;
  set_query_boxes<typename Tl::Q>(p);
  if constexpr (Tl::kStrips) {
    launch_forward_strips<T, NA, HD, Tl>(p, l, stream);
  } else if constexpr (Tl::kSquares) {
    launch_forward_squares<T, NA, HD, Tl>(p, l, stream);
  } else {
    launch_forward_boxes<T, NA, HD, Tl>(p, l, stream);
  }
}

// What prepare_backward leaves for launch_backward: the dQ pass's maps (Q, dO with the
// 128-token box; K, V with the 64-token box) and the dK/dV pass's (the boxes swapped).
struct BackwardLaunch {
  CUtensorMap dq_q, dq_do, dq_k, dq_v;
  CUtensorMap kv_k, kv_v, kv_q, kv_do;
  int heads_outer;  // Params::map_heads_outer of the maps (both passes' agree: same strides)
};
static_assert(sizeof(BackwardLaunch) <= kPrepareBytes, "workspace too small");

// One input tensor map a backward prepare step encodes: its name (for the error), kRows* bit,
// destination, strides, pointer, heads and box.
struct MapRequest {
  const char* name; int bit; CUtensorMap* dst; const int64_t* s; const void* ptr; int heads; const int* box;
};

// Encodes the maps (the heads-outer bits into heads_outer); the first that fails, named.
template <int HD, typename T, int N>
const char* encode_maps(const Params& p, const MapRequest (&maps)[N], int& heads_outer) {
  constexpr bool kBf16 = sizeof(T) == 2 && !std::is_same<T, __half>::value;
  for (const MapRequest& m : maps) {
    MapSpec spec;
    const char* why = map_spec(p, m.s, m.heads, HD, m.box, spec);
    if (!why) why = encode(m.dst, spec, m.ptr, kBf16);
    if (spec.heads_outer) heads_outer |= m.bit;
    if (why) {
      static thread_local char named[400];
      snprintf(named, sizeof named, "%s: %s", m.name, why);
      return named;
    }
  }
  return nullptr;
}

// What prepare_backward_strips leaves for launch_backward_strips: the strip dQ pass's maps
// (Q and dO with the query box; K and V with the union's box, a frame of it in 3-D; dQ's for
// the bulk store where it can be had, else per-lane stores) and the strip dK/dV pass's (Q
// and dO with the slab box of query lines, K and V with its key box, StripDkvKeyBox, dK's
// and dV's).
struct StripBackwardLaunch {
  CUtensorMap q, grad_out, k, v, dq;
  CUtensorMap kv_q, kv_do, kv_k, kv_v, dk, dv;
  int heads_outer;  // Params::map_heads_outer of the maps (both passes' agree: same strides)
  int dq_map;       // Params::out_map of the dQ pass: 1 when dQ's map is encoded
  int dkv_maps;     // ... of the dK/dV pass: 1 when dK's and dV's are
};
static_assert(sizeof(StripBackwardLaunch) <= kPrepareBytes, "workspace too small");

// Whether a strip pair's backward runs its own dK/dV pass (backward_dkv_strips.cuh), else
// the tensor-core family's: its own wherever the KV head's query heads' RPB tables fit what
// it stages (4096 entries). Until its dRPB adds lost their branch per score, tc's ran with an
// RPB at head dim 64 (video-3d f+b 1.257 vs 1.283 ms, H100); since then the strip pass leads
// there too (H100, GPU ms, f+b with an RPB, own vs tc's: video-3d 1.167 vs 1.211, 28x28 7x7
// dilation 4 B32 D64 0.156 vs 0.157; PERF.md fifty-seventh session).
// NATTN_SM90_STRIP_DKV=tc / =own (read on every call) picks one.
inline bool strip_dkv_own(const Params& p) {
  const char* pick = getenv("NATTN_SM90_STRIP_DKV");
  const bool fits = p.rpb == nullptr || int64_t(p.groups) * p.rpb_head_size <= kSmallRpbStageFloats;
  if (pick && !strcmp(pick, "tc")) return false;
  return fits;  // (=own: the default)
}

// A strip pair's backward: its own dQ pass (backward_dq_strips.cuh) and dK/dV pass
// (backward_dkv_strips.cuh), or the tensor-core family's dK/dV pass (strip_dkv_own). Declines
// what the strip forward declines.
template <typename T, int NA, int HD, class Tl>
const char* prepare_backward_strips(const Params& p, void* workspace) {
  if (p.dim != HD || p.dim_v != HD) return "head dims must both equal the instance's (32 or 64)";
  using DkvBox = StripDkvKeyBox<NA>;
  int qbox[3], kbox[3], dkv_box[3];
  for (int a = 0; a < 3; ++a) {
    qbox[a] = Tl::Q::extent(a);
    kbox[a] = Tl::K::extent(a);
    dkv_box[a] = DkvBox::extent(a);
  }
  if (const char* why = strip_declines(p, qbox, kbox)) return why;
  strip_key_map_box(NA, kbox);
  if (p.rpb && p.rpb_head_size > kSmallRpbStageFloats)
    return "an RPB table above 4096 entries per head needs a 128-query tile pair (64-query pairs stage it in shared memory)";
  if (num_cta_tiles<typename Tl::Q>(p) > 0x7fffffff || num_key_ctas<DkvBox>(p) > 0x7fffffff)
    return "too many query or key boxes for the grid";
  // The dK/dV pass finds a query's LSE / delta row in its batch entry as a 32-bit offset.
  if (p.tokens * p.heads > 0x7fffffff) return "more than 2^31 - 1 tokens x heads per batch entry";
  const int lines[3] = {StripLineBox<NA>::extent(0), StripLineBox<NA>::extent(1), StripLineBox<NA>::extent(2)};
  StripBackwardLaunch* l = static_cast<StripBackwardLaunch*>(workspace);
  const MapRequest maps[] = {
      {"q", kRowsQ, &l->q, p.q_s, p.q, p.heads, qbox},
      {"grad_out", kRowsGradOut, &l->grad_out, p.grad_out_s, p.grad_out, p.heads, qbox},
      {"k", kRowsK, &l->k, p.k_s, p.k, p.heads_kv, kbox},
      {"v", kRowsV, &l->v, p.v_s, p.v, p.heads_kv, kbox},
      {"q", kRowsQ, &l->kv_q, p.q_s, p.q, p.heads, lines},
      {"grad_out", kRowsGradOut, &l->kv_do, p.grad_out_s, p.grad_out, p.heads, lines},
      {"k", kRowsK, &l->kv_k, p.k_s, p.k, p.heads_kv, dkv_box},
      {"v", kRowsV, &l->kv_v, p.v_s, p.v, p.heads_kv, dkv_box},
  };
  l->heads_outer = 0;
  if (const char* why = encode_maps<HD, T>(p, maps, l->heads_outer)) return why;
  l->dq_map = encode_store_map<HD, T>(p, p.dq_s, p.dq, p.heads, qbox, &l->dq, kRowsGradQ, l->heads_outer);
  const bool dk_map = encode_store_map<HD, T>(p, p.dk_s, p.dk, p.heads_kv, dkv_box, &l->dk, kRowsGradK, l->heads_outer);
  const bool dv_map = encode_store_map<HD, T>(p, p.dv_s, p.dv, p.heads_kv, dkv_box, &l->dv, kRowsGradV, l->heads_outer);
  l->dkv_maps = dk_map && dv_map;
  return nullptr;
}

// The box pair whose dK/dV pass (backward_dkv.cuh) may follow the square dQ pass at head dim
// 64 without an RPB when named (NATTN_SM90_SQUARE_DKV=box; the 32x4 / 7x16 pair, the default
// backward of 2-D windows of 10 to 13 before the square pair's; no RPB paths).
using SquareDkvPair = Tile<32, 4, 1, 7, 16, 1>;
template <int HD>
constexpr bool kSquareBoxDkv = HD == 64;

// The dK/dV pass after the square dQ pass: its own (backward_dkv_squares.cuh) wherever the
// KV head's query heads' RPB tables fit what it stages (4096 entries), except at head dim 64
// with an RPB below 13 x 13 windows (the tensor-core family's). H100, GPU ms, forward +
// backward, own against the one it replaced (PERF.md sixty-fifth to sixty-seventh sessions):
//   head dim 32: 64x64 13x13 B8 H8 0.263 vs 0.331 (tc), 56x56 11x11 B32 H4 0.359 vs 0.405,
//     56x56 9x9 0.311 vs 0.350, 28x28 11x11 B32 H8 0.233 vs 0.245; with an RPB 0.375 vs
//     0.433, 0.499 vs 0.528, 0.428 vs 0.453, 0.327 vs 0.321 (the one loss, 2%);
//   head dim 64 (three CTAs an SM, 168 registers): mid-2d 0.818 vs 0.870 (the box pair's),
//     128x128 11x11 0.769 vs 0.831, 56x56 9x9 B32 H4 0.533 vs 0.623, 64x64 13x13 B8 H8
//     0.444 vs 0.467 (at two CTAs an SM, 226 registers, it lost on the large grids); with
//     an RPB (two CTAs an SM: 210 registers) mid-2d 1.170 vs 1.248 (tc), 64x64 13x13 0.610
//     vs 0.656, but 128x128 11x11 1.071 vs 1.059 and 56x56 9x9 0.698 vs 0.685.
// NATTN_SM90_SQUARE_DKV=own / box / tc (read on every call) picks one for A/B runs; box falls
// back to tc where it cannot run (head dim 32, an RPB), own where the tables do not fit.
enum SquareDkvPass { kSquareDkvTc = 0, kSquareDkvBox = 1, kSquareDkvOwn = 2 };
inline SquareDkvPass square_dkv_pass(const Params& p) {
  const char* pick = getenv("NATTN_SM90_SQUARE_DKV");
  const bool fits = p.rpb == nullptr || int64_t(p.groups) * p.rpb_head_size <= kSmallRpbStageFloats;
  if (pick && !strcmp(pick, "tc")) return kSquareDkvTc;
  if (pick && !strcmp(pick, "box")) return kSquareDkvBox;
  const bool named_own = pick && !strcmp(pick, "own");
  const bool widest = p.kernel[0] >= kSquareMaxKernel && p.kernel[1] >= kSquareMaxKernel;
  if (p.dim > 32 && !named_own && p.rpb && !widest) return kSquareDkvTc;
  return fits ? kSquareDkvOwn : kSquareDkvTc;
}

// The own pass's key box (SquareDkvBox, square_geometry.cuh): 4 x 16 without an RPB where the
// column axis' dilation groups are at least kSquareDkvWideMinWindows windows long, else 8 x 8.
// In the 4 x 16 box every warp walks the same union rows, so none waits at a slab's end (the
// 8 x 8 box's barriers are 16.5% of the pass's stall samples on mid-2d, ncu); on small grids,
// where most boxes are near a border, it lost. H100, bf16, GPU ms, forward + backward, 4 x 16
// vs 8 x 8, two rounds (PERF.md sixty-ninth session): mid-2d 0.776 / 0.773 vs 0.792 / 0.787,
// 128x128 11x11 B4 H8 D64 0.729 / 0.716 vs 0.745 / 0.736, 56x56 9x9 B32 H4 D64 0.507 / 0.508
// vs 0.514 / 0.514, 96x96 13x13 B4 H8 D32 0.279 vs 0.284; ties at 4.9 and 5.1 windows (64x64
// 13x13 B8 H8 D64 0.431 vs 0.430, D32 0.256 vs 0.258; 56x56 11x11 B32 H4 D32 0.358 vs 0.356);
// a loss at 2.5 (32x32 13x13 B32 H8 D64 0.462 / 0.458 vs 0.443 / 0.442). With an RPB (not
// timed) the 8 x 8 box stays. NATTN_SM90_SQUARE_DKV_BOX=8x8 / 4x16 (read on every call) names
// one for A/B runs.
constexpr int kSquareDkvWideMinWindows = 6;
inline bool square_dkv_wide(const Params& p) {
  const char* pick = getenv("NATTN_SM90_SQUARE_DKV_BOX");
  if (pick && !strcmp(pick, "4x16")) return true;
  if (pick && !strcmp(pick, "8x8")) return false;
  return !p.rpb && p.spatial[1] / p.dilation[1] >= kSquareDkvWideMinWindows * p.kernel[1];
}
// The chosen box's key CTAs (the pass's grid).
inline int64_t square_dkv_key_ctas(const Params& p, bool wide) {
  return wide ? num_key_ctas<SquareDkvBox<true>::Keys>(p) : num_key_ctas<SquareDkvBox<false>::Keys>(p);
}

// What prepare_backward_squares leaves for launch_backward_squares: the square dQ pass's
// maps (Q and dO with the query box, K and V with a part of the union's box; dQ's for the
// bulk store where it can be had, else per-lane stores), and the dK/dV pass's: its own (K and
// V with its 8 x 8 key box, Q and dO with the slab box, dK's and dV's for the bulk stores) or
// the box pair's (K and V with its CTA's key rows, Q and dO with its query box).
struct SquareBackwardLaunch {
  CUtensorMap q, grad_out, k, v, dq;
  CUtensorMap kv_k, kv_v, kv_q, kv_do, dk, dv;
  int heads_outer;  // Params::map_heads_outer of the maps
  int dq_map;       // Params::out_map of the dQ pass: 1 when dQ's map is encoded
  int dkv;          // SquareDkvPass
  int dkv_maps;     // own pass: Params::out_map (1 when dK's and dV's maps are encoded)
  int slab_cols;    // own pass: the slab width (square_dkv_slab_cols)
  int wide;         // own pass: 1 with the 4 x 16 key box (square_dkv_wide)
};
static_assert(sizeof(SquareBackwardLaunch) <= kPrepareBytes, "workspace too small");

// The square pair's backward: its own dQ pass (backward_dq_squares.cuh), then a dK/dV pass
// (square_dkv_pass). Declines what the square forward declines.
template <typename T, int NA, int HD, class Tl>
const char* prepare_backward_squares(const Params& p, void* workspace) {
  if (p.dim != HD || p.dim_v != HD) return "head dims must both equal the instance's (32 or 64)";
  if (const char* why = square_declines(p)) return why;
  if (p.rpb && p.rpb_head_size > kSmallRpbStageFloats)
    return "an RPB table above 4096 entries per head needs a 128-query tile pair (64-query pairs stage it in shared memory)";
  if (num_cta_tiles<typename Tl::Q>(p) > 0x7fffffff) return "too many query boxes for the grid";
  int qbox[3], kbox[3];
  for (int a = 0; a < 3; ++a) {
    qbox[a] = Tl::Q::extent(a);
    kbox[a] = Tl::K::extent(a);
  }
  square_key_map_box(kbox);
  SquareBackwardLaunch* l = static_cast<SquareBackwardLaunch*>(workspace);
  const MapRequest maps[] = {
      {"q", kRowsQ, &l->q, p.q_s, p.q, p.heads, qbox},
      {"grad_out", kRowsGradOut, &l->grad_out, p.grad_out_s, p.grad_out, p.heads, qbox},
      {"k", kRowsK, &l->k, p.k_s, p.k, p.heads_kv, kbox},
      {"v", kRowsV, &l->v, p.v_s, p.v, p.heads_kv, kbox},
  };
  l->heads_outer = 0;
  if (const char* why = encode_maps<HD, T>(p, maps, l->heads_outer)) return why;
  l->dq_map = encode_store_map<HD, T>(p, p.dq_s, p.dq, p.heads, qbox, &l->dq, kRowsGradQ, l->heads_outer);
  // (the own and box passes find a query's LSE / delta row in its batch entry as a 32-bit
  // offset; the tensor-core pass takes larger problems)
  l->dkv = p.tokens * p.heads <= 0x7fffffff ? square_dkv_pass(p) : kSquareDkvTc;
  l->dkv_maps = 0;
  l->slab_cols = 0;
  l->wide = square_dkv_wide(p);
  // (the same tensors and strides: a pass runs where its maps encode with the launch's
  // heads-outer bits, else the tensor-core pass)
  int outer = l->heads_outer;
  if (l->dkv == kSquareDkvOwn && square_dkv_key_ctas(p, l->wide) > 0x7fffffff) l->dkv = kSquareDkvTc;
  if (l->dkv == kSquareDkvOwn) {
    const SquareDkvShape box = square_dkv_shape(l->wide);
    l->slab_cols = square_dkv_slab_cols(p, box.cols);
    const int keys[3] = {box.rows, box.cols, 1};
    const int slab[3] = {square_dkv_slab_rows(l->slab_cols, kSquareDkvSlabTokensAt<HD>), l->slab_cols, 1};
    const MapRequest own_maps[] = {
        {"q", kRowsQ, &l->kv_q, p.q_s, p.q, p.heads, slab},
        {"grad_out", kRowsGradOut, &l->kv_do, p.grad_out_s, p.grad_out, p.heads, slab},
        {"k", kRowsK, &l->kv_k, p.k_s, p.k, p.heads_kv, keys},
        {"v", kRowsV, &l->kv_v, p.v_s, p.v, p.heads_kv, keys},
    };
    if (l->slab_cols > box.max_slab_cols || encode_maps<HD, T>(p, own_maps, outer) != nullptr || outer != l->heads_outer) {
      l->dkv = kSquareDkvTc;
    } else {
      const bool dk_map = encode_store_map<HD, T>(p, p.dk_s, p.dk, p.heads_kv, keys, &l->dk, kRowsGradK, l->heads_outer);
      const bool dv_map = encode_store_map<HD, T>(p, p.dv_s, p.dv, p.heads_kv, keys, &l->dv, kRowsGradV, l->heads_outer);
      l->dkv_maps = dk_map && dv_map;
    }
  }
  if (l->dkv == kSquareDkvBox) {
    l->dkv = kSquareDkvTc;
    if constexpr (kSquareBoxDkv<HD>) {
      using P = SquareDkvPair;
      // (the box pair's limits: prepare_backward_boxes)
      if (!p.rpb && num_key_ctas<typename P::Q>(p) * (DkvCta<T, NA, P, HD, false>::kSplit ? 2 : 1) <= 0x7fffffff) {
        int kv_rows[3], qrows[3];
        for (int a = 0; a < 3; ++a) {
          kv_rows[a] = DkvCta<T, NA, P, HD, false>::Half::extent(a);
          qrows[a] = P::K::extent(a);
        }
        const MapRequest box_maps[] = {
            {"k", kRowsK, &l->kv_k, p.k_s, p.k, p.heads_kv, kv_rows},
            {"v", kRowsV, &l->kv_v, p.v_s, p.v, p.heads_kv, kv_rows},
            {"q", kRowsQ, &l->kv_q, p.q_s, p.q, p.heads, qrows},
            {"grad_out", kRowsGradOut, &l->kv_do, p.grad_out_s, p.grad_out, p.heads, qrows},
        };
        if (encode_maps<HD, T>(p, box_maps, outer) == nullptr && outer == l->heads_outer) l->dkv = kSquareDkvBox;
      }
    }
  }
  return nullptr;
}

// The backward pairs' (a 128-token box and a 64-token box, or at head dims up to 64 a
// 96- or 112-token one: backward_dq.cuh, backward_dkv.cuh).
template <typename T, int NA, int HD, class Tl>
const char* prepare_backward_boxes(const Params& p, void* workspace) {
  if (p.dim != HD || p.dim_v != HD) return "head dims must both equal the instance's (32, 64, 128 or 256)";
  static_assert(Tl::Q::kSize == kQueryRows && (Tl::K::kSize == 64 || ((Tl::K::kSize == 96 || Tl::K::kSize == 112) && HD <= 64)),
                "the backward pairs a 128-token box with a 64-token box (or a 96- or 112-token one at head dims <= 64)");
  // 96- and 112-token column boxes: no RPB paths (with them the dK/dV pass spilled; backward_dkv.cuh).
  if (Tl::K::kSize > kWgRows && p.rpb) return "this tile pair's backward takes no RPB (96- or 112-token column boxes)";
  // Head dim 256 (backward_wide.cuh) uses the 64-token box on both sides of both passes.
  constexpr bool kWide = HD == kWideHeadDim;
  if (kWide && p.rpb && int64_t(p.groups) * p.rpb_head_size * 4 > DkvWideSmem::kDrpbRoom) {
    static thread_local char msg[200];
    snprintf(msg, sizeof msg, "head dim 256: the RPB tables of a KV head's query heads (%lld entries) must fit "
             "the dK/dV pass's shared memory (%d entries)", (long long)(int64_t(p.groups) * p.rpb_head_size),
             DkvWideSmem::kDrpbRoom / 4);
    return msg;
  }
  // The dK/dV pass's LSE / delta loader finds a row as a 32-bit offset (backward_dkv.cuh).
  if (p.tokens * p.heads > 0x7fffffff) return "more than 2^31 - 1 tokens x heads per batch entry";
  if (NA == 3)  // the dK/dV pass keeps 3-D window bounds as 16-bit pairs (backward_dkv.cuh)
    for (int a = 0; a < 3; ++a)
      if (p.spatial[a] > 32767) return "3-D axes above 32767 tokens";
  // dq_rows / kv_rows: what one copy of a dQ pass CTA holds of Q and dO, of a dK/dV pass
  // CTA of K and V (half the 128-token box where those CTAs split it: DqCta, DkvCta)
  int big[3], small[3], dq_rows[3], kv_rows[3];
  for (int a = 0; a < 3; ++a) {
    big[a] = kWide ? Tl::K::extent(a) : Tl::Q::extent(a);
    small[a] = Tl::K::extent(a);
    dq_rows[a] = kWide ? big[a] : DqCta<Tl, HD>::Half::extent(a);
    kv_rows[a] = kWide ? big[a] : DkvCta<T, NA, Tl, HD, false>::Half::extent(a);
  }
  BackwardLaunch* l = static_cast<BackwardLaunch*>(workspace);
  const MapRequest maps[] = {
      {"q", kRowsQ, &l->dq_q, p.q_s, p.q, p.heads, dq_rows},
      {"grad_out", kRowsGradOut, &l->dq_do, p.grad_out_s, p.grad_out, p.heads, dq_rows},
      {"k", kRowsK, &l->dq_k, p.k_s, p.k, p.heads_kv, small},
      {"v", kRowsV, &l->dq_v, p.v_s, p.v, p.heads_kv, small},
      {"k", kRowsK, &l->kv_k, p.k_s, p.k, p.heads_kv, kv_rows},
      {"v", kRowsV, &l->kv_v, p.v_s, p.v, p.heads_kv, kv_rows},
      {"q", kRowsQ, &l->kv_q, p.q_s, p.q, p.heads, small},
      {"grad_out", kRowsGradOut, &l->kv_do, p.grad_out_s, p.grad_out, p.heads, small},
  };
  l->heads_outer = 0;
  using CtaBox = typename std::conditional<kWide, typename Tl::K, typename Tl::Q>::type;
  // (split CTAs: two a box; head dim 256 never splits)
  if (num_key_ctas<CtaBox>(p) * (DkvCta<T, NA, Tl, HD, false>::kSplit ? 2 : 1) > 0x7fffffff ||
      num_cta_tiles<CtaBox>(p) * (DqCta<Tl, HD>::kSplit ? 2 : 1) > 0x7fffffff)
    return "too many query or key boxes for the grid";
  if (int64_t(p.batch) * p.tokens * p.heads * (HD / 8) / kDeltaThreads >= 0x7fffffff) return "too many rows for the grid";
  return encode_maps<HD, T>(p, maps, l->heads_outer);
}

template <typename T, int NA, int HD, class Tl>
const char* prepare_backward(const Params& p, void* workspace) {
  if constexpr (Tl::kStrips) {
    return prepare_backward_strips<T, NA, HD, Tl>(p, workspace);
  } else if constexpr (Tl::kSquares) {
    return prepare_backward_squares<T, NA, HD, Tl>(p, workspace);
  } else {
    return prepare_backward_boxes<T, NA, HD, Tl>(p, workspace);
  }
}

// Whether the backward accumulates dQ from the dK/dV pass (fp32 reductions, KV-parallel,
// not bitwise reproducible) instead of its own deterministic pass (the default): the call's
// dq_mode (2: KV-parallel, 1: the pass), else NATTN_SM90_DQ=atomic (read on every call).
inline bool dq_atomic_requested(const Params& p) {
  if (p.dq_mode) return p.dq_mode == 2;
  const char* mode = getenv("NATTN_SM90_DQ");
  return mode && !strcmp(mode, "atomic");
}

// The KV-parallel dQ stages a 64-query box per warpgroup (DqStage): pairs with 96-token
// column boxes run the deterministic pass whatever the call asks.
template <class Tl>
constexpr bool kHasAtomicDq = Tl::K::kSize == kWgRows;

// The backward's kernels on the caller's stream (launch_backward, at the end), by head dim.
// Head dim 256 (backward_wide.cuh): delta, the wide dQ pass, the wide dK/dV pass; always
// the deterministic dQ (no KV-parallel mode at this head dim).
template <typename T, int NA, class Tl>
void launch_backward_wide(const Params& problem, cudaStream_t stream) {
  using B = typename Tl::K;
  const BackwardLaunch* l = static_cast<const BackwardLaunch*>(problem.prepared);
  Params p = problem;
  p.map_heads_outer = l->heads_outer;
  set_query_boxes<B>(p);
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] {  // `&`, not `&&`: both kernels, whatever the first returns
    return allow_smem(backward_dq_wide_kernel<T, NA, Tl>, DqWideSmem::kAlloc) &
           allow_smem(backward_dkv_wide_kernel<T, NA, Tl>, DkvWideSmem::kAllocFixed + DkvWideSmem::kDrpbRoom);
  });
  launch_delta<T, kWideHeadDim>(problem, stream);
  // prepare_backward declined tables above the room: a staged one sums in fixed point
  const int64_t rpb_bytes = drpb_stage_bytes(p);
  const bool fixed = rpb_bytes > 0 && drpb_fixed_begin(p, stream);
  p.rpb_in_smem = fixed;
  const dim3 dq_grid(unsigned(num_cta_tiles<B>(problem)), problem.heads, problem.batch);
  backward_dq_wide_kernel<T, NA, Tl><<<dq_grid, kThreads, DqWideSmem::kAlloc, stream>>>(p, l->dq_q, l->dq_do, l->dq_k,
                                                                                     l->dq_v);
  const dim3 dkv_grid(unsigned(num_key_ctas<B>(problem)), p.heads_kv, p.batch);
  backward_dkv_wide_kernel<T, NA, Tl><<<dkv_grid, kThreads, DkvWideSmem::kAllocFixed + size_t(fixed ? rpb_bytes : 0),
                                        stream>>>(p, l->kv_k, l->kv_v, l->kv_q, l->kv_do);
  if (fixed) drpb_fixed_end(p, kDrpbFixedBits, stream);
}

// Head dims 32 to 128: delta, then either the dQ pass and the dK/dV pass, or (KV-parallel)
// a zeroed fp32 dQ buffer (stream-ordered allocation), the dK/dV pass adding into it, and
// the conversion to dQ.
template <typename T, int NA, int HD, class Tl>
void launch_backward_narrow(const Params& problem, cudaStream_t stream) {
  const BackwardLaunch* l = static_cast<const BackwardLaunch*>(problem.prepared);
  Params p = problem;
  p.map_heads_outer = l->heads_outer;
  set_query_boxes<typename Tl::Q>(p);  // the dQ pass's decode
  using DqC = DqCta<Tl, HD>;
  using Dq = DqSmem<HD, Tl::K::kSize, DqC::kRows>;
  using DkvC = DkvCta<T, NA, Tl, HD, false>;
  using Dkv = DkvSmem<HD, Tl::K::kSize, false, DkvC::kRows>;
  using DkvAtomic = DkvSmem<HD, Tl::K::kSize, true>;
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] {
    bool ok = allow_smem(backward_dq_kernel<T, NA, HD, Tl>, Dq::kAlloc) &
              allow_smem(backward_dkv_kernel<T, NA, HD, Tl, false>, Dkv::kAllocFixed + Dkv::kDrpbRoom);
    if constexpr (kHasAtomicDq<Tl>)
      ok &= allow_smem(backward_dkv_kernel<T, NA, HD, Tl, true>, DkvAtomic::kAllocFixed + DkvAtomic::kDrpbRoom);
    return ok;
  });
  const int64_t rows = int64_t(problem.batch) * problem.tokens * problem.heads;
  const unsigned row_blocks = unsigned((rows * (HD / 8) + kDeltaThreads - 1) / kDeltaThreads);  // dq_convert_kernel's
  // the dQ pass: the query range's boxes (kSplit: a CTA per half box)
  const unsigned ctas = unsigned(num_cta_tiles<typename Tl::Q>(problem) * (DqC::kSplit ? 2 : 1));
  const int64_t rpb_bytes = drpb_stage_bytes(p);
  const unsigned key_ctas = unsigned(num_key_ctas<typename Tl::Q>(problem));  // every key box
  const dim3 dkv_grid(key_ctas, p.heads_kv, p.batch);
  const dim3 dkv_split_grid(key_ctas * (DkvC::kSplit ? 2 : 1), p.heads_kv, p.batch);
  p.dq_accum = nullptr;
  const size_t accum_bytes = size_t(rows) * HD * sizeof(float);
  if constexpr (kHasAtomicDq<Tl>) {
    if (dq_atomic_requested(problem) && cudaMallocAsync(reinterpret_cast<void**>(&p.dq_accum), accum_bytes, stream) == cudaSuccess) {
      // The fp32 sums' tensor map ([B, *spatial, H, D], packed): one query box of half a
      // warpgroup's channels per reduction.
      int64_t s[5];
      s[4] = HD;
      int64_t stride = int64_t(p.heads) * HD;
      for (int a = p.na_dim - 1; a >= 0; --a) {
        s[1 + a] = stride;
        stride *= p.spatial[a];
      }
      s[0] = stride;
      int box[3];
      for (int a = 0; a < 3; ++a) box[a] = Tl::K::extent(a);
      MapSpec spec;
      CUtensorMap map_dq;
      const char* why = map_spec(p, s, p.heads, HD, box, spec, 4, DqStage<HD>::kInner, false);
      if (!why) why = encode(&map_dq, spec, p.dq_accum, MapType::kFloat);
      if (!why) {
        p.rpb_in_smem = rpb_bytes > 0 && rpb_bytes <= DkvAtomic::kDrpbRoom;
        const size_t smem = DkvAtomic::kAllocFixed + size_t(p.rpb_in_smem ? rpb_bytes : 0);
        launch_delta<T, HD>(problem, stream);
        cudaMemsetAsync(p.dq_accum, 0, accum_bytes, stream);
        backward_dkv_kernel<T, NA, HD, Tl, true><<<dkv_grid, kThreads, smem, stream>>>(p, l->kv_k, l->kv_v, l->kv_q,
                                                                                       l->kv_do, map_dq);
        dq_convert_kernel<T, HD><<<row_blocks, kDeltaThreads, 0, stream>>>(p);
        cudaFreeAsync(p.dq_accum, stream);
        return;
      }
      cudaFreeAsync(p.dq_accum, stream);  // a map the copy engine refused: the deterministic pass
      p.dq_accum = nullptr;
    }
  }
  (void)cudaGetLastError();  // a failed allocation: the deterministic pass instead
  // The dQ pass computes delta from its staged dO rows (one O read, no kernel before it)
  // unless the call has a query range: the dK/dV pass's query boxes then reach rows of boxes
  // no dQ CTA runs (whose LSE is +inf: their delta must be finite), which the kernel fills.
  p.delta_in_dq = !has_query_range(p);
  if (!p.delta_in_dq) launch_delta<T, HD>(problem, stream);
  // A staged dRPB sums in fixed point (common/drpb_fixed.cuh: deterministic, native integer
  // atomics): the dQ pass records each query head's largest |dS| first. Without the
  // workspace the dK/dV pass adds float32 into global memory.
  const bool fixed = rpb_bytes > 0 && drpb_fixed_begin(p, stream);
  p.rpb_in_smem = fixed;
  backward_dq_kernel<T, NA, HD, Tl><<<dim3(ctas, problem.heads, problem.batch), DqC::kThreads, Dq::kAlloc, stream>>>(
      p, l->dq_q, l->dq_do, l->dq_k, l->dq_v);
  backward_dkv_kernel<T, NA, HD, Tl, false><<<dkv_split_grid, DkvC::kThreads, Dkv::kAllocFixed + size_t(fixed ? rpb_bytes : 0),
                                              stream>>>(p, l->kv_k, l->kv_v, l->kv_q, l->kv_do, l->kv_q);
  if (fixed) drpb_fixed_end(p, kDrpbFixedBits, stream);
}

// Launches a pass that reads what the kernel before it in the stream wrote (the dK/dV pass
// after the dQ pass). With NATTN_SM90_PDL (ptx.cuh) as a programmatic dependent: its CTAs may
// start while the last ones of the kernel before still run, and wait (griddep_wait) before
// reading its results; where the driver refuses the attribute, an ordinary launch.
template <typename... Expected, typename... Args>
void launch_dependent(void (*kernel)(Expected...), dim3 grid, dim3 block, int smem, cudaStream_t stream,
                      Args&&... args) {
#if NATTN_SM90_PDL
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = size_t(smem);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  if (cudaLaunchKernelEx(&config, kernel, args...) == cudaSuccess) return;
  cudaGetLastError();  // (cleared: the ordinary launch below reports its own)
#endif
  kernel<<<grid, block, smem, stream>>>(args...);
}

// A strip pair's backward: the strip dQ pass (which computes and writes its rows' delta and,
// with a fixed-point dRPB, records each query head's largest |dS| first), then a dK/dV pass
// (strip_dkv_own: the strip one, or the tensor-core family's, instantiated in this
// translation unit: a build may leave the tc family out) and dRPB's finish. Every step is
// deterministic.
template <typename T, int NA, int HD, class Tl>
void launch_backward_strips(const Params& problem, cudaStream_t stream) {
  const StripBackwardLaunch* l = static_cast<const StripBackwardLaunch*>(problem.prepared);
  Params p = problem;
  p.map_heads_outer = l->heads_outer;
  p.out_map = l->dq_map;
  set_query_boxes<typename Tl::Q>(p);
  using S = StripSmem<Tl, HD, 2>;
  using Sk = StripDkvSmem<NA, HD>;
  constexpr int most = S::kAlloc + S::kRpbFloats * int(sizeof(float));
  constexpr int most_dkv = Sk::kAlloc + kStripDrpbMostBytes;
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] {
    return allow_smem(backward_dq_strips_kernel<T, NA, HD, Tl>, most) &
           allow_smem(backward_dkv_strips_kernel<T, NA, HD, Tl, true>, most_dkv) &
           allow_smem(backward_dkv_strips_kernel<T, NA, HD, Tl, false>, Sk::kAlloc);
  });
  const bool own = strip_dkv_own(p);
  // A staged dRPB sums in fixed point (common/drpb_fixed.cuh) where its workspace can be had.
  const bool stage_drpb = own ? p.rpb != nullptr : drpb_stage_bytes(p) > 0;
  const bool fixed = stage_drpb && drpb_fixed_begin(p, stream);
  const int rpb_floats = p.rpb ? int(p.rpb_head_size) + 2 * StripCta<Tl, HD>::kRpbGuard : 0;
  const int smem = S::kAlloc + rpb_floats * int(sizeof(float));
  const dim3 grid(unsigned(num_cta_tiles<typename Tl::Q>(p)), unsigned(p.heads), unsigned(p.batch));
  // With a query range the dQ pass runs only the boxes holding the range's queries, so it
  // writes only their rows' delta, while either dK/dV pass reads the delta of every query
  // its keys reach. The others (LSE +inf, a zero output gradient) need a finite delta: the
  // delta kernel writes every row first (as the box pairs' launcher does), and the dQ pass
  // then rewrites its own rows. (Without it those rows kept what the buffer held: NaN in
  // dK inside the GPU tier, where freed blocks held NaN; PERF.md forty-eighth session.)
  if (has_query_range(p)) launch_delta<T, HD>(p, stream);
  backward_dq_strips_kernel<T, NA, HD, Tl><<<grid, StripCta<Tl, HD>::kThreads, smem, stream>>>(p, l->q, l->grad_out,
                                                                                                l->k, l->v, l->dq);
  if (own) {
    Params pk = p;
    pk.out_map = l->dkv_maps;
    // the query heads' RPB tables and their dRPB tables in shared memory
    const int entries = int(p.groups * p.rpb_head_size);
    const int tables = p.rpb ? strip_drpb_layout(entries).bytes : 0;
    const dim3 kgrid(unsigned(num_key_ctas<StripDkvKeyBox<NA>>(p)), unsigned(p.heads_kv), unsigned(p.batch));
    auto dkv = p.rpb ? backward_dkv_strips_kernel<T, NA, HD, Tl, true> : backward_dkv_strips_kernel<T, NA, HD, Tl, false>;
    launch_dependent(dkv, kgrid, dim3(128), Sk::kAlloc + tables, stream, pk, l->kv_q, l->kv_do, l->kv_k, l->kv_v, l->dk,
                     l->dv);
    if (fixed) drpb_fixed_end(p, kStripDrpbBits, stream);
    return;
  }
  tc::launch_dkv_pass<T, NA, HD, false>(p, fixed ? drpb_stage_bytes(p) : 0, stream);
  if (fixed) drpb_fixed_end(p, tc::dkv_fixed_bits<T, HD>(), stream);
}

// The persistent square dQ pass (build switch NATTN_SM90_SQUARE_DQ_PERSIST; dQ from the
// registers, not through dQ's map).
template <typename T, int NA, int HD, class Tl>
void launch_dq_square_runs(const Params& p, const SquareBackwardLaunch& l, cudaStream_t stream) {
  using S = SquareRunSmem<Tl, HD, 1>;
  constexpr int most = S::kAlloc + S::kRpbFloats * int(sizeof(float));
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] { return allow_smem(backward_dq_squares_run_kernel<T, NA, HD, Tl>, most); });
  const int rpb_floats = p.rpb ? int(p.rpb_head_size) + 2 * SquareCta<Tl, HD>::kRpbGuard : 0;
  const int smem = S::kAlloc + rpb_floats * int(sizeof(float));
  Params rp = p;
  const dim3 grid = square_run_grid(rp, num_cta_tiles<typename Tl::Q>(p), p.heads, smem, S::kMinBlocks);
  backward_dq_squares_run_kernel<T, NA, HD, Tl><<<grid, SquareCta<Tl, HD>::kThreads, smem, stream>>>(
      rp, l.q, l.grad_out, l.k, l.v);
}

// The persistent square dK/dV pass (build switch NATTN_SM90_SQUARE_DKV_PERSIST; calls without
// a query range): dK / dV from the registers, not through their maps.
template <typename T, int HD>
void launch_dkv_square_runs(const Params& pk, const SquareBackwardLaunch& l, int tables, cudaStream_t stream) {
  using S = SquareDkvRunSmem<HD>;
  constexpr int most = S::kAlloc + kStripDrpbMostBytes;
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] {
    return allow_smem(backward_dkv_squares_run_kernel<T, HD, true, false>, most) &
           allow_smem(backward_dkv_squares_run_kernel<T, HD, false, false>, S::kAlloc) &
           allow_smem(backward_dkv_squares_run_kernel<T, HD, true, true>, most) &
           allow_smem(backward_dkv_squares_run_kernel<T, HD, false, true>, S::kAlloc);
  });
  const int smem = S::kAlloc + tables;
  Params rp = pk;
  const int min_blocks = pk.rpb ? SquareDkvMinBlocks<HD, true>::value : SquareDkvMinBlocks<HD, false>::value;
  const dim3 grid = square_run_grid(rp, square_dkv_key_ctas(pk, l.wide), pk.heads_kv, smem, min_blocks);
  auto dkv = l.wide ? (pk.rpb ? backward_dkv_squares_run_kernel<T, HD, true, true> : backward_dkv_squares_run_kernel<T, HD, false, true>)
                    : (pk.rpb ? backward_dkv_squares_run_kernel<T, HD, true, false> : backward_dkv_squares_run_kernel<T, HD, false, false>);
  launch_dependent(dkv, grid, dim3(128), smem, stream, rp, l.kv_q, l.kv_do, l.kv_k, l.kv_v, l.slab_cols);
}

// The square pair's backward: the square dQ pass (which computes and writes its rows' delta
// and, with a fixed-point dRPB, records each query head's largest |dS| first), then the
// dK/dV pass SquareBackwardLaunch::dkv names (the tensor-core one is instantiated in this
// translation unit: a build may leave the tc family out) and dRPB's finish. Every step is
// deterministic.
template <typename T, int NA, int HD, class Tl>
void launch_backward_squares(const Params& problem, cudaStream_t stream) {
  const SquareBackwardLaunch* l = static_cast<const SquareBackwardLaunch*>(problem.prepared);
  Params p = problem;
  p.map_heads_outer = l->heads_outer;
  p.out_map = l->dq_map;
  set_query_boxes<typename Tl::Q>(p);
  using S = SquareSmem<Tl, HD, kSquareDqRing<HD>>;
  using Sk = SquareDkvSmem<HD>;
  constexpr int most = S::kAlloc + S::kRpbFloats * int(sizeof(float));
  constexpr int most_dkv = Sk::kAlloc + kStripDrpbMostBytes;
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] {
    return allow_smem(backward_dq_squares_kernel<T, NA, HD, Tl>, most) &
           allow_smem(backward_dkv_squares_kernel<T, HD, true, false>, most_dkv) &
           allow_smem(backward_dkv_squares_kernel<T, HD, false, false>, Sk::kAlloc) &
           allow_smem(backward_dkv_squares_kernel<T, HD, true, true>, most_dkv) &
           allow_smem(backward_dkv_squares_kernel<T, HD, false, true>, Sk::kAlloc);
  });
  const bool own = l->dkv == kSquareDkvOwn;
  // A staged dRPB sums in fixed point (common/drpb_fixed.cuh) where its workspace can be had.
  const int64_t rpb_bytes = drpb_stage_bytes(p);
  const bool fixed = (own ? p.rpb != nullptr : rpb_bytes > 0) && drpb_fixed_begin(p, stream);
  const int rpb_floats = p.rpb ? int(p.rpb_head_size) + 2 * SquareCta<Tl, HD>::kRpbGuard : 0;
  const int smem = S::kAlloc + rpb_floats * int(sizeof(float));
  const dim3 grid(unsigned(num_cta_tiles<typename Tl::Q>(p)), unsigned(p.heads), unsigned(p.batch));
  // With a query range the dK/dV pass reads the delta of rows no dQ CTA runs: the delta
  // kernel writes every row first (launch_backward_strips says why).
  if (has_query_range(p)) launch_delta<T, HD>(p, stream);
  if constexpr (kSquareDqPersist<HD>)
    launch_dq_square_runs<T, NA, HD, Tl>(p, *l, stream);
  else
    backward_dq_squares_kernel<T, NA, HD, Tl><<<grid, SquareCta<Tl, HD>::kThreads, smem, stream>>>(p, l->q, l->grad_out,
                                                                                                    l->k, l->v, l->dq);
  if (own) {
    Params pk = p;
    pk.out_map = l->dkv_maps;
    // the query heads' RPB tables and their dRPB tables in shared memory
    const int tables = p.rpb ? strip_drpb_layout(int(p.groups * p.rpb_head_size)).bytes : 0;
    const dim3 kgrid(unsigned(square_dkv_key_ctas(p, l->wide)), unsigned(p.heads_kv), unsigned(p.batch));
    if constexpr (kSquareDkvPersist) {
      if (!has_query_range(p)) {
        launch_dkv_square_runs<T, HD>(pk, *l, tables, stream);
        if (fixed) drpb_fixed_end(p, kStripDrpbBits, stream);
        return;
      }
    }
    auto dkv = l->wide ? (p.rpb ? backward_dkv_squares_kernel<T, HD, true, true> : backward_dkv_squares_kernel<T, HD, false, true>)
                       : (p.rpb ? backward_dkv_squares_kernel<T, HD, true, false> : backward_dkv_squares_kernel<T, HD, false, false>);
    launch_dependent(dkv, kgrid, dim3(128), Sk::kAlloc + tables, stream, pk, l->kv_q, l->kv_do, l->kv_k, l->kv_v, l->dk,
                     l->dv, l->slab_cols);
    if (fixed) drpb_fixed_end(p, kStripDrpbBits, stream);
    return;
  }
  if constexpr (kSquareBoxDkv<HD>) {
    if (l->dkv == kSquareDkvBox) {  // (no RPB: nothing staged, no dRPB to finish)
      using P = SquareDkvPair;
      using DkvC = DkvCta<T, NA, P, HD, false>;
      using Dkv = DkvSmem<HD, P::K::kSize, false, DkvC::kRows>;
      static std::atomic<uint64_t> box_opted{0};
      once_per_device(box_opted, [] { return allow_smem(backward_dkv_kernel<T, NA, HD, P, false>, Dkv::kAllocFixed); });
      const dim3 kgrid(unsigned(num_key_ctas<typename P::Q>(p)) * (DkvC::kSplit ? 2 : 1), unsigned(p.heads_kv),
                       unsigned(p.batch));
      backward_dkv_kernel<T, NA, HD, P, false><<<kgrid, DkvC::kThreads, Dkv::kAllocFixed, stream>>>(
          p, l->kv_k, l->kv_v, l->kv_q, l->kv_do, l->kv_q);
      return;
    }
  }
  tc::launch_dkv_pass<T, NA, HD, false>(p, fixed ? rpb_bytes : 0, stream);
  if (fixed) drpb_fixed_end(p, tc::dkv_fixed_bits<T, HD>(), stream);
}

// The backward's kernels on the caller's stream.
template <typename T, int NA, int HD, class Tl>
void launch_backward(const Params& problem, cudaStream_t stream) {
  if constexpr (Tl::kStrips) {
    launch_backward_strips<T, NA, HD, Tl>(problem, stream);
  } else if constexpr (Tl::kSquares) {
    launch_backward_squares<T, NA, HD, Tl>(problem, stream);
  } else if constexpr (HD == kWideHeadDim) {
    launch_backward_wide<T, NA, Tl>(problem, stream);
  } else {
    launch_backward_narrow<T, NA, HD, Tl>(problem, stream);
  }
}

}  }  // namespace nattn::sm90
