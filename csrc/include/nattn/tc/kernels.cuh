// Tensor-core (SM80+) fused neighborhood attention, fp16/bf16 with fp32 accumulation, and
// fp32 inputs through TF32 products (the float instances; below).
//
// A warp serves a box of 16 tokens (the mma M: 4x4 in 2-D, 2x2x4 in 3-D, 16 in 1-D) of one
// dilation group and walks the union of their windows packed, in chunks of 16 consecutive
// union tokens that may span line ends (common/tiling.cuh). Chunks are copied to shared
// memory with cp.async, two in flight, and read as mma fragments with ldmatrix; so are the
// warp's own rows (staged once). Scores, softmax and the per-token window masks live in the
// accumulator fragments; P (dS) is re-packed in registers as the A operand of the next
// product. No [N, N] or [N, window] tensor is ever written.
//
//   forward:  S = Q K^T, online softmax, O += P V; writes O and the LSE.
//   dQ pass:  S, dP = dO V^T, dS = P (dP - delta), dQ += dS K; writes dQ and delta.
//   dKV pass: per box of 16 keys over their inverse neighbourhoods (every query head of
//             the KV head): S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, dRPB.
//
// Attention dropout (Params::drop_rng set; docs/semantics.md) is a second instance of each
// kernel (kDrop): the forward's row sums and LSE use the unmasked P while the P that meets V
// is masked, its 1 / (1 - p) folded into the output's row factor; the dQ pass forms
// dS = P (m dP / (1 - p) - delta), delta = rowsum(dO * O) - dLSE with the dropped O; the
// dK/dV pass adds (m P)^T dO to dV (scaled by 1 / (1 - p) at the store) and the same dS to dK.
// The keep bits m come from tc/dropout.cuh. Calls without dropout run the kDrop = false
// instances, whose code is the same as without the feature.
//
// TF32 (the T = float instances; src/api.cu runs them for float32 inputs when the call allows
// TF32, PyTorch's torch.backends.cuda.matmul switch): the same kernels with fp32 tiles in
// shared memory (16-byte padded rows, twice the 16-bit bytes) and mma.sync m16n8k8 on TF32
// operands (cvt.rna.tf32.f32) with fp32 accumulation; softmax, the LSE, delta and every
// accumulator stay fp32 and the outputs are written as float32. S = Q K^T (and S^T, dP, dP^T)
// take both operands with ldmatrix (an 8x4 fp32 matrix per 8x8 16-bit one); the warp's own
// rows are rounded to TF32 once, in place, after staging. The products whose k dimension runs
// over the chunk's tokens (P V, dS K, P^T dO, dS^T Q) take P (dS) from the score fragments in
// registers with the k order "A column t = score column 2t, A column t + 4 = score column
// 2t + 1" and read the B rows (tokens 2t, 2t + 1 of a k-step) with 64-bit shared loads (two
// n-tiles' channels side by side), which the 4-float row padding keeps free of bank
// conflicts. fp32 tiles halve the warps a block holds at head dims >= 64 (block_warps): 2
// warps a block there, 4 below; dropout runs as in the 16-bit instances.
#pragma once
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "nattn/common/drpb.cuh"
#include "nattn/common/registry.h"
#include "nattn/common/softmax.cuh"
#include "nattn/common/tiling.cuh"
#include "nattn/common/window.cuh"
#include "nattn/tc/dropout.cuh"
#include "nattn/tc/launch.h"
#include "nattn/tc/mma.cuh"

