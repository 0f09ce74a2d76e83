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
//
// Files: config.cuh (blocks per SM, stages, tile layout), fragments.cuh (tile helpers over
// mma.cuh), walk.cuh (a warp's rows and window-union walk), forward.cuh, backward_dq.cuh,
// backward_dkv.cuh (the kernels); this file has the launchers.
#pragma once
#include <stdlib.h>
#include <string.h>

#include "nattn/common/device.h"
#include "nattn/common/drpb.cuh"
#include "nattn/common/registry.h"
#include "nattn/common/smem_opt_in.cuh"
#include "nattn/tc/backward_dkv.cuh"
#include "nattn/tc/backward_dq.cuh"
#include "nattn/tc/config.cuh"
#include "nattn/tc/forward.cuh"
#include "nattn/tc/launch.h"

namespace nattn { namespace tc {

// ------------------------------------------------------------------------- launchers
// Largest bias table (all query heads of a KV head) the dK/dV pass copies into shared memory:
// 4096 floats, e.g. one head's table of a 2-D window up to 32x32 or a 3-D one up to 8x8x8.
// (The forward and the dQ pass stage one table a block, their head's: kQueryBiasBytes.)
constexpr int64_t kStagedBiasBytes = 16 * 1024;

// The forward and the dQ pass stage their block's head's bias table (times log2(e)) in shared
// memory where it takes at most this much (a 2-D window up to 20x20, 3-D up to 5x7x7) and
// leaves the kernel's blocks per SM (query_bias_bytes). Build switch for A/B runs:
// NATTN_TC_QUERY_BIAS=0 reads the table from global memory.
#ifndef NATTN_TC_QUERY_BIAS
#define NATTN_TC_QUERY_BIAS 1
#endif
constexpr int64_t kQueryBiasBytes = 6 * 1024;

// Blocks of `bytes` of dynamic shared memory each that an SM of the current device holds, at
// most `blocks` (the kernel's register bound).
inline int smem_blocks(size_t bytes, int blocks) {
  constexpr size_t kReserved = 1024;  // shared memory the runtime reserves per block (SM80+)
  int dev = 0;
  const size_t per_sm = cudaGetDevice(&dev) == cudaSuccess ? size_t(host::device_smem_per_sm(dev)) : 0;
  const size_t fit = per_sm / (bytes + kReserved);
  return fit < size_t(blocks) ? int(fit) : blocks;
}

// The staged table's bytes for a kernel of `smem` bytes a block compiled for `blocks` blocks
// per SM (0: none, read from global memory): where the table is at most kQueryBiasBytes and
// an SM holds as many blocks with it as without (a 3-D 5x7x7 table took the head-dim-64 dQ
// pass from 4 blocks to 3 on the H200 and made it 6% slower).
inline int64_t query_bias_bytes(const Params& p, size_t smem, int blocks) {
  const int64_t bytes = p.rpb_head_size * int64_t(sizeof(float));
  if (!NATTN_TC_QUERY_BIAS || p.rpb == nullptr || bytes > kQueryBiasBytes) return 0;
  return smem_blocks(smem + size_t(bytes), blocks) == smem_blocks(smem, blocks) ? bytes : 0;
}

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
  static std::atomic<uint64_t> opted{0};  // per device: common/smem_opt_in.cuh
  once_per_device(opted, [] { return allow_smem(forward_kernel<T, NA, HD, kDrop>, smem + size_t(kQueryBiasBytes)); });
  const int64_t bias = query_bias_bytes(p, smem, fwd_blocks<T, NA, HD, kDrop>());
  p.rpb_in_smem = bias ? 2 : 0;
  forward_kernel<T, NA, HD, kDrop><<<grid, W * 32, smem + size_t(bias), stream>>>(p);
}

// Shared memory of a dK/dV block: its warps' tiles and the largest staged dRPB table; and the
// room left for the staged bias table beside them where that keeps the block within an
// SM80's 163 KiB (TF32 at head dim 128: 2 x 49.75 KiB + up to 48 KiB of dRPB = 147.5 KiB).
template <typename T, int HD>
constexpr size_t dkv_smem_max() {
  return size_t(block_warps<T, HD>()) * dkv_warp_bytes<T, HD>() + size_t(kMaxDrpbSmemBytes);
}
template <typename T, int HD>
constexpr size_t dkv_bias_room() {
  return dkv_smem_max<T, HD>() + size_t(kStagedBiasBytes) <= size_t(163 * 1024) ? kStagedBiasBytes : 0;
}

// The dK/dV pass alone, after a dQ pass that wrote delta and, when rpb_bytes > 0 (the staged
// dRPB table's bytes, drpb_stage_bytes), each query head's largest |dS| into the fixed-point
// dRPB's workspace (rpb_bytes 0: dRPB added to global memory in float32). This family's
// backward runs it after its own dQ pass; the Hopper strip pairs' after theirs
// (sm90/kernels.cuh, launch_backward_strips).
template <typename T, int NA, int HD, bool kDrop>
void launch_dkv_pass(const Params& problem, int64_t rpb_bytes, cudaStream_t stream) {
  Params p = problem;
  set_box<NA>(p);
  const int64_t warps = num_warps<NA>(p, p.box);
  constexpr int W = block_warps<T, HD>();
  const unsigned blocks = unsigned((warps + W - 1) / W);
  static std::atomic<uint64_t> opted{0};
  once_per_device(opted, [] {
    return allow_smem(backward_dkv_kernel<T, NA, HD, kDrop>, dkv_smem_max<T, HD>() + dkv_bias_room<T, HD>() + kDrpbSinkBytes);
  });
  // dRPB staged when its table fits (rpb_in_smem 1), and the bias table beside it (2) when
  // that fits too.
  const bool bias_fits = rpb_bytes > 0 && rpb_bytes <= int64_t(dkv_bias_room<T, HD>());
  p.rpb_in_smem = rpb_bytes > 0 ? (bias_fits ? 2 : 1) : 0;
  const size_t dkv_smem = size_t(W) * dkv_warp_bytes<T, HD>() + size_t(rpb_bytes) * size_t(p.rpb_in_smem) +
                          (rpb_bytes > 0 ? size_t(kDrpbSinkBytes) : 0);  // (the staged dRPB's sink)
  backward_dkv_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads_kv, p.batch), W * 32, dkv_smem, stream>>>(p);
}

