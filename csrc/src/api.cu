// The C ABI of libnattn: torch-free entry points that check a problem, pick the
// kernel from the generated table, launch it on the caller's stream and report
// errors as a code plus a message naming the configuration.
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lookup.h"
#include "nattn/common/philox.cuh"
#include "nattn/common/registry.h"
#include "nattn/common/tiling.cuh"
#include "nattn/problem.h"  // generated from nattn/_cuda/kernel_table.py
#include "nattn/simt/launch.h"
#include "sm90_dispatch.h"
#include "sm90_padded.h"

#define NATTN_API extern "C" __attribute__((visibility("default")))

namespace {

using namespace nattn::host;

const char* const kDtypeNames[] = {"float32", "float16", "bfloat16"};
const int kDtypeBytes[] = {4, 2, 2};

enum Status { kOk = 0, kInvalid = 1, kNotCompiled = 2, kCudaError = 3 };

// Formats "<what>: <detail> [config]" into the caller's buffer.
int fail(char* err, int64_t err_len, int code, const NattnProblem& pr, const char* what,
         const char* fmt, ...) {
  if (!err || err_len <= 0) return code;
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  const int nd = int(pr.na_dim);
  const char* dt = (pr.dtype >= 0 && pr.dtype < 3) ? kDtypeNames[pr.dtype] : "?";
  char drop[48] = "";
  if (pr.dropout_p_bits) {
    double p;
    memcpy(&p, &pr.dropout_p_bits, sizeof p);
    snprintf(drop, sizeof drop, " dropout_p=%.6g", p);
  }
  char tf32[40] = "";
  if (pr.allow_tf32) snprintf(tf32, sizeof tf32, " allow_tf32=%lld", (long long)pr.allow_tf32);
  snprintf(err, size_t(err_len),
           "%s: %s [dtype=%s na_dim=%d batch=%lld spatial=(%lld,%lld,%lld) heads=%lld "
           "heads_kv=%lld dim=%lld dim_v=%lld kernel=(%lld,%lld,%lld) stride=(%lld,%lld,%lld) "
           "dilation=(%lld,%lld,%lld) causal=(%lld,%lld,%lld)%s%s]",
           what, detail, dt, nd, (long long)pr.batch, (long long)pr.spatial[0],
           (long long)(nd > 1 ? pr.spatial[1] : 0), (long long)(nd > 2 ? pr.spatial[2] : 0),
           (long long)pr.heads, (long long)pr.heads_kv, (long long)pr.dim, (long long)pr.dim_v,
           (long long)pr.kernel[0], (long long)pr.kernel[1], (long long)pr.kernel[2],
           (long long)pr.stride[0], (long long)pr.stride[1], (long long)pr.stride[2],
           (long long)pr.dilation[0], (long long)pr.dilation[1], (long long)pr.dilation[2],
           (long long)pr.causal[0], (long long)pr.causal[1], (long long)pr.causal[2], drop, tf32);
  return code;
}

bool aligned16(int64_t ptr) { return ptr % 16 == 0; }

// Params' token rows (registry.h): the grid's token strides and which of q, k, v and
// grad_out store their tokens as rows of one stride (after the strides are copied).
void fill_token_rows(nattn::Params& p) {
  nattn::tiling::set_token_strides(p);
  const int64_t* strides[4] = {p.q_s, p.k_s, p.v_s, p.grad_out_s};
  const int bits[4] = {nattn::kRowsQ, nattn::kRowsK, nattn::kRowsV, nattn::kRowsGradOut};
  p.token_rows = 0;
  for (int t = 0; t < 4; ++t)
    if (nattn::tiling::has_token_rows(p, strides[t])) p.token_rows |= bits[t];
}

// Validates the problem and fills the kernel parameters. `backward` adds the
// gradient tensors to the checks.
int build_params(const int64_t* fields, int64_t n_fields, double scale, bool backward,
                 nattn::Params& p, const nattn::KernelEntry*& entry, char* err, int64_t err_len) {
  NattnProblem pr;
  memset(&pr, 0, sizeof pr);
  const char* what = backward ? "nattn backward" : "nattn forward";
  if (n_fields != NATTN_NUM_PROBLEM_FIELDS)
    return fail(err, err_len, kInvalid, pr, what, "got %lld problem fields, this library expects %d "
                "(Python package and libnattn are from different builds)",
                (long long)n_fields, NATTN_NUM_PROBLEM_FIELDS);
  memcpy(&pr, fields, sizeof pr);
  if (pr.abi_version != NATTN_ABI_VERSION)
    return fail(err, err_len, kInvalid, pr, what, "ABI version %lld, library has %d",
                (long long)pr.abi_version, NATTN_ABI_VERSION);
  if (pr.dtype < 0 || pr.dtype > 2)
    return fail(err, err_len, kInvalid, pr, what, "dtype code %lld is not float32/float16/bfloat16",
                (long long)pr.dtype);
  if (pr.na_dim < 1 || pr.na_dim > 3)
    return fail(err, err_len, kInvalid, pr, what, "na_dim must be 1, 2 or 3");
  if (pr.dim <= 0 || pr.dim % 8 || pr.dim_v <= 0 || pr.dim_v % 8)
    return fail(err, err_len, kInvalid, pr, what, "head dims must be positive multiples of 8");
  if (pr.heads <= 0 || pr.heads_kv <= 0 || pr.heads % pr.heads_kv)
    return fail(err, err_len, kInvalid, pr, what, "heads must be a multiple of heads_kv");
  if (pr.batch <= 0 || pr.batch > 65535 || pr.heads > 65535)
    return fail(err, err_len, kInvalid, pr, what, "batch and heads must be in 1..65535 (grid limits)");
  // Attention dropout: p as float64 bits, its keep threshold (which must be floor(p * 2^32),
  // common/philox.cuh) and the device pointer of the call's int64 [seed, offset].
  const bool dropout = pr.dropout_p_bits != 0;
  double drop_p = 0.0;
  memcpy(&drop_p, &pr.dropout_p_bits, sizeof drop_p);
  if (dropout) {
    if (!(drop_p > 0.0 && drop_p < 1.0))
      return fail(err, err_len, kInvalid, pr, what, "dropout_p must be in [0, 1), got %g", drop_p);
    if (pr.dropout_threshold != int64_t(nattn::dropout_threshold(drop_p)))
      return fail(err, err_len, kInvalid, pr, what, "dropout_threshold %lld does not match dropout_p %.17g "
                  "(floor(p * 2^32) = %u)", (long long)pr.dropout_threshold, drop_p, nattn::dropout_threshold(drop_p));
    if (!pr.rng_ptr || pr.rng_ptr % 8)
      return fail(err, err_len, kInvalid, pr, what, "dropout_p > 0 needs rng_ptr: the call's int64 [seed, offset] "
                  "on the device, 8-byte aligned");
  } else if (pr.dropout_threshold != 0) {
    return fail(err, err_len, kInvalid, pr, what, "dropout_threshold %lld without dropout_p",
                (long long)pr.dropout_threshold);
  }
  // ABI 4: whether a float32 call may run the tensor-core family's TF32 instances.
  if (pr.allow_tf32 != 0 && pr.allow_tf32 != 1)
    return fail(err, err_len, kInvalid, pr, what, "allow_tf32 must be 0 or 1, got %lld", (long long)pr.allow_tf32);
  const bool tf32 = pr.dtype == 0 && pr.allow_tf32 == 1;
  const int64_t dim_max = pr.dim > pr.dim_v ? pr.dim : pr.dim_v;
  entry = find_kernel("simt", int(pr.dtype), int(pr.na_dim), int(dim_max));
  if (!entry)
    return fail(err, err_len, kNotCompiled, pr, what,
                "no compiled SIMT kernel for this dtype, NA dim and head dim %lld "
                "(see nattn.build_info.build_config())", (long long)dim_max);
  // 16-bit inputs on SM80+, and float32 ones that allow TF32: the tensor-core family where it
  // is compiled for this head dim (its float32 instances compute in TF32). float32 without
  // allow_tf32 stays on the SIMT family's exact fp32; it never runs the Hopper family.
  if ((pr.dtype != 0 || tf32) && tc_allowed(int(pr.device))) {
    const nattn::KernelEntry* tc = find_kernel("tc", int(pr.dtype), int(pr.na_dim), int(dim_max));
    if (tc) entry = tc;
  }
  memset(&p, 0, sizeof p);
  p.na_dim = int(pr.na_dim);
  p.dtype = int(pr.dtype);
  p.batch = int(pr.batch);
  p.heads = int(pr.heads);
  p.heads_kv = int(pr.heads_kv);
  p.groups = int(pr.heads / pr.heads_kv);
  p.dim = int(pr.dim);
  p.dim_v = int(pr.dim_v);
  p.tokens = 1;
  p.rpb_head_size = 1;
  for (int a = 0; a < 3; ++a) {
    const bool live = a < p.na_dim;
    const int64_t n = live ? pr.spatial[a] : 1, k = live ? pr.kernel[a] : 1;
    const int64_t s = live ? pr.stride[a] : 1, d = live ? pr.dilation[a] : 1;
    if (live && (n < 1 || n > 0x7fffffff || k < 2 || d < 1 || s < 1 || s > k || k * d > n))
      return fail(err, err_len, kInvalid, pr, what,
                  "axis %d: need 2 <= kernel, 1 <= stride <= kernel, kernel * dilation <= size < 2^31", a);
    p.spatial[a] = int(n);
    p.kernel[a] = int(k);
    p.stride[a] = int(s);
    p.dilation[a] = int(d);
    p.causal[a] = live ? int(pr.causal[a] != 0) : 0;
    p.rpb_size[a] = live ? int(2 * k - 1) : 1;
    p.tokens *= n;
    p.rpb_head_size *= p.rpb_size[a];
  }
  const int64_t qpb = nattn::simt::kThreads / (entry->head_dim / 8);
  if ((p.tokens + qpb - 1) / qpb > 0x7fffffff)
    return fail(err, err_len, kInvalid, pr, what, "too many tokens (%lld) for the launch grid",
                (long long)p.tokens);
  for (int a = 0; a < 6; ++a)
    if (pr.tile[a] < 0 || pr.tile[a] > 256)
      return fail(err, err_len, kInvalid, pr, what, "tile extents must be in [0, 256] (0: the default pair)");
  for (int a = 0; a < 3; ++a) {
    p.tile_q[a] = int(pr.tile[a]);
    p.tile_k[a] = int(pr.tile[3 + a]);
  }
  if (pr.dq_mode < 0 || pr.dq_mode > 2)
    return fail(err, err_len, kInvalid, pr, what, "dq_mode must be 0 (default), 1 (deterministic pass) or 2 (KV-parallel), got %lld",
                (long long)pr.dq_mode);
  p.dq_mode = int(pr.dq_mode);
  if (pr.kv_splits < 0 || pr.kv_splits > 64)
    return fail(err, err_len, kInvalid, pr, what, "kv_splits must be in [0, 64] (0 or 1: no split), got %lld",
                (long long)pr.kv_splits);
  p.kv_splits = pr.kv_splits > 1 ? int(pr.kv_splits) : 1;
  // ABI 5: the query range (all zeros: every query).
  bool ranged = false;
  for (int a = 0; a < 6; ++a) ranged = ranged || pr.query_range[a] != 0;
  for (int a = 0; a < 3; ++a) {
    p.q_lo[a] = 0;
    p.q_hi[a] = p.spatial[a];
    if (!ranged || a >= p.na_dim) continue;
    const int64_t lo = pr.query_range[a], hi = pr.query_range[3 + a];
    if (lo < 0 || hi <= lo || hi > p.spatial[a])
      return fail(err, err_len, kInvalid, pr, what, "query_range axis %d: need 0 <= lo < hi <= size (%d), got [%lld, %lld)",
                  a, p.spatial[a], (long long)lo, (long long)hi);
    p.q_lo[a] = int(lo);
    p.q_hi[a] = int(hi);
  }
  p.o_part = p.lse_part = nullptr;
  p.drpb_max = nullptr;
  p.drpb_fixed = nullptr;
  if (dropout) {
    p.drop_rng = reinterpret_cast<const int64_t*>(pr.rng_ptr);
    p.drop_threshold = uint32_t(pr.dropout_threshold);
    p.drop_scale = float(1.0 / (1.0 - drop_p));
  }
  p.scale = float(scale);
  p.scale_log2 = float(scale * 1.4426950408889634);
  const int eb = kDtypeBytes[pr.dtype];
  struct Tensor { const char* name; int64_t ptr; const int64_t* stride; int64_t* dst; bool used; };
  const Tensor tensors[] = {
      {"q", pr.q_ptr, pr.q_stride, p.q_s, true},
      {"k", pr.k_ptr, pr.k_stride, p.k_s, true},
      {"v", pr.v_ptr, pr.v_stride, p.v_s, true},
      {"out", pr.out_ptr, pr.out_stride, p.out_s, true},
      {"grad_out", pr.grad_out_ptr, pr.grad_out_stride, p.grad_out_s, backward},
      {"dq", pr.dq_ptr, pr.dq_stride, p.dq_s, backward},
      {"dk", pr.dk_ptr, pr.dk_stride, p.dk_s, backward},
      {"dv", pr.dv_ptr, pr.dv_stride, p.dv_s, backward},
  };
  for (const Tensor& t : tensors) {
    if (!t.used) continue;
    if (!t.ptr)
      return fail(err, err_len, kInvalid, pr, what, "%s pointer is null", t.name);
    if (!aligned16(t.ptr))
      return fail(err, err_len, kInvalid, pr, what, "%s is not 16-byte aligned", t.name);
    for (int i = 0; i < 5; ++i) {
      if ((t.stride[i] * eb) % 16)
        return fail(err, err_len, kInvalid, pr, what,
                    "%s stride %d (%lld elements) is not a multiple of 16 bytes", t.name, i,
                    (long long)t.stride[i]);
      t.dst[i] = t.stride[i];
    }
  }
  fill_token_rows(p);
  if (!pr.lse_ptr) return fail(err, err_len, kInvalid, pr, what, "lse pointer is null");
  if (backward && !pr.delta_ptr) return fail(err, err_len, kInvalid, pr, what, "delta pointer is null");
  if (backward && pr.rpb_ptr && !pr.drpb_ptr)
    return fail(err, err_len, kInvalid, pr, what, "rpb given without a drpb buffer");
  p.q = reinterpret_cast<const void*>(pr.q_ptr);
  p.k = reinterpret_cast<const void*>(pr.k_ptr);
  p.v = reinterpret_cast<const void*>(pr.v_ptr);
  p.out = reinterpret_cast<void*>(pr.out_ptr);
  p.lse = reinterpret_cast<float*>(pr.lse_ptr);
  p.rpb = reinterpret_cast<const float*>(pr.rpb_ptr);
  p.grad_out = reinterpret_cast<const void*>(pr.grad_out_ptr);
  p.grad_lse = reinterpret_cast<const float*>(pr.grad_lse_ptr);
  p.delta = reinterpret_cast<float*>(pr.delta_ptr);
  p.dq = reinterpret_cast<void*>(pr.dq_ptr);
  p.dk = reinterpret_cast<void*>(pr.dk_ptr);
  p.dv = reinterpret_cast<void*>(pr.dv_ptr);
  p.drpb = reinterpret_cast<float*>(pr.drpb_ptr);
  (void)err;
  return kOk;
}

// The launches' outcome: kOk, or the launch error naming the family and head-dim bucket.
int launched(const char* family, int head_dim, const NattnProblem& pr, const char* what, char* err, int64_t err_len) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return fail(err, err_len, kCudaError, pr, what, "kernel launch (%s family, head-dim bucket %d) failed: %s", family,
                head_dim, cudaGetErrorString(e));
  if (err && err_len > 0) err[0] = '\0';
  return kOk;
}