namespace nattn { namespace tc {

using namespace nattn::tiling;

// Blocks per SM each kernel is compiled for (a register cap: 4 blocks of 128 threads = 128
// registers a thread, 3 = 168). Head dims <= 64; larger ones take what they need. Tuning
// builds override them with -D (benchmarks/build_variants.sh; PERF.md has the measurements).
#ifndef NATTN_TC_QUERY_BLOCKS  // forward and dQ
#define NATTN_TC_QUERY_BLOCKS 4
#endif
#ifndef NATTN_TC_QUERY_BLOCKS_HD32  // forward and dQ at head dims <= 32 (DiNAT)
#define NATTN_TC_QUERY_BLOCKS_HD32 NATTN_TC_QUERY_BLOCKS
#endif
#ifndef NATTN_TC_DKV_BLOCKS  // dK/dV
#define NATTN_TC_DKV_BLOCKS 3
#endif
#ifndef NATTN_TC_DKV_BLOCKS_HD32  // dK/dV at head dims <= 32, 16-bit, 1-D and 2-D (fits 128 registers)
#define NATTN_TC_DKV_BLOCKS_HD32 4
#endif
#ifndef NATTN_TC_DKV_BLOCKS_HD32_OTHER  // the same in 3-D and TF32 (4 blocks spilled 20 bytes there)
#define NATTN_TC_DKV_BLOCKS_HD32_OTHER NATTN_TC_DKV_BLOCKS
#endif

// Shared-memory stages of a warp's chunk ring: chunk ci is staged kTcStages - 1 chunks ahead of
// its products, hiding that much of the copy latency (a tuning build may try 3: per warp one
// more K/V pair of tiles, and with the backward's LSE/delta rows).
#ifndef NATTN_TC_STAGES
#define NATTN_TC_STAGES 2
#endif
constexpr int kTcStages = NATTN_TC_STAGES;
static_assert(kTcStages >= 2 && kTcStages <= 4, "NATTN_TC_STAGES: 2, 3 or 4");

// The ring slot of chunk ci (ci >= 0).
__device__ __forceinline__ int tc_stage(int ci) {
  if constexpr (kTcStages == 2) return ci & 1;
  else return int(unsigned(ci) % unsigned(kTcStages));
}

// The dropout instances (kDrop) hold the mask's Philox state besides the fragments: at head
// dims <= 64 they run fewer blocks per SM (more registers a thread) so that they do not spill
// (ptxas -v, sm_80: 4 blocks spilled every pass, 3 the dQ and dK/dV passes at head dim 64).
// Head dim 128 keeps the plain bounds (one block, 255 registers), where the dQ pass with
// dropout spills 8-32 bytes, as the plain one does 0-64 (its window ranges, reloaded per chunk).
#ifndef NATTN_TC_DROPOUT_BLOCKS_HD32  // every pass with dropout, head dims <= 32
#define NATTN_TC_DROPOUT_BLOCKS_HD32 3
#endif
#ifndef NATTN_TC_DROPOUT_FWD_BLOCKS  // forward with dropout, head dims 33..64
#define NATTN_TC_DROPOUT_FWD_BLOCKS 3
#endif
#ifndef NATTN_TC_DROPOUT_BWD_BLOCKS  // dQ and dK/dV passes with dropout, head dims 33..64
#define NATTN_TC_DROPOUT_BWD_BLOCKS 2
#endif

// TF32 instances (T = float) at head dims >= 64 run 2 warps a block (their fp32 tiles: a
// 4-warp block would need 165 KiB (forward) / 198 KiB (dQ pass) of shared memory at head dim
// 128, more than an SM80 block may have), with these blocks per SM (a register cap: with
// 2-warp blocks ptxas allows 168 registers a thread for 5, 255 for 4 or fewer; shared memory
// allows 5 forward / 4 backward blocks at head dim 64 and 2 at 128 on an H100). ptxas -v,
// sm_80: no TF32 instance spills (84-160 registers at head dims 16/32, 114-210 at 64, 150-248
// at 128). Head dims <= 32 keep the 16-bit instances' 4 warps and bounds.
#ifndef NATTN_TC_TF32_FWD_BLOCKS_HD64
#define NATTN_TC_TF32_FWD_BLOCKS_HD64 5
#endif
#ifndef NATTN_TC_TF32_BWD_BLOCKS_HD64  // dQ and dK/dV passes
#define NATTN_TC_TF32_BWD_BLOCKS_HD64 4
#endif
#ifndef NATTN_TC_TF32_BLOCKS_HD128  // every pass
#define NATTN_TC_TF32_BLOCKS_HD128 2
#endif

template <int HD>
constexpr int query_blocks() {
  return HD <= 32 ? NATTN_TC_QUERY_BLOCKS_HD32 : HD <= 64 ? NATTN_TC_QUERY_BLOCKS : 1;
}

template <typename T>
constexpr bool is_tf32() {
  return std::is_same<T, float>::value;
}

template <typename T, int NA, int HD>
constexpr int dkv_blocks() {
  return HD > 64   ? 2
         : HD > 32 ? NATTN_TC_DKV_BLOCKS
         : NA <= 2 && !is_tf32<T>() ? NATTN_TC_DKV_BLOCKS_HD32
                                    : NATTN_TC_DKV_BLOCKS_HD32_OTHER;
}

// The TF32 instances' blocks per SM at head dims >= 64 (0: the 16-bit instances' bounds).
template <typename T, int HD, bool kQuery>
constexpr int tf32_blocks() {
  return !is_tf32<T>() || HD <= 32 ? 0
         : HD <= 64              ? (kQuery ? NATTN_TC_TF32_FWD_BLOCKS_HD64 : NATTN_TC_TF32_BWD_BLOCKS_HD64)
                                 : NATTN_TC_TF32_BLOCKS_HD128;
}

// A kernel's blocks per SM: the TF32 instances' bound, else the plain bound (`plain`) unless
// dropout at head dims <= 64 lowers it (forward or backward passes' bound).
template <typename T, int HD, bool kDrop, bool kForward>
constexpr int blocks_as(int plain) {
  return tf32_blocks<T, HD, kForward>() ? tf32_blocks<T, HD, kForward>()
         : !kDrop || HD > 64            ? plain
         : HD <= 32                     ? NATTN_TC_DROPOUT_BLOCKS_HD32
         : kForward                     ? NATTN_TC_DROPOUT_FWD_BLOCKS
                                        : NATTN_TC_DROPOUT_BWD_BLOCKS;
}

template <typename T, int HD, bool kDrop>
constexpr int fwd_blocks() { return blocks_as<T, HD, kDrop, true>(query_blocks<HD>()); }

template <typename T, int HD, bool kDrop>
constexpr int dq_blocks() { return blocks_as<T, HD, kDrop, false>(query_blocks<HD>()); }

template <typename T, int NA, int HD, bool kDrop>
constexpr int dkv_blocks_as() { return blocks_as<T, HD, kDrop, false>(dkv_blocks<T, NA, HD>()); }

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kWarps = 4;
constexpr int QW = 16;  // tokens per warp: the mma M
constexpr int CW = 16;  // tokens per staged chunk: two n-tiles of S, one k-step of P V (two with TF32)

// Warps a block of an instance holds (tf32_blocks above).
template <typename T, int HD>
constexpr int block_warps() {
  return is_tf32<T>() && HD >= 64 ? 2 : kWarps;
}

// Shared-memory tiles hold the inputs' elements: 16-bit (fp16/bf16) or fp32 (TF32 instances).
template <typename T>
struct SmemElem {
  using type = uint16_t;
};
template <>
struct SmemElem<float> {
  using type = float;
};

template <typename T, int HD>
struct Layout {
  using S = typename SmemElem<T>::type;
  static constexpr bool kF32 = sizeof(S) == 4;
  static constexpr int VEC = 16 / int(sizeof(S));  // elements per 16-byte copy
  // Row pitch in elements, 16 bytes of padding: conflict-free ldmatrix (and, fp32, the
  // 64-bit B loads of mma_rows: rows 2t of a k-step start 8t banks apart).
  static constexpr int P = HD + VEC;
  static constexpr int TILE = CW * P;          // one staged [CW, HD] tensor
  static constexpr int KT = HD / (kF32 ? 8 : 16);  // k-steps over channels (the mma K: 16, TF32 8)
  static constexpr int NT = HD / 8;             // n-tiles over channels
  static constexpr int AREGS = kF32 ? 8 : 4;    // registers of P (dS) as the A operand of a chunk
};

__device__ __forceinline__ unsigned ld32(const void* p) { return *reinterpret_cast<const unsigned*>(p); }

// A fragments (rows r0 = lane/4 and r1 = r0 + 8 of the warp's box) of a token-major tensor.
template <int HD, typename T>
__device__ __forceinline__ void load_a(unsigned (*a)[4], const T* r0, const T* r1, int dim, int t) {
#pragma unroll
  for (int kt = 0; kt < HD / 16; ++kt) {
    const int c = kt * 16 + 2 * t;
    a[kt][0] = c < dim ? ld32(r0 + c) : 0u;
    a[kt][1] = c < dim ? ld32(r1 + c) : 0u;
    a[kt][2] = c + 8 < dim ? ld32(r0 + c + 8) : 0u;
    a[kt][3] = c + 8 < dim ? ld32(r1 + c + 8) : 0u;
  }
}

// Copies the warp's own 16 rows (rows lane/4 and lane/4 + 8 at r0 / r1) of a token-major
// tensor into a padded tile, channels past `dim` zero-filled: the A operand of the products
// below, read with ldmatrix each chunk instead of held in registers (a 16 x HD fragment
// costs HD / 4 registers a thread; the backward kernels spilled with them).
template <typename T, int HD>
__device__ __forceinline__ void stage_rows(typename Layout<T, HD>::S* tile, const T* r0, const T* r1, int dim,
                                           int lane) {
  using Lt = Layout<T, HD>;
  const int row = lane / 4, tq = lane % 4;
#pragma unroll
  for (int c = tq * Lt::VEC; c < HD; c += 4 * Lt::VEC) {
    cp_async16(tile + row * Lt::P + c, c < dim ? static_cast<const void*>(r0 + c) : r0, c < dim);
    cp_async16(tile + (row + 8) * Lt::P + c, c < dim ? static_cast<const void*>(r1 + c) : r1, c < dim);
  }
}

// TF32: rounds the pieces this lane staged with stage_rows (once they have landed: its own
// cp.async groups waited for) to TF32 in place, so that the products read them as A operands
// without a conversion per chunk. The warp synchronises before another lane reads them.
template <int HD>
__device__ __forceinline__ void round_rows_tf32(float* tile, int lane) {
  using Lt = Layout<float, HD>;
  const int row = lane / 4, tq = lane % 4;
#pragma unroll
  for (int c = tq * Lt::VEC; c < HD; c += 4 * Lt::VEC)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float4* x = reinterpret_cast<float4*>(tile + (row + 8 * r) * Lt::P + c);
      float4 v = *x;
      v.x = __uint_as_float(to_tf32(v.x));
      v.y = __uint_as_float(to_tf32(v.y));
      v.z = __uint_as_float(to_tf32(v.z));
      v.w = __uint_as_float(to_tf32(v.w));
      *x = v;
    }
}

// s[2][4] = A (16 x HD, a staged tile) times another staged tile's rows transposed (HD x 16).
// TF32: A is a tile rounded by round_rows_tf32; the other tile's fragments are rounded here.
template <typename T, int HD>
__device__ __forceinline__ void mma_tiles_t(float (*s)[4], const typename Layout<T, HD>::S* a_tile,
                                            const typename Layout<T, HD>::S* tile, int lane) {
  using Lt = Layout<T, HD>;
  const int mi = lane / 8, ri = lane % 8;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
  if constexpr (Lt::kF32) {
    // k-step kt: channels 8 kt .. 8 kt + 7. A's four 8x4 matrices: rows 0-7 / 8-15 (mi & 1) by
    // channels 0-3 / 4-7 (mi >> 1), giving a0..a3; B's: tokens 0-7 / 8-15 (mi >> 1, the n-tile)
    // by channels 0-3 / 4-7 (mi & 1), giving b0, b1 of n-tile 0 and of n-tile 1. Unrolled by 2
    // only: fully unrolled, the fragment loads ptxas hoists cost 30-60 registers a thread and
    // the forward / dK/dV passes spilled at head dims 64 and 128.
#pragma unroll 2
    for (int kt = 0; kt < Lt::KT; ++kt) {
      unsigned a[4], b[4];
      ldmatrix_x4(a, a_tile + ((mi & 1) * 8 + ri) * Lt::P + kt * 8 + (mi >> 1) * 4);
      ldmatrix_x4(b, tile + ((mi >> 1) * 8 + ri) * Lt::P + kt * 8 + (mi & 1) * 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = to_tf32(__uint_as_float(b[i]));
      Mma<T>::run(s[0], a, b);
      Mma<T>::run(s[1], a, b + 2);
    }
  } else {
#pragma unroll
    for (int kt = 0; kt < Lt::KT; ++kt) {
      unsigned a[4], b[4];
      ldmatrix_x4(a, a_tile + (lane % 16) * Lt::P + kt * 16 + (lane / 16) * 8);
      ldmatrix_x4(b, tile + (ri + (mi >> 1) * 8) * Lt::P + kt * 16 + (mi & 1) * 8);
      Mma<T>::run(s[0], a, b);
      Mma<T>::run(s[1], a, b + 2);
    }
  }
}

// acc[NT][4] += A (16 x 16, packed from two score n-tiles by pack_a) times the staged tile
// (16 x HD). TF32: two k-steps of 8 tokens (one per score n-tile); k-step ks's A column t is
// token 8 ks + 2t and column t + 4 token 8 ks + 2t + 1 (pack_a), so lane (g, t) takes B's b0
// / b1 from tokens 8 ks + 2t / + 1. Its column n = g is channel 16 m + 2g + j in n-tile 2m + j
// (the n columns may be in any order): the lane reads both n-tiles of a pair with one 64-bit
// load per token (lanes g, t of a half-warp hit banks 8t + 2g, + 1), and an accumulator row's
// four channels 16 m + 4t .. + 3 end up in one lane (store_rows: one 16-byte store).
template <typename T, int HD>
__device__ __forceinline__ void mma_rows(float (*acc)[4], const unsigned* a, const typename Layout<T, HD>::S* tile,
                                         int lane) {
  using Lt = Layout<T, HD>;
  if constexpr (Lt::kF32) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const float* r0 = tile + (ks * 8 + 2 * t) * Lt::P + 2 * g;
#pragma unroll
      for (int m = 0; m < Lt::NT / 2; ++m) {
        const float2 x0 = *reinterpret_cast<const float2*>(r0 + 16 * m);          // token 2t
        const float2 x1 = *reinterpret_cast<const float2*>(r0 + Lt::P + 16 * m);  // token 2t + 1
        const unsigned b0[2] = {to_tf32(x0.x), to_tf32(x1.x)}, b1[2] = {to_tf32(x0.y), to_tf32(x1.y)};
        Mma<T>::run(acc[2 * m], a + 4 * ks, b0);
        Mma<T>::run(acc[2 * m + 1], a + 4 * ks, b1);
      }
    }
  } else {
    const int mi = lane / 8, ri = lane % 8;
#pragma unroll
    for (int np = 0; np < Lt::NT / 2; ++np) {
      unsigned b[4];
      ldmatrix_x4_trans(b, tile + (ri + (mi & 1) * 8) * Lt::P + np * 16 + (mi >> 1) * 8);
      Mma<T>::run(acc[2 * np], a, b);
      Mma<T>::run(acc[2 * np + 1], a, b + 2);
    }
  }
}

