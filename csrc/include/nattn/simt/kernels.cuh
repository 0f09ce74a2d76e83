// SIMT fused neighborhood attention: forward (online softmax, writes out + LSE) and
// backward (dQ + delta per query; dK, dV, dRPB per key over its inverse neighborhood).
//
// A query is served by a group of TPQ = HD / cpt<HD>() threads, each holding cpt<HD>()
// channels (NATTN_SIMT_CPT, default 16) of q and of the accumulator; dot products are
// reduced with shuffles inside the group.
// Window walks keep their memory offsets incrementally (adds, no multiplies per key).
// Every instruction used exists on SM50, so this family runs on every GPU from Maxwell
// on. Offsets are 64-bit, so tensors past 2^31 elements are addressed correctly.
//
// Attention dropout (Params::drop_rng set; docs/semantics.md) is a second instance of each
// kernel (kDrop), run for the problems with dropout that the tensor-core family does not take
// (float32 without TF32, GPUs before SM80, head dims above 128): the forward's row sum and LSE use the unmasked P while the P that meets V is masked, its
// 1 / (1 - p) folded into the output's row factor; the dQ pass forms dS = P (m dP / (1 - p) -
// delta), delta = rowsum(dO * O) - dLSE with the dropped O; the dK/dV pass adds m P dO to dV
// (scaled by 1 / (1 - p) at the store) and the same dS to dK and dRPB. The keep bits m come
// from simt/dropout.cuh (global indices: the key's token index is one more offset stream of the
// window cursor). Calls without dropout run the kDrop = false instances, whose code is the
// same as without the feature.
//
// Files: common.cuh (knobs, reductions, window cursors), forward.cuh, backward_dq.cuh,
// backward_dkv.cuh (the kernels), dropout.cuh; this file has the launchers.
#pragma once
#include "nattn/common/drpb.cuh"
#include "nattn/common/registry.h"
#include "nattn/simt/backward_dkv.cuh"
#include "nattn/simt/backward_dq.cuh"
#include "nattn/simt/common.cuh"
#include "nattn/simt/forward.cuh"
#include "nattn/simt/launch.h"

namespace nattn { namespace simt {

// ------------------------------------------------------------------------- launchers
template <typename T, int NA, int HD, bool kDrop>
void launch_forward_as(const Params& p, cudaStream_t stream) {
  constexpr int QPB = kThreads / tpq<HD>();
  const dim3 grid(unsigned((p.tokens + QPB - 1) / QPB), unsigned(p.heads), unsigned(p.batch));
  forward_kernel<T, NA, HD, kDrop><<<grid, kThreads, 0, stream>>>(p);
}

template <typename T, int NA, int HD, bool kDrop>
void launch_backward_as(const Params& problem, cudaStream_t stream) {
  constexpr int QPB = kThreads / tpq<HD>();
  Params p = problem;
  const unsigned blocks = unsigned((p.tokens + QPB - 1) / QPB);
  const int64_t smem = drpb_stage_bytes(p);  // larger tables go straight to global atomics
  // A staged dRPB whose int64 table fits sums in fixed point (deterministic): the dQ pass
  // records each head's largest |dS| into the workspace first.
  const bool fixed = smem > 0 && 2 * smem <= kMaxDrpbSmemBytes && drpb_fixed_begin(p, stream);
  backward_dq_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads, p.batch), kThreads, 0, stream>>>(p);
  Params pk = p;
  pk.rpb_in_smem = smem > 0;
  backward_dkv_kernel<T, NA, HD, kDrop><<<dim3(blocks, p.heads_kv, p.batch), kThreads,
                                          pk.rpb_in_smem ? size_t(fixed ? 2 * smem : smem) : 0, stream>>>(pk);
  if (fixed) drpb_fixed_end(pk, drpb_bits(p), stream);
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

}  }  // namespace nattn::simt