int run(const int64_t* fields, int64_t n_fields, double scale, void* stream, bool backward,
        char* err, int64_t err_len) {
  nattn::Params p;
  const nattn::KernelEntry* entry = nullptr;
  int code = build_params(fields, n_fields, scale, backward, p, entry, err, err_len);
  if (code != kOk) return code;
  NattnProblem pr;
  memcpy(&pr, fields, sizeof pr);
  const char* what = backward ? "nattn backward" : "nattn forward";
  // cudaSetDevice also makes the device's primary context current on this thread: a thread
  // that has made no runtime call yet (autograd's backward worker) has none, and the driver's
  // tensor-map encoding (sm90) refuses to run without one (CUDA_ERROR_INVALID_CONTEXT).
  cudaError_t e = cudaSetDevice(int(pr.device));
  if (e != cudaSuccess)
    return fail(err, err_len, kCudaError, pr, what, "selecting device %lld: %s",
                (long long)pr.device, cudaGetErrorString(e));
  // The Hopper family where it takes the problem (its prepare steps write the tensor maps
  // into `workspace`); else the tensor-core or SIMT entry build_params chose.
  alignas(nattn::kPrepareAlign) unsigned char workspace[nattn::kPrepareBytes];
  if (p.dtype != 0) {
    // A forward naming its tile pair or a split-KV factor runs the Hopper family (or fails
    // saying why), whatever the window.
    const bool named = !backward && (tile_requested(p) || p.kv_splits > 1);
    const bool required = family_cap() == kCapSm90Only || named;
    const int dim_max = p.dim > p.dim_v ? p.dim : p.dim_v;
    const char* why = nullptr;
    // Head dims without a Hopper instance of their own (D != D_v, or between its head dims):
    // zero-padded copies (sm90_padded.h) where that beats the native families, or is required.
    const int padded = p.drop_rng ? 0 : sm90_padded_head_dim(p, backward);
    if (padded && sm90_allowed(int(pr.device)) && (required || sm90_padded_preferred(p, padded, backward))) {
      why = run_sm90_padded(p, padded, backward, static_cast<cudaStream_t>(stream));
      if (!why) return launched("sm90 (zero-padded head dims)", padded, pr, what, err, err_len);
      if (required)
        return fail(err, err_len, kNotCompiled, pr, what, "%s, but the Hopper family declines the zero-padded head dims: %s",
                    named ? "the call names a Hopper configuration (tile pair or split-KV)" : "NATTN_FAMILY=sm90", why);
      why = nullptr;  // declined before any launch: the usual choice below
    }
    // The Hopper family's entry for this call, prepared (its tensor maps in `workspace`).
    auto try_sm90 = [&]() {
      const nattn::KernelEntry* h = backward ? find_sm90_backward(p, dim_max, &why) : find_sm90(p, dim_max, &why);
      if (h) why = (backward ? h->prepare_backward : h->prepare)(p, workspace);
      if (!why) {
        entry = h;
        p.prepared = workspace;
      }
    };
    const bool auto_split = !backward && !named && pr.kv_splits == 0 && sm90_allowed(int(pr.device)) &&
                            split_by_default(p, int(pr.device)) && !p.drop_rng;
    if (auto_split) {
      p.kv_splits = kDefaultSplits;
      try_sm90();
      if (why) p.kv_splits = 1;  // declined: the usual choice, unsplit
    }
    if (p.drop_rng) {
      why = kSm90NoDropout;  // the entry build_params chose runs it (tc, or simt when opted in)
    } else if (!auto_split || why) {
      why = nullptr;
      if (sm90_allowed(int(pr.device)) && (required || sm90_preferred(p, backward)))
        try_sm90();
      else
        why = sm90_allowed(int(pr.device)) ? "window below the family's minimum" : "the device is not compute capability 9.0";
    }
    if (why && required)
      return fail(err, err_len, kNotCompiled, pr, what, "%s, but the Hopper family declines: %s",
                  named ? "the call names a Hopper configuration (tile pair or split-KV)" : "NATTN_FAMILY=sm90", why);
  }
  (backward ? entry->backward : entry->forward)(p, static_cast<cudaStream_t>(stream));
  return launched(entry->family, entry->head_dim, pr, what, err, err_len);
}

}  // namespace