// The A operand of mma_rows from two score n-tiles s (Layout::AREGS registers). TF32: k-step
// ks is n-tile ks, its A registers {(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)} the
// fragment's {c0, c2, c1, c3} (columns 2t and 2t + 1 as A columns t and t + 4), rounded.
template <typename T>
__device__ __forceinline__ void pack_a(unsigned* a, const float (*s)[4]) {
  if constexpr (is_tf32<T>()) {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      a[4 * ks + 0] = to_tf32(s[ks][0]);
      a[4 * ks + 1] = to_tf32(s[ks][2]);
      a[4 * ks + 2] = to_tf32(s[ks][1]);
      a[4 * ks + 3] = to_tf32(s[ks][3]);
    }
  } else {
    a[0] = Mma<T>::pack(s[0][0], s[0][1]);
    a[1] = Mma<T>::pack(s[0][2], s[0][3]);
    a[2] = Mma<T>::pack(s[1][0], s[1][1]);
    a[3] = Mma<T>::pack(s[1][2], s[1][3]);
  }
}

// Stores rows r0/r1 of an accumulator (times f0/f1) to a token-major tensor.
// TF32 instances: fragments of n-tiles 2m, 2m + 1 hold channels 16 m + 4t .. + 3 (mma_rows).
template <typename T, int HD>
__device__ __forceinline__ void store_rows(T* r0, T* r1, bool ok0, bool ok1, const float (*acc)[4], float f0,
                                           float f1, int dim, int t) {
  if constexpr (is_tf32<T>()) {  // float32 outputs: four channels a store
#pragma unroll
    for (int m = 0; m < HD / 16; ++m) {
      const int c = 16 * m + 4 * t;
      if (c >= dim) continue;  // dim is a multiple of 8: the four channels are all in or all out
      const float* x = acc[2 * m];
      const float* y = acc[2 * m + 1];
      if (ok0) *reinterpret_cast<float4*>(r0 + c) = make_float4(x[0] * f0, y[0] * f0, x[1] * f0, y[1] * f0);
      if (ok1) *reinterpret_cast<float4*>(r1 + c) = make_float4(x[2] * f1, y[2] * f1, x[3] * f1, y[3] * f1);
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      const int c = nt * 8 + 2 * t;
      if (c >= dim) continue;
      if (ok0) *reinterpret_cast<unsigned*>(r0 + c) = Mma<T>::pack(acc[nt][0] * f0, acc[nt][1] * f0);
      if (ok1) *reinterpret_cast<unsigned*>(r1 + c) = Mma<T>::pack(acc[nt][2] * f1, acc[nt][3] * f1);
    }
  }
}

// TF32 dQ pass: this lane's part of rowsum(dO * O) for rows r0 / r1 (channels 8 j + 2t, + 1):
// fp32 loads two channels at a time (the 16-bit instances load their fragments: load_a).
template <int HD>
__device__ __forceinline__ void row_dots_f32(float* dl, const float* d0, const float* d1, const float* o0,
                                             const float* o1, int dim, int t) {
#pragma unroll 4
  for (int c = 2 * t; c < HD; c += 8) {
    if (c >= dim) break;
    const float2 a0 = *reinterpret_cast<const float2*>(d0 + c), b0 = *reinterpret_cast<const float2*>(o0 + c);
    const float2 a1 = *reinterpret_cast<const float2*>(d1 + c), b1 = *reinterpret_cast<const float2*>(o1 + c);
    dl[0] += a0.x * b0.x + a0.y * b0.y;
    dl[1] += a1.x * b1.x + a1.y * b1.y;
  }
}

// The two rows a lane holds in the accumulator fragments: their tokens (group
// coordinates), windows (or inverse windows) and whether they are real.
template <int NA, bool kInverse>
struct Rows {
  int ig[2][3];
  AxisRange win[2][3];
  bool ok[2];

