// Softmax pieces the kernel families share: quad reductions of the tensor-core fragment
// layouts, and the convention for queries with no finite logit (a window masked to -inf by
// an RPB table, say): output 0 and LSE -inf in the forward, zero probabilities and so zero
// gradients in the backward (docs/semantics.md).
#pragma once
#include <math.h>

namespace nattn {

// The LSE in log2 units for recomputing probabilities exp2(logit - lse2): an LSE of -inf
// (no finite logit) becomes +inf, so every probability is 0 instead of exp2(-inf + inf).
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
}

// 2^x in one MUFU op (flush-to-zero; exp2f adds a denormal-range fix-up around it, which
// probabilities below 2^-126 do not need).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 1 / l for the output and the natural-log LSE from a row's running max m (log2 units)
// and sum l: 0 and -inf when nothing finite was seen. l >= 1 once a finite score was seen
// (its largest term is 1), so the logarithm is the fast base-2 one (one MUFU, absolute error
// ~2^-22) instead of log2f's ~30-instruction polynomial, run per row in every epilogue.
__device__ __forceinline__ float inv_row_sum(float l) { return l > 0.f ? 1.f / l : 0.f; }
__device__ __forceinline__ float row_lse(float m, float l) {
  float lg;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(l));
  return l > 0.f ? (m + lg) * 0.6931471805599453f : -INFINITY;
}

// Row max and row sum over the 4 lanes that hold one accumulator row (lanes 4r..4r+3 of
// the mma / wgmma fragment layouts).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace nattn