NATTN_API int64_t nattn_abi_version() { return NATTN_ABI_VERSION; }

NATTN_API int64_t nattn_num_problem_fields() { return NATTN_NUM_PROBLEM_FIELDS; }

// The Hopper family's configurations (tile pairs) for a forward problem, for profilers and
// tuners: one line per compiled pair of the problem's dtype, NA dim and head dim,
// "name keys flags" ('\n'-separated), keys = the keys its boxes walk per query (the cost
// the default choice uses), flags among "default" (what a call runs unless NATTN_SM90_TILE
// says otherwise), "backward" (the pair has the backward), "backward_default" (the pair the
// backward runs, find_sm90_backward), "declined:<reason>". Returns 0,
// or the error code and message of a forward with the same fields.
NATTN_API int nattn_sm90_configs(const int64_t* fields, int64_t n_fields, char* out, int64_t out_len, char* err,
                                 int64_t err_len) {
  nattn::Params p;
  const nattn::KernelEntry* entry = nullptr;
  const int code = build_params(fields, n_fields, 1.0, false, p, entry, err, err_len);
  if (code != kOk) return code;
  if (!out || out_len <= 0) return kInvalid;
  const int dim_max = p.dim > p.dim_v ? p.dim : p.dim_v;
  const nattn::KernelEntry* best = default_sm90(p, dim_max);
  const char* no_backward = nullptr;
  const nattn::KernelEntry* best_backward = find_sm90_backward(p, dim_max, &no_backward);
  int64_t used = 0;
  out[0] = '\0';
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i) {
    const nattn::KernelEntry& e = *all.e[i];
    if (!sm90_entry_for(e, p, dim_max)) continue;
    char name[64];
    sm90_tile_name(e, p.na_dim, name, sizeof name);
    const char* why = sm90_pair_declines(p, e);
    const int n = snprintf(out + used, size_t(out_len - used), "%s%s %.0f%s%s%s%s%s%s", used ? "\n" : "", name,
                           sm90_tile_cost(p, e), &e == best ? " default" : "", e.backward ? " backward" : "",
                           &e == best_backward ? " backward_default" : "", e.forward_named_only ? " named" : "",
                           why ? " declined:" : "", why ? why : "");
    if (n < 0 || used + n >= out_len) return fail(err, err_len, kInvalid, NattnProblem{}, "nattn_sm90_configs",
                                                  "output buffer of %lld bytes too small", (long long)out_len);
    used += n;
  }
  return kOk;
}