  __device__ __forceinline__ Rows(const Params& p, const int* first, const int* L, int lane) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      ok[r] = lane_token<NA>(p.box, lane / 4 + 8 * r, first, L, ig[r]);
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        const bool c = p.causal[a] != 0;
        win[r][a] = kInverse ? key_inverse(ig[r][a], L[a], p.kernel[a], p.stride[a], c)
                             : query_window(ig[r][a], L[a], p.kernel[a], p.stride[a], c);
      }
    }
  }
  // Row r's part of the RPB index (tiling::rpb_index adds a column's part).
  __device__ __forceinline__ int rpb_part(const Params& p, const int* rmult, int r) const {
    return rpb_row_part<NA, kInverse>(p, ig[r], rmult);
  }
};

// The columns a lane holds in the score fragments: chunk tokens 2tq, 2tq + 1, 8 + 2tq and
// 9 + 2tq (column q = 2 * n-tile + odd), whether each lies in the window of each of the
// lane's two rows, and their RPB column parts.
struct Cols {
  bool ok[2][4];
  int rpb[4];
};

__device__ __forceinline__ int col_token(int q, int tq) { return (q >> 1) * 8 + 2 * tq + (q & 1); }

// f(nt, e, r, q) for each of a lane's 8 score elements: n-tile nt, fragment element e, row r
// (0: lane / 4, 1: lane / 4 + 8) and column q (col_token's index).
template <typename F>
__device__ __forceinline__ void for_each_score(F&& f) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(nt, e, e >> 1, nt * 2 + (e & 1));
}

// The score loops run in two instances, with and without RPB (std::true_type / false_type:
// a uniform branch per chunk), so that a call without RPB carries no bias loads or dRPB
// atomics.
template <typename F>
__device__ __forceinline__ void rpb_instanced(bool rpb, F&& f) {
  if (rpb) f(std::true_type{});
  else f(std::false_type{});
}

// Where a score loop reads the bias table: none, global memory, or a copy in shared memory.
enum BiasAt : int { kNoBias = 0, kBiasGlobal = 1, kBiasShared = 2 };
template <typename F>
__device__ __forceinline__ void bias_instanced(int at, F&& f) {
  if (at == kBiasShared) f(std::integral_constant<int, kBiasShared>{});
  else if (at == kBiasGlobal) f(std::integral_constant<int, kBiasGlobal>{});
  else f(std::integral_constant<int, kNoBias>{});
}

// One box's walk over its window union, packed (common/tiling.cuh): chunk ci's tokens of two
// tensors X and Y (K and V, or Q and dO for the inverse walk) are staged into slot
// tc_stage(ci) of the warp's buffer with cp.async, kTcStages - 1 chunks ahead of the one
// computed. Per chunk, lane l finds the coordinates of chunk token l % 16 (UnionIndex: two
// multiply-highs in 3-D, none in 1-D) and its offset in X (lanes 0-15) or Y (lanes 16-31);
// the copying lanes fetch the offsets they need with shuffles. Its fragment columns' coordinates
// come the same way. (Cursors stepping along the union with carries across line ends cost
// ~200 integer instructions a chunk, Nsight Compute, PERF.md thirteenth session.) With kSide,
// the inverse walk also stages each query's LSE and delta (a second offset stream: the row of
// the [B, N, H] LSE / delta, `rst` the per-axis row strides).
template <typename T, int NA, int HD, bool kInverse, bool kSide = false>
struct Walk {
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  static constexpr int PPK = HD / Lt::VEC;  // 16-byte pieces per staged token
  static constexpr int TPI = 32 / PPK;      // tokens per copy instruction of the warp
  static constexpr int NS = kSide ? 2 : 1;
  const Params& p;
  const Rows<NA, kInverse>& rw;
  S* buf;
  const T *X, *Y;
  GroupStrides<NA> st[2];  // this lane's tensor, the LSE / delta row (kSide)
  int lane, size, chunks;
  bool xin, yin;           // this lane's channels lie within X's / Y's head dim
  UnionIndex<NA> ui;
  // kSide: LSE/delta rows (b, token, h) of the staged queries, into side[stage][lse 16 | delta 16];
  // side_src: this lane's tensor (LSE for piece 0 of a token, delta for piece 1) at row (b, 0, h)
  float* side;
  const float* side_src;

  __device__ __forceinline__ Walk(const Params& p_, const Rows<NA, kInverse>& rw_, const int* g, const AxisRange* u_,
                                  S* buf_, int lane_, const T* X_, const int64_t* xst, int xdim, const T* Y_,
                                  const int64_t* yst, int ydim, float* side_ = nullptr, int64_t row0_ = 0,
                                  int h_ = 0, const int64_t* rst = nullptr)
      : p(p_), rw(rw_), buf(buf_), X(X_), Y(Y_),
        st{GroupStrides<NA>(p_, xst, g, yst, lane_ >= CW), GroupStrides<NA>(p_, kSide ? rst : xst, g)},
        lane(lane_), xin((lane_ % PPK) * Lt::VEC < xdim), yin((lane_ % PPK) * Lt::VEC < ydim), ui(u_),
        side(side_), side_src(kSide ? (lane_ % PPK == 0 ? p_.lse : p_.delta) + row0_ * p_.heads + h_ : nullptr) {
    size = union_size<NA>(u_);
    chunks = (size + CW - 1) / CW;
  }
  __device__ __forceinline__ const S* tile(int ci) const { return buf + tc_stage(ci) * 2 * Lt::TILE; }
  __device__ __forceinline__ const float* side_tile(int ci) const { return side + tc_stage(ci) * 2 * CW; }

  // The chunks staged before the first one is computed (after the rows' own copy group):
  // chunk 0, and with more stages the next ones, an empty group for each missing chunk so
  // that every later wait counts the same number of groups.
  __device__ __forceinline__ void prologue() {
    if constexpr (kTcStages == 2) {
      if (chunks > 0) issue(0);
    } else {
#pragma unroll 1
      for (int ci = 0; ci < kTcStages - 1; ++ci) {
        if (ci < chunks) issue(ci);
        else cp_async_commit();
      }
    }
  }
  // Waits for the rows' own copy group (issued before prologue()).
  __device__ __forceinline__ void wait_rows() const {
    if constexpr (kTcStages == 2) {
      if (chunks > 0) cp_async_wait<1>();
      else cp_async_wait<0>();
    } else {
      cp_async_wait<kTcStages - 1>();
    }
  }

