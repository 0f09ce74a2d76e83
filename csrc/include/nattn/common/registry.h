// The device-side problem description and the kernel table entry type.
// Torch-free: everything is raw pointers, sizes and element strides.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace nattn {

struct bf16_t { unsigned short bits; };  // storage-only bfloat16 (same bits as torch)

// One NA problem as the kernels see it (built from NattnProblem by src/api.cu).
// Strides are in elements: [batch, axis0, axis1, axis2, heads]; head-dim stride is 1.
struct Params {
  int na_dim, dtype;
  int batch, heads, heads_kv, groups, dim, dim_v;
  int spatial[3], kernel[3], stride[3], dilation[3], causal[3];
  int rpb_size[3];        // 2k-1 per axis (1 for absent axes)
  int64_t rpb_head_size;  // prod(rpb_size)
  int64_t tokens;         // prod(spatial)
  float scale, scale_log2;
  int rpb_in_smem;        // backward: stage dRPB (tc: 2, and the bias table) in shared memory;
                          // tc forward / dQ pass: 2, the bias table
  int box[3];             // tiled kernels: tokens per warp along each axis
  const void* q; const void* k; const void* v; void* out;
  float* lse; const float* rpb;
  const void* grad_out; const float* grad_lse; float* delta;
  void* dq; void* dk; void* dv; float* drpb;
  int64_t q_s[5], k_s[5], v_s[5], out_s[5], grad_out_s[5], dq_s[5], dk_s[5], dv_s[5];
  const void* prepared;   // host: launch state a family's prepare step left (sm90 tensor maps)
  float* dq_accum;        // sm90 KV-parallel backward: fp32 dQ sums [B, N, H, D] (else null)
  int tile_q[3], tile_k[3];  // host: the call's tile pair (query / key box; zeros: default)
  int dq_mode;               // host: 0 default, 1 deterministic dQ pass, 2 KV-parallel dQ
  int kv_splits;             // sm90 forward: CTAs per query box over slices of its key boxes
  float* o_part;             // ... their rows' outputs, fp32, box-local (split_kv_merge.cuh; null: no split)
  float* lse_part;           // ... and the rows' LSEs, fp32, in the same slots
  // Attention dropout (docs/semantics.md; families in kernel_table.DROPOUT_FAMILIES): the
  // call's int64 [seed, offset] on the device (null: no dropout), the keep threshold
  // floor(p * 2^32) (common/philox.cuh) and 1 / (1 - p), the factor of kept weights.
  const int64_t* drop_rng;
  uint32_t drop_threshold;
  float drop_scale;
  // Token rows (host-filled; the tc walks): the grid's row-major token strides, with dilation
  // (tok_step[a] = dilation[a] * tok_stride[a]; zeros past na_dim), and a bit per tensor
  // (kRows*) whose tokens are rows: s[1 + a] == s[na_dim] * tok_stride[a] on every axis, with
  // fewer than 2^31 tokens. A walk over such tensors finds a token's offset as its index
  // times one row stride (32-bit index math) instead of one 64-bit product per axis.
  int tok_stride[3], tok_step[3];
  int token_rows;
  // Host-set by a backward launcher (tc, sm90, SIMT) that stages dRPB in fixed point: the
  // workspace (common/drpb_fixed.cuh): each query head's largest |dS| as float bits, and the
  // int64 table [H, rpb_head_size] (null: dRPB summed in float32).
  unsigned* drpb_max;
  long long* drpb_fixed;
  // Host-set by the sm90 launchers: a kRows* bit per tensor whose tensor map has its heads
  // next to the batch instead of inside a token's row (sm90/tensor_map_spec.h).
  int map_heads_outer;
  // The call's query range per axis, [q_lo, q_hi) in real coordinates (host-filled; the
  // whole axis unless the call names one): sm90's forward and dQ pass launch only the query
  // boxes holding queries of it and its dK/dV pass walks only those queries (tiles.cuh,
  // cta_tile / cta_tile_inverse); other families compute every query.
  int q_lo[3], q_hi[3];
  // Host-set by the sm90 launchers for the launch's query box (sm90/tiles.cuh,
  // set_query_boxes): per axis and dilation group, the first query box holding a query of
  // the range and how many do. The CTAs decode their box from these with no arithmetic on
  // the range or the dilation.
  int qbox_first[3], qbox_count[3];
  // Host-set by the sm90 forward launcher: 1 when the consumer warpgroups write their rows of
  // the output box with bulk tensor copies through the output's own tensor map (0: per-lane
  // stores; the map needs strides and an address the copy engine takes, as the inputs' do).
  int out_map;
  // Host-set by the sm90 box pairs' backward launcher: 1 when the dQ pass computes delta
  // (rowsum(dO O) - dLSE of its rows, written for the dK/dV pass) instead of a kernel before it.
  int delta_in_dq;
  // Host-set by the persistent square passes (sm90/square_runs.cuh, build switches): the boxes
  // of one (batch, head) (the dK/dV pass: key boxes of one KV head), and how many consecutive
  // boxes of the flattened [batch, head, box] order a CTA walks.
  int cta_tiles, cta_run;
};

enum TokenRows : int {
  kRowsQ = 1, kRowsK = 2, kRowsV = 4, kRowsGradOut = 8, kRowsOut = 16,
  kRowsGradQ = 32, kRowsGradK = 64, kRowsGradV = 128  // (the sm90 strip passes' stored gradients)
};

// Whether every tensor of `tensors` (kRows* bits) stores its tokens as rows.
__host__ __device__ inline bool all_token_rows(const Params& p, int tensors) { return (p.token_rows & tensors) == tensors; }

// Bytes of the host workspace a family's prepare step may fill, and its alignment (sm90:
// up to eleven tensor maps, 128-byte aligned CUtensorMap objects, and a few words).
constexpr int kPrepareBytes = 1536;
constexpr int kPrepareAlign = 128;

using LaunchFn = void (*)(const Params&, cudaStream_t);
// Whether a family takes a problem: nullptr when it does (workspace filled), else why not.
using PrepareFn = const char* (*)(const Params&, void* workspace);

struct KernelEntry {
  const char* family;
  int dtype;     // index into kernel_table.DTYPES
  int na_dim;
  int head_dim;  // bucket: runs any multiple of 8 up to this
  LaunchFn forward;
  LaunchFn backward;   // nullptr: the family has no backward (another family's runs)
  PrepareFn prepare;   // nullptr: takes every problem its table row matches
  PrepareFn prepare_backward;  // the same for the backward (nullptr: no prepare step)
  int qbox[3], kbox[3];  // tiled families (sm90): query and key box extents; else zeros
  bool forward_named_only;  // the forward runs only when a call names the pair (never the default)
  bool unverified;  // no GPU has run the pair yet: its backward too runs only when named
};

extern const KernelEntry kKernels[];
extern const int kNumKernels;

// Element pointer of (batch b, head h) in a [B, *spatial, H, D] tensor with strides s (s[0]
// batch, s[4] head): the origin the kernels add token offsets to. T carries the constness.
template <typename T, typename V>
__host__ __device__ inline T* head_base(V* ptr, const int64_t* s, int b, int h) {
  return static_cast<T*>(ptr) + int64_t(b) * s[0] + int64_t(h) * s[4];
}

}  // namespace nattn
