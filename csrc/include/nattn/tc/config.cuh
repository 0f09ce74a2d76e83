// The tensor-core family's compile-time configuration: blocks per SM (register caps, tuning
// overrides by -D), the chunk ring's stages, the block's warps and the staged tiles' layout.
#pragma once
#include <math.h>

#include <type_traits>

#include "nattn/common/tiling.cuh"

namespace nattn { namespace tc {

using namespace nattn::tiling;

// Blocks per SM each kernel is compiled for (a register cap: 4 blocks of 128 threads = 128
// registers a thread, 3 = 168). Head dims <= 64; larger ones take what they need. Tuning
// builds override them with -D (benchmarks/build_variants.sh; PERF.md has the measurements).
#ifndef NATTN_TC_QUERY_BLOCKS  // forward and dQ
#define NATTN_TC_QUERY_BLOCKS 4
#endif
#ifndef NATTN_TC_QUERY_BLOCKS_HD32  // forward and dQ at head dims <= 32 in 1-D / 2-D (DiNAT), and 16 in
#define NATTN_TC_QUERY_BLOCKS_HD32 5    // 3-D: 96 registers without spills, 2-3% faster than 4
#endif
#ifndef NATTN_TC_FWD_BLOCKS_HD32  // the 16-bit forward alone at those head dims: 80 registers without
#define NATTN_TC_FWD_BLOCKS_HD32 6      // spills, 4-5% faster than 5 (the dQ pass spills there; TF32 keeps 5)
#endif
#ifndef NATTN_TC_QUERY_BLOCKS_HD32_3D  // 3-D at head dim 32 (5 blocks spilled 4-39 instructions)
#define NATTN_TC_QUERY_BLOCKS_HD32_3D NATTN_TC_QUERY_BLOCKS
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

template <int NA, int HD>
constexpr int query_blocks() {
  return HD <= 16 || (HD <= 32 && NA <= 2) ? NATTN_TC_QUERY_BLOCKS_HD32
         : HD <= 32                        ? NATTN_TC_QUERY_BLOCKS_HD32_3D
         : HD <= 64                        ? NATTN_TC_QUERY_BLOCKS
                                           : 1;
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

template <typename T, int NA, int HD, bool kDrop>
constexpr int fwd_blocks() {
  return blocks_as<T, HD, kDrop, true>(!is_tf32<T>() && (HD <= 16 || (HD <= 32 && NA <= 2)) ? NATTN_TC_FWD_BLOCKS_HD32
                                                                                          : query_blocks<NA, HD>());
}

template <typename T, int NA, int HD, bool kDrop>
constexpr int dq_blocks() { return blocks_as<T, HD, kDrop, false>(query_blocks<NA, HD>()); }

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

}  }  // namespace nattn::tc