// Whether the default rules (no NATTN_FAMILY, no named tile pair or split) run this problem
// on the Hopper family on a compute capability 9.0 GPU: *out = 1 natively, 2 on zero-padded
// head dims, 0 on another family. The rules alone (sm90_preferred, sm90_padded_preferred and
// the compiled pairs' static checks), before any device query: split-KV's small-grid rule,
// which depends on the GPU's SM count, is left out. `fields` are a forward's (pointers
// nonzero, rpb's where the call has an RPB); `backward` asks about that problem's backward.
// For tests and dry runs (nattn.bench --dry-run). Returns 0, or the error of a forward with
// the same fields.
NATTN_API int nattn_sm90_preferred(const int64_t* fields, int64_t n_fields, int64_t backward, int64_t* out, char* err,
                                   int64_t err_len) {
  nattn::Params p;
  const nattn::KernelEntry* entry = nullptr;
  const int code = build_params(fields, n_fields, 1.0, false, p, entry, err, err_len);
  if (code != kOk) return code;
  if (!out) return kInvalid;
  NattnProblem pr;
  memcpy(&pr, fields, sizeof pr);
  *out = 0;
  if (p.dtype == 0 || pr.dropout_p_bits != 0) return kOk;  // float32 and dropout never run it
  const bool bwd = backward != 0;
  const int padded = sm90_padded_head_dim(p, bwd);
  if (padded) {
    *out = sm90_padded_preferred(p, padded, bwd) ? 2 : 0;
    return kOk;
  }
  const int dim_max = p.dim > p.dim_v ? p.dim : p.dim_v;
  const char* why = nullptr;
  const nattn::KernelEntry* e = bwd ? find_sm90_backward(p, dim_max, &why) : default_sm90(p, dim_max);
  if (!e || (!bwd && sm90_pair_declines(p, *e))) return kOk;
  *out = sm90_preferred(p, bwd) ? 1 : 0;
  return kOk;
}