  // Stages chunk ci (in walk order) into slot tc_stage(ci); channels past a tensor's dim and
  // tokens past the union are zero-filled.
  __device__ __forceinline__ void issue(int ci) {
    S* dst = buf + tc_stage(ci) * 2 * Lt::TILE;
    // Source addresses stay inside the tensors: the cursors never leave the union, and a
    // lane whose channels lie past a head dim reads channel 0 (its copy is zero-filled).
    const int e = (lane % PPK) * Lt::VEC, left = size - ci * CW;
    const T* Xl = X + (xin ? e : 0);
    const T* Yl = Y + (yin ? e : 0);
    // This lane's token (past the union: its last token, so that copies predicated off still
    // get an address inside the tensor) and its offsets.
    int c[3];
    ui.coords(nattn_min(ci * CW + lane % CW, size - 1), c);
    int64_t o[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) o[s] = st[s].at(c);
    if constexpr (Lt::kF32) {
      // TF32: kept rolled (16 copies a tensor at head dim 128); unrolled, their shuffled
      // offsets held at once made the dK/dV pass spill at head dim 128.
#pragma unroll 1
      for (int i = 0; i < CW / TPI; ++i) copy(dst, ci, i, e, left, Xl, Yl, o);
    } else {
#pragma unroll
      for (int i = 0; i < CW / TPI; ++i) copy(dst, ci, i, e, left, Xl, Yl, o);
    }
    cp_async_commit();
  }
  // Copy instruction i of issue: chunk token j's piece e of X and Y (and its LSE and delta).
  __device__ __forceinline__ void copy(S* dst, int ci, int i, int e, int left, const T* Xl, const T* Yl,
                                       const int64_t* o) {
    const int j = i * TPI + lane / PPK;
    const int64_t ox = __shfl_sync(0xffffffffu, o[0], j), oy = __shfl_sync(0xffffffffu, o[0], CW + j);
    const bool in = j < left;
    cp_async16(dst + j * Lt::P + e, Xl + ox, in && xin);
    cp_async16(dst + Lt::TILE + j * Lt::P + e, Yl + oy, in && yin);
    if (kSide) {
      const int64_t row = __shfl_sync(0xffffffffu, o[NS - 1], j);
      if (lane % PPK < 2)  // the token's first two lanes: its LSE and its delta
        cp_async4(side + tc_stage(ci) * 2 * CW + (lane % PPK) * CW + j, side_src + row, in);
    }
  }
  // Chunk ci is in shared memory for the whole warp (the next kTcStages - 1 are on their way).
  // Its slot's previous chunk was released by every lane's __syncwarp at the end of that
  // chunk's products.
  __device__ __forceinline__ void arrive(int ci) {
    if constexpr (kTcStages == 2) {
      if (ci + 1 < chunks) {
        issue(ci + 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    } else {
      if (ci + kTcStages - 1 < chunks) issue(ci + kTcStages - 1);
      else cp_async_commit();  // an empty group: the wait below counts the same groups
      cp_async_wait<kTcStages - 1>();
    }
    __syncwarp();
  }
  // Chunk ci's columns (the lane's 4 fragment columns); with kTok also their token indices
  // mod 2^32 (dropout's mask words; g: the box's dilation group).
  template <bool kTok = false>
  __device__ __forceinline__ void take(int ci, Cols& cl, const int* rmult, bool rpb, uint32_t* tok = nullptr,
                                       const int* g = nullptr) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int f = ci * CW + col_token(q, lane % 4);
      const bool in = f < size;
      int c[3];
      ui.coords(f, c);
#pragma unroll
      for (int r = 0; r < 2; ++r) cl.ok[r][q] = in && in_window<NA>(rw.win[r], c);
      cl.rpb[q] = rpb ? rpb_dot<NA>(c, rmult) : 0;
      if constexpr (kTok) tok[q] = token_word<NA>(p, c, g);
    }
  }
};

// ------------------------------------------------------------------------- forward
// A warp's walk over the keys of its query rows' windows (forward and dQ pass), with what
// their scores need besides: the head's RPB table and the rows' part of its index and, with
// dropout, the head's key stream and the rows' query tokens.
template <typename T, int NA, int HD, bool kDrop>
struct RowWalk {
  Walk<T, NA, HD, false> walk;
  const float* rpb;
  int rrow[2];
  DropKeys drop;
  uint32_t qtok[2];

  __device__ __forceinline__ RowWalk(const Params& p, const Rows<NA, false>& rw, const int* g, const AxisRange* u,
                                     typename Layout<T, HD>::S* buf, int lane, int b, int h, int hkv,
                                     const int* rmult)
      : walk(p, rw, g, u, buf, lane, head_base<const T>(p.k, p.k_s, b, hkv), p.k_s, p.dim,
             head_base<const T>(p.v, p.v_s, b, hkv), p.v_s, p.dim_v),
        rpb(p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr),
        rrow{rw.rpb_part(p, rmult, 0), rw.rpb_part(p, rmult, 1)} {
    if constexpr (kDrop) {
      drop.init(p, b, h);
      qtok[0] = token_word<NA>(p, rw.ig[0], g);
      qtok[1] = token_word<NA>(p, rw.ig[1], g);
    }
  }
};

template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(block_warps<T, HD>() * 32, fwd_blocks<T, HD, kDrop>())
    forward_kernel(const Params p) {
#if NATTN_TC_ENABLED
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  constexpr int NT = Lt::NT;
  extern __shared__ __align__(16) uint16_t tc_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  S* buf = reinterpret_cast<S*>(tc_smem) + warp * ((2 * kTcStages + 1) * Lt::TILE);  // stages x (K, V), its Q rows
  S* sQ = buf + 2 * kTcStages * Lt::TILE;
  int g[3], L[3], first[3];
  if (!warp_box<NA>(p, p.box, int64_t(blockIdx.x) * block_warps<T, HD>() + warp, g, L, first)) return;
  const Rows<NA, false> rw(p, first, L, lane);
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  AxisRange u[3];
  box_union<NA, false>(p, p.box, first, L, u);
  int rmult[3];
  rpb_mults<NA>(p, rmult);
  {
    const T* Q = head_base<const T>(p.q, p.q_s, b, h);
    stage_rows<T, HD>(sQ, Q + spatial_offset<NA>(p, p.q_s, rw.ig[0], g), Q + spatial_offset<NA>(p, p.q_s, rw.ig[1], g),
                      p.dim, lane);
    cp_async_commit();  // completes with the first chunk (groups retire in order)
  }
  RowWalk<T, NA, HD, kDrop> keys(p, rw, g, u, buf, lane, b, h, hkv, rmult);
  auto& walk = keys.walk;
  const float* rpb = keys.rpb;

  float o[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  walk.prologue();
  if constexpr (Lt::kF32) {  // the Q rows (the group before chunk 0's) have landed: round them
    walk.wait_rows();
    round_rows_tf32<HD>(sQ, lane);
  }
  for (int ci = 0; ci < walk.chunks; ++ci) {
    walk.arrive(ci);  // (its __syncwarp also orders the rounding before any lane's reads)
    const S* sK = walk.tile(ci);
    Cols cl;
    uint32_t ktok[4];
    walk.template take<kDrop>(ci, cl, rmult, rpb != nullptr, ktok, g);
    unsigned keep = 0;
    if constexpr (kDrop) keep = keep_bits_query_rows(keys.drop, keys.qtok, ktok, p.drop_threshold);
    float s[2][4];
    mma_tiles_t<T, HD>(s, sQ, sK, lane);
    float mx[2] = {-INFINITY, -INFINITY};
    rpb_instanced(rpb != nullptr, [&](auto with_rpb) {
      for_each_score([&](int nt, int e, int r, int q) {
        const bool ok = cl.ok[r][q];
        float v = s[nt][e] * p.scale_log2;
        if constexpr (decltype(with_rpb)::value) {
          // unconditional (entry 0 outside the window, whose score is masked below): a
          // conditional load compiled to a branch per score
          v += rpb[ok ? rpb_index<false>(keys.rrow[r], cl.rpb[q]) : 0] * kLog2e;
        }
        s[nt][e] = ok ? v : -INFINITY;
        mx[r] = fmaxf(mx[r], s[nt][e]);
      });
    });
    float ref[2];
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], quad_max(mx[r]));
      ref[r] = mn == -INFINITY ? 0.f : mn;
      corr[r] = fast_exp2(m[r] - ref[r]);  // 0 while nothing was seen, 1 while the max holds
      m[r] = mn;
      l[r] *= corr[r];
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {  // rescale only when a max grew
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] *= corr[e >> 1];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = fast_exp2(s[nt][e] - ref[e >> 1]);
        l[e >> 1] += s[nt][e];  // the row sum (and so the LSE) without dropout
        if constexpr (kDrop) s[nt][e] = kept(keep, e >> 1, nt * 2 + (e & 1)) ? s[nt][e] : 0.f;
      }
    unsigned pa[Lt::AREGS];
    pack_a<T>(pa, s);
    mma_rows<T, HD>(o, pa, sK + Lt::TILE, lane);
    __syncwarp();  // this slot is refilled kTcStages chunks on
  }
  cp_async_wait<0>();  // no copy may land after the block's shared memory is gone
  const float l0 = quad_sum(l[0]), l1 = quad_sum(l[1]);
  const float keep_scale = kDrop ? p.drop_scale : 1.f;  // kept weights meet V times 1 / (1 - p)
  T* O = head_base<T>(p.out, p.out_s, b, h);
  store_rows<T, HD>(O + spatial_offset<NA>(p, p.out_s, rw.ig[0], g), O + spatial_offset<NA>(p, p.out_s, rw.ig[1], g),
                    rw.ok[0], rw.ok[1], o, inv_row_sum(l0) * keep_scale, inv_row_sum(l1) * keep_scale, p.dim_v, tq);
  if (tq == 0) {
    if (rw.ok[0]) p.lse[(int64_t(b) * p.tokens + token_index<NA>(p, rw.ig[0], g)) * p.heads + h] = row_lse(m[0], l0);
    if (rw.ok[1]) p.lse[(int64_t(b) * p.tokens + token_index<NA>(p, rw.ig[1], g)) * p.heads + h] = row_lse(m[1], l1);
  }