template <typename T, int NA, int HD, bool kDrop>
void launch_backward_as(const Params& problem, cudaStream_t stream) {
  Params p = problem;
  set_box<NA>(p);
  const int64_t warps = num_warps<NA>(p, p.box);
  constexpr int W = block_warps<T, HD>();
  const unsigned blocks = unsigned((warps + W - 1) / W);
  constexpr size_t smem = dq_smem_bytes<T, HD>();
  static std::atomic<uint64_t> opted{0};
  once_per_device(opted, [] { return allow_smem(backward_dq_kernel<T, NA, HD, kDrop>, smem + size_t(kQueryBiasBytes)); });
  // A staged dRPB sums in fixed point (deterministic, native integer atomics): the dQ pass
  // records each head's largest |dS| into its workspace first. Without the workspace the
  // dK/dV pass adds float32 into global memory.
  int64_t rpb_bytes = drpb_stage_bytes(p);
  const bool fixed = rpb_bytes > 0 && drpb_fixed_begin(p, stream);
  if (!fixed) rpb_bytes = 0;
  Params pq = p;  // the dQ pass: its head's bias table staged like the forward's
  const int64_t bias = query_bias_bytes(p, smem, dq_blocks<T, NA, HD, kDrop>());
  pq.rpb_in_smem = bias ? 2 : 0;
  backward_dq_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads, p.batch), W * 32, smem + size_t(bias), stream>>>(pq);
  launch_dkv_pass<T, NA, HD, kDrop>(p, rpb_bytes, stream);
  if (fixed) drpb_fixed_end(p, dkv_fixed_bits<T, HD>(), stream);
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