// The families of this build whose kernels run attention dropout (kernel_table.DROPOUT_FAMILIES
// with compiled instances), ';'-separated: "tc;simt", "tc", "simt" or "" (Python's cuda backend
// then declines dropout, as it does with a library from before ABI 3, which lacks this
// function).
NATTN_API const char* nattn_dropout_families() {
  bool tc = false, simt = false;
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const char* f = nattn::kKernels[i].family;
    tc = tc || (f && !strcmp(f, "tc"));
    simt = simt || (f && !strcmp(f, "simt"));
  }
  return tc ? (simt ? "tc;simt" : "tc") : (simt ? "simt" : "");
}

// "family:dtype:na_dim:head_dim" for every compiled instance, ';'-separated.
NATTN_API const char* nattn_kernels() {
  static char buf[16384];
  if (!buf[0]) {
    size_t used = 0;
    for (int i = 0; i < nattn::kNumKernels && nattn::kKernels[i].family; ++i) {
      const nattn::KernelEntry& e = nattn::kKernels[i];
      used += snprintf(buf + used, sizeof buf - used, "%s%s:%s:%d:%d", used ? ";" : "", e.family,
                       kDtypeNames[e.dtype], e.na_dim, e.head_dim);
      if (used >= sizeof buf) break;
    }
  }
  return buf;
}

NATTN_API int nattn_forward(const int64_t* fields, int64_t n_fields, double scale, void* stream,
                            char* err, int64_t err_len) {
  return run(fields, n_fields, scale, stream, false, err, err_len);
}

NATTN_API int nattn_backward(const int64_t* fields, int64_t n_fields, double scale, void* stream,
                             char* err, int64_t err_len) {
  return run(fields, n_fields, scale, stream, true, err, err_len);
}