#endif
}

// --------------------------------------------------------------- backward: dQ + delta
template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(block_warps<T, HD>() * 32, dq_blocks<T, HD, kDrop>())
    backward_dq_kernel(const Params p) {
#if NATTN_TC_ENABLED
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  constexpr int KT = Lt::KT, NT = Lt::NT;
  extern __shared__ __align__(16) uint16_t tc_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  S* buf = reinterpret_cast<S*>(tc_smem) + warp * ((2 * kTcStages + 2) * Lt::TILE);  // stages x (K, V), its Q, dO
  S* sQ = buf + 2 * kTcStages * Lt::TILE;
  int g[3], L[3], first[3];
  if (!warp_box<NA>(p, p.box, int64_t(blockIdx.x) * block_warps<T, HD>() + warp, g, L, first)) return;
  const Rows<NA, false> rw(p, first, L, lane);
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups;
  AxisRange u[3];
  box_union<NA, false>(p, p.box, first, L, u);
  int rmult[3];
  rpb_mults<NA>(p, rmult);

  // The rows' LSE and dLSE first, and dO and O for delta after chunk 0's copies are issued:
  // their global-load latencies overlap the staging (Nsight Compute, PERF.md fourteenth
  // session: waiting on them was ~15% of this pass's stall samples at DiNAT's 7x7).
  float lse_in[2], dlse[2];
  int64_t row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = (int64_t(b) * p.tokens + token_index<NA>(p, rw.ig[r], g)) * p.heads + h;
    lse_in[r] = rw.ok[r] ? p.lse[row[r]] : 0.f;
    dlse[r] = p.grad_lse && rw.ok[r] ? p.grad_lse[row[r]] : 0.f;
  }
  const T* D = head_base<const T>(p.grad_out, p.grad_out_s, b, h);
  {
    const T* Q = head_base<const T>(p.q, p.q_s, b, h);
    stage_rows<T, HD>(sQ, Q + spatial_offset<NA>(p, p.q_s, rw.ig[0], g), Q + spatial_offset<NA>(p, p.q_s, rw.ig[1], g),
                      p.dim, lane);
    stage_rows<T, HD>(sQ + Lt::TILE, D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[0], g),
                      D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[1], g), p.dim_v, lane);
    cp_async_commit();
  }
  RowWalk<T, NA, HD, kDrop> keys(p, rw, g, u, buf, lane, b, h, hkv, rmult);
  auto& walk = keys.walk;
  const float* rpb = keys.rpb;
  walk.prologue();

  float delta[2], lse2[2];
  {
    const T* O = head_base<const T>(p.out, p.out_s, b, h);
    // delta = rowsum(dO * O) - dLSE: this lane's channels of both rows, then its quad
    float dl[2] = {0.f, 0.f};
    if constexpr (Lt::kF32) {
      row_dots_f32<HD>(dl, D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[0], g),
                       D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[1], g),
                       O + spatial_offset<NA>(p, p.out_s, rw.ig[0], g), O + spatial_offset<NA>(p, p.out_s, rw.ig[1], g),
                       p.dim_v, tq);
    } else {
      unsigned da[KT][4];
      load_a<HD>(da, D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[0], g),
                 D + spatial_offset<NA>(p, p.grad_out_s, rw.ig[1], g), p.dim_v, tq);
      unsigned oa[KT][4];
      load_a<HD>(oa, O + spatial_offset<NA>(p, p.out_s, rw.ig[0], g), O + spatial_offset<NA>(p, p.out_s, rw.ig[1], g),
                 p.dim_v, tq);
#pragma unroll
      for (int kt = 0; kt < KT; ++kt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float d0, d1, o0, o1;
          Mma<T>::unpack(da[kt][i], d0, d1);
          Mma<T>::unpack(oa[kt][i], o0, o1);
          dl[i & 1] += d0 * o0 + d1 * o1;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      delta[r] = quad_sum(dl[r]) - dlse[r];
      lse2[r] = rw.ok[r] ? lse_log2(lse_in[r]) : 0.f;
      if (tq == 0 && rw.ok[r]) p.delta[row[r]] = delta[r];
    }
  }

  float dq[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[nt][e] = 0.f;
  if constexpr (Lt::kF32) {  // the Q and dO rows (the group before chunk 0's) have landed: round them
    walk.wait_rows();
    round_rows_tf32<HD>(sQ, lane);
    round_rows_tf32<HD>(sQ + Lt::TILE, lane);
  }
  for (int ci = 0; ci < walk.chunks; ++ci) {
    walk.arrive(ci);
    const S* sK = walk.tile(ci);
    Cols cl;
    uint32_t ktok[4];
    walk.template take<kDrop>(ci, cl, rmult, rpb != nullptr, ktok, g);
    unsigned keep = 0;
    if constexpr (kDrop) keep = keep_bits_query_rows(keys.drop, keys.qtok, ktok, p.drop_threshold);
    float s[2][4], dp[2][4];
    mma_tiles_t<T, HD>(s, sQ, sK, lane);
    mma_tiles_t<T, HD>(dp, sQ + Lt::TILE, sK + Lt::TILE, lane);
    rpb_instanced(rpb != nullptr, [&](auto with_rpb) {
      for_each_score([&](int nt, int e, int r, int q) {
        const bool ok = rw.ok[r] && cl.ok[r][q];
        float v = s[nt][e] * p.scale_log2;
        if constexpr (decltype(with_rpb)::value) {
          v += rpb[ok ? rpb_index<false>(keys.rrow[r], cl.rpb[q]) : 0] * kLog2e;  // as in the forward
        }
        float dpe = dp[nt][e];
        if constexpr (kDrop) dpe = kept(keep, r, q) ? dpe * p.drop_scale : 0.f;  // m dP / (1 - p)
        s[nt][e] = ok ? fast_exp2(v - lse2[r]) * (dpe - delta[r]) : 0.f;  // dS
      });
    });
    unsigned dsa[Lt::AREGS];
    pack_a<T>(dsa, s);
    mma_rows<T, HD>(dq, dsa, sK, lane);
    __syncwarp();
  }
  cp_async_wait<0>();
  T* DQ = head_base<T>(p.dq, p.dq_s, b, h);
  store_rows<T, HD>(DQ + spatial_offset<NA>(p, p.dq_s, rw.ig[0], g), DQ + spatial_offset<NA>(p, p.dq_s, rw.ig[1], g),
                    rw.ok[0], rw.ok[1], dq, p.scale, p.scale, p.dim, tq);
#endif
}

