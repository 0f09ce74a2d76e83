// The unfused window ops (nattn.na*d_qk / na*d_av and their gradients): what the kernels see.
// Three products over each query's window slots (row-major over the per-axis slots, the
// order docs/semantics.md and nattn/windows.py define), all tensors contiguous:
//   kDot         out[b,i,h,w]  = a[b,i,h,:] . b[b,key_w(i),h/G,:]      (QK logits; dA of AV)
//   kSum         out[b,i,h,:]  = sum_w a[b,i,h,w] * b[b,key_w(i),h/G,:] (AV; dQ of QK)
//   kInverseSum  out[b,j,hk,:] = sum_{h in hk's group} sum_{i: key_w(i)=j} a[b,i,h,w] * b[b,i,h,:]
//                                                                     (dK of QK; dV of AV)
// a slot a causal window does not hold is skipped (kDot writes -inf or 0 there).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

namespace nattn {
namespace window {

enum Op { kDot = 0, kSum = 1, kInverseSum = 2 };

struct WindowParams {
  int op, na_dim;
  int batch, heads, heads_kv, groups, dim;  // dim: of a/b rows (D, or D_v), a multiple of 8
  int spatial[3], kernel[3], stride[3], dilation[3], causal[3];  // 1 / 0 for absent axes
  int64_t tokens;   // prod(spatial)
  int window;       // prod(kernel): W
  int neg_inf;      // kDot: -inf (logits) or 0 (gradients) in slots outside the window
  const void* a;    // kDot: [B, N, H, dim]; kSum / kInverseSum: [B, N, H, W]
  const void* b;    // kDot / kSum: [B, N, H_kv, dim]; kInverseSum: [B, N, H, dim]
  void* out;        // kDot: [B, N, H, W]; kSum: [B, N, H, dim]; kInverseSum: [B, N, H_kv, dim]
};

// One instance per (dtype, NA dim), listed in the generated window table.
template <typename T, int NA>
void launch_window(const WindowParams& p, cudaStream_t stream);

using WindowLaunchFn = void (*)(const WindowParams&, cudaStream_t);

struct WindowEntry {
  int dtype;  // index into kernel_table.DTYPES
  int na_dim;
  WindowLaunchFn launch;
};

extern const WindowEntry kWindowKernels[];
extern const int kNumWindowKernels;

}  // namespace window
}  // namespace nattn