// ------------------------------------------------------ backward: dK, dV, dRPB per key
template <typename T, int HD>
constexpr int dkv_warp_bytes() {
  // stages x (Q, dO), own K, V; stages x (lse, delta)
  return (2 * kTcStages + 2) * Layout<T, HD>::TILE * int(sizeof(typename Layout<T, HD>::S)) + kTcStages * 2 * CW * 4;
}

template <typename T, int NA, int HD, bool kDrop>
__global__ void __launch_bounds__(block_warps<T, HD>() * 32, dkv_blocks_as<T, NA, HD, kDrop>())
    backward_dkv_kernel(const Params p) {
#if NATTN_TC_ENABLED
  using Lt = Layout<T, HD>;
  using S = typename Lt::S;
  constexpr int NT = Lt::NT, W = block_warps<T, HD>();
  extern __shared__ __align__(16) uint16_t tc_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  S* buf = reinterpret_cast<S*>(tc_smem) + warp * ((2 * kTcStages + 2) * Lt::TILE);
  S* sK = buf + 2 * kTcStages * Lt::TILE;  // the warp's K and V rows
  float* past_tiles = reinterpret_cast<float*>(reinterpret_cast<S*>(tc_smem) + W * (2 * kTcStages + 2) * Lt::TILE);
  float* sLD = past_tiles + warp * kTcStages * 2 * CW;  // [stage][lse | delta]
  float* drpb_smem = past_tiles + W * kTcStages * 2 * CW;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const bool stage_rpb = p.rpb != nullptr && p.rpb_in_smem;
  const int64_t smem_len = int64_t(p.groups) * p.rpb_head_size;
  // p.rpb_in_smem == 2: the bias table of the KV head's query heads is copied beside dRPB's,
  // so the score loop reads it from shared memory (32-bit addresses, shorter latency).
  const bool stage_bias = stage_rpb && p.rpb_in_smem == 2;
  float* const bias_smem = drpb_smem + smem_len;
  if (stage_bias) {  // pre-scaled to log2 units: the score's FFMA adds it
    const float* src = p.rpb + int64_t(hkv) * smem_len;
    for (int64_t i = threadIdx.x; i < smem_len; i += blockDim.x) bias_smem[i] = src[i] * kLog2e;
  }
  if (stage_rpb) drpb_stage_begin(drpb_smem, smem_len);
  int g[3], L[3], first[3];
  // no early return: the block meets again at the dRPB flush
  if (warp_box<NA>(p, p.box, int64_t(blockIdx.x) * W + warp, g, L, first)) {
    const Rows<NA, true> rw(p, first, L, lane);
    AxisRange u[3];
    box_union<NA, true>(p, p.box, first, L, u);
    int rmult[3];
    rpb_mults<NA>(p, rmult);
    {
      const T* K = head_base<const T>(p.k, p.k_s, b, hkv);
      const T* V = head_base<const T>(p.v, p.v_s, b, hkv);
      stage_rows<T, HD>(sK, K + spatial_offset<NA>(p, p.k_s, rw.ig[0], g), K + spatial_offset<NA>(p, p.k_s, rw.ig[1], g),
                        p.dim, lane);
      stage_rows<T, HD>(sK + Lt::TILE, V + spatial_offset<NA>(p, p.v_s, rw.ig[0], g),
                        V + spatial_offset<NA>(p, p.v_s, rw.ig[1], g), p.dim_v, lane);
      cp_async_commit();
    }
    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dk[nt][e] = 0.f;
        dv[nt][e] = 0.f;
      }
    const int rrow[2] = {rw.rpb_part(p, rmult, 0), rw.rpb_part(p, rmult, 1)};
    int64_t rst[4];  // row strides of the [B, N, H] LSE and delta: the token strides times H
    token_strides<NA>(p, rst);
#pragma unroll
    for (int a = 0; a < NA; ++a) rst[1 + a] *= p.heads;
    uint32_t ktok[2];  // dropout: the rows' key tokens
    if constexpr (kDrop) {
      ktok[0] = token_word<NA>(p, rw.ig[0], g);
      ktok[1] = token_word<NA>(p, rw.ig[1], g);
    }
    for (int hg = 0; hg < p.groups; ++hg) {  // GQA: every query head of this KV head
      const int h = hkv * p.groups + hg;
      const T* Qb = head_base<const T>(p.q, p.q_s, b, h);
      const T* Db = head_base<const T>(p.grad_out, p.grad_out_s, b, h);
      const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
      // The staged tables of head h: the instance reading the bias from shared memory adds
      // dRPB there too (a staged bias implies a staged dRPB), from per-head bases.
      const float* const bias_head = bias_smem + hg * p.rpb_head_size;
      float* const drpb_head = drpb_smem + hg * p.rpb_head_size;
      const int bias_at = !rpb ? kNoBias : stage_bias ? kBiasShared : kBiasGlobal;
      DropKeys drop;  // the mask of query head h
      if constexpr (kDrop) drop.init(p, b, h);
      Walk<T, NA, HD, true, true> walk(p, rw, g, u, buf, lane, Qb, p.q_s, p.dim, Db, p.grad_out_s, p.dim_v, sLD,
                                       int64_t(b) * p.tokens, h, rst);
      walk.prologue();
      if constexpr (Lt::kF32) {  // first head: the own K and V rows (the group before) have landed: round them
        if (hg == 0) {
          walk.wait_rows();
          round_rows_tf32<HD>(sK, lane);
          round_rows_tf32<HD>(sK + Lt::TILE, lane);
        }
      }
      for (int ci = 0; ci < walk.chunks; ++ci) {
        walk.arrive(ci);
        const S* sQ = walk.tile(ci);
        const float* sL = walk.side_tile(ci);
        Cols cl;
        uint32_t qtok[4];
        walk.template take<kDrop>(ci, cl, rmult, rpb != nullptr, qtok, g);
        unsigned keep = 0;
        if constexpr (kDrop) keep = keep_bits_key_rows(drop, ktok, qtok, p.drop_threshold);
        float s[2][4], dp[2][4];
        mma_tiles_t<T, HD>(s, sK, sQ, lane);                          // S^T: keys x queries
        mma_tiles_t<T, HD>(dp, sK + Lt::TILE, sQ + Lt::TILE, lane);   // dP^T
        // The LSE (log2 units) and delta of the lane's 4 query columns, read once per chunk:
        // read per score, dRPB's shared-memory atomics made the compiler reload them.
        float lse2[4], delta[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          lse2[q] = lse_log2(sL[col_token(q, tq)]);
          delta[q] = sL[CW + col_token(q, tq)];
        }
        // P^T and dS^T in place of S^T and dP^T (bias_instanced: no bias loads or dRPB atomics
        // without RPB; the bias from shared memory where it is staged).
        bias_instanced(bias_at, [&](auto at) {
          constexpr bool kRpb = decltype(at)::value != kNoBias;
          constexpr bool kShared = decltype(at)::value == kBiasShared;
          for_each_score([&](int nt, int e, int r, int q) {
            const bool ok = rw.ok[r] && cl.ok[r][q];
            float v = s[nt][e] * p.scale_log2;
            int ridx = 0;
            if constexpr (kRpb) {
              ridx = rpb_index<true>(rrow[r], cl.rpb[q]);
              // as in the forward: no branch per score (the same rounding either way: the
              // staged copy holds the product with kLog2e)
              if constexpr (kShared) v = fmaf(s[nt][e], p.scale_log2, bias_head[ok ? ridx : 0]);
              else v += rpb[ok ? ridx : 0] * kLog2e;
            }
            const float pr = ok ? fast_exp2(v - lse2[q]) : 0.f;
            float dpe = dp[nt][e];
            if constexpr (kDrop) dpe = kept(keep, r, q) ? dpe * p.drop_scale : 0.f;  // m dP / (1 - p)
            const float ds = pr * (dpe - delta[q]);
            s[nt][e] = kDrop && !kept(keep, r, q) ? 0.f : pr;  // dV takes the masked P (1 / (1 - p) at the store)
            dp[nt][e] = ds;
            if constexpr (kRpb) {
              if (ok) {  // one address space per branch: no generic atomics
                if constexpr (kShared) atomicAdd(drpb_head + ridx, ds);
                else if (stage_rpb) atomicAdd(drpb_head + ridx, ds);
                else atomicAdd(p.drpb + int64_t(h) * p.rpb_head_size + ridx, ds);
              }
            }
          });
        });
        unsigned pa[Lt::AREGS], dsa[Lt::AREGS];
        pack_a<T>(pa, s);
        pack_a<T>(dsa, dp);
        mma_rows<T, HD>(dv, pa, sQ + Lt::TILE, lane);
        mma_rows<T, HD>(dk, dsa, sQ, lane);
        __syncwarp();
      }
    }
    cp_async_wait<0>();  // the own rows, when no query sees these keys
    T* DK = head_base<T>(p.dk, p.dk_s, b, hkv);
    T* DV = head_base<T>(p.dv, p.dv_s, b, hkv);
    store_rows<T, HD>(DK + spatial_offset<NA>(p, p.dk_s, rw.ig[0], g), DK + spatial_offset<NA>(p, p.dk_s, rw.ig[1], g),
                      rw.ok[0], rw.ok[1], dk, p.scale, p.scale, p.dim, tq);
    const float keep_scale = kDrop ? p.drop_scale : 1.f;
    store_rows<T, HD>(DV + spatial_offset<NA>(p, p.dv_s, rw.ig[0], g), DV + spatial_offset<NA>(p, p.dv_s, rw.ig[1], g),
                      rw.ok[0], rw.ok[1], dv, keep_scale, keep_scale, p.dim_v, tq);
  }
  if (stage_rpb) drpb_stage_flush(p, hkv, drpb_smem, smem_len);
#endif
}

// ------------------------------------------------------------------------- launchers
// Opts a kernel into more than 48 KiB of dynamic shared memory; called once per kernel
// instance (a function-local static in each launcher).
template <typename K>
bool allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  return true;
}

// Largest bias table (all query heads of a KV head) the dK/dV pass copies into shared memory:
// 4096 floats, e.g. one head's table of a 2-D window up to 32x32 or a 3-D one up to 8x8x8.
// (The dQ pass reads the table from global memory: a per-warp copy measured slower.)
constexpr int64_t kStagedBiasBytes = 16 * 1024;

// Bytes of one staged tile ([CW, HD] with padded rows; fp32 tiles take twice the 16-bit bytes).
template <typename T, int HD>
constexpr size_t tile_bytes() {
  return size_t(Layout<T, HD>::TILE) * sizeof(typename Layout<T, HD>::S);
}

// With 2 stages (NATTN_TC_STAGES), 16-bit, 4 warps: 15 / 25 / 45 / 85 KiB at head dims 16 / 32 / 64 / 128; TF32 (block_warps):
// 25 / 45 KiB (4 warps), 42.5 / 82.5 KiB (2 warps).
template <typename T, int HD>
constexpr size_t fwd_smem_bytes() {
  return size_t(block_warps<T, HD>()) * (2 * kTcStages + 1) * tile_bytes<T, HD>();  // per warp: stages x (K, V) + its Q rows
}

// With 2 stages, 16-bit, 4 warps: 18 / 30 / 54 / 102 KiB; TF32: 30 / 54 KiB (4 warps), 51 / 99 KiB (2 warps).
template <typename T, int HD>
constexpr size_t dq_smem_bytes() {
  return size_t(block_warps<T, HD>()) * (2 * kTcStages + 2) * tile_bytes<T, HD>();  // stages x (K, V) + its Q, dO
}

// Box shape: the measured fixed shapes (16, 4x4, 2x2x4) unless NATTN_TC_BOX=model asks for
// the per-problem key-slot model (common/tiling.cuh), kept opt-in until measured alone.
template <int NA>
void set_box(Params& p) {
  static const bool model = [] {
    const char* s = getenv("NATTN_TC_BOX");
    return s && !strcmp(s, "model");
  }();
  if (model) model_box(p, QW, CW);
  else fixed_box<NA, QW>(p.box);
}

template <typename T, int NA, int HD, bool kDrop>
void launch_forward_as(const Params& problem, cudaStream_t stream) {
  Params p = problem;
  set_box<NA>(p);
  const int64_t warps = num_warps<NA>(p, p.box);
  constexpr int W = block_warps<T, HD>();
  const dim3 grid(unsigned((warps + W - 1) / W), unsigned(p.heads), unsigned(p.batch));
  constexpr size_t smem = fwd_smem_bytes<T, HD>();
  static const bool allowed = allow_smem(forward_kernel<T, NA, HD, kDrop>, smem);
  (void)allowed;
  forward_kernel<T, NA, HD, kDrop><<<grid, W * 32, smem, stream>>>(p);
}

template <typename T, int NA, int HD, bool kDrop>
void launch_backward_as(const Params& problem, cudaStream_t stream) {
  Params p = problem;
  set_box<NA>(p);
  const int64_t warps = num_warps<NA>(p, p.box);
  constexpr int W = block_warps<T, HD>();
  const unsigned blocks = unsigned((warps + W - 1) / W);
  constexpr size_t smem = dq_smem_bytes<T, HD>();
  // TF32 at head dim 128: 2 x 49.75 KiB + up to 48 KiB of dRPB = 147.5 KiB (an SM80 block may have 163)
  constexpr size_t dkv_max = size_t(W) * dkv_warp_bytes<T, HD>() + size_t(kMaxDrpbSmemBytes);
  // Room for the staged bias table where it keeps the block within an SM80's 163 KiB.
  constexpr size_t bias_room = dkv_max + size_t(kStagedBiasBytes) <= size_t(163 * 1024) ? kStagedBiasBytes : 0;
  static const bool allowed = allow_smem(backward_dq_kernel<T, NA, HD, kDrop>, smem) &&
                              allow_smem(backward_dkv_kernel<T, NA, HD, kDrop>, dkv_max + bias_room);
  (void)allowed;
  backward_dq_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads, p.batch), W * 32, smem, stream>>>(p);
  Params pk = p;
  const int64_t rpb_bytes = drpb_stage_bytes(p);
  // dRPB staged when its table fits (rpb_in_smem 1), and the bias table beside it (2) when
  // that fits too.
  const bool bias_fits = rpb_bytes > 0 && rpb_bytes <= int64_t(bias_room);
  pk.rpb_in_smem = rpb_bytes > 0 ? (bias_fits ? 2 : 1) : 0;
  const size_t dkv_smem = size_t(W) * dkv_warp_bytes<T, HD>() + size_t(rpb_bytes) * size_t(pk.rpb_in_smem);
  backward_dkv_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads_kv, p.batch), W * 32, dkv_smem, stream>>>(pk);
}

// A call with attention dropout (Params::drop_rng) runs the kDrop instances.
template <typename T, int NA, int HD>
void launch_forward(const Params& p, cudaStream_t stream) {
  if (p.drop_rng) launch_forward_as<T, NA, HD, true>(p, stream);
  else launch_forward_as<T, NA, HD, false>(p, stream);
}

template <typename T, int NA, int HD>
void launch_backward(const Params& p, cudaStream_t stream) {
  if (p.drop_rng) launch_backward_as<T, NA, HD, true>(p, stream);
  else launch_backward_as<T, NA, HD, false>(p, stream);
}

}  }  // namespace nattn::tc
