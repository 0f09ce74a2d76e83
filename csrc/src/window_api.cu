// C ABI of the unfused window ops (nattn.na*d_qk / na*d_av; csrc/include/nattn/window/):
// checks one NattnWindowProblem, picks the (dtype, NA dim) instance from the generated
// window table and launches it on the caller's stream.
#include <cuda_runtime.h>
#include <stdarg.h>

#include "error_text.h"
#include "nattn/problem.h"  // generated from nattn/_cuda/kernel_table.py
#include "nattn/window/params.h"

#define NATTN_API extern "C" __attribute__((visibility("default")))

namespace {

const char* const kOpNames[] = {"dot", "sum", "inverse_sum"};

int window_fail(char* err, int64_t err_len, int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int rc = nattn::host::write_error(err, err_len, code, "nattn window op: ", fmt, ap);
  va_end(ap);
  return rc;
}

}  // namespace

// Returns 0, or 1 (invalid problem), 2 (no compiled instance), 3 (CUDA error) with the
// message in err.
NATTN_API int nattn_window_op(const int64_t* fields, int64_t n_fields, void* stream, char* err, int64_t err_len) {
  if (!fields || n_fields != NATTN_NUM_WINDOW_FIELDS)
    return window_fail(err, err_len, 1, "expected %d fields, got %lld (library and Python side out of step)",
                       NATTN_NUM_WINDOW_FIELDS, (long long)n_fields);
  NattnWindowProblem pr;
  for (int i = 0; i < NATTN_NUM_WINDOW_FIELDS; ++i) reinterpret_cast<int64_t*>(&pr)[i] = fields[i];
  if (pr.abi_version != NATTN_ABI_VERSION)
    return window_fail(err, err_len, 1, "ABI version %lld, library has %d", (long long)pr.abi_version,
                       NATTN_ABI_VERSION);
  if (pr.op < 0 || pr.op > 2) return window_fail(err, err_len, 1, "op must be 0, 1 or 2, got %lld", (long long)pr.op);
  if (pr.dtype < 0 || pr.dtype > 2) return window_fail(err, err_len, 1, "unknown dtype code %lld", (long long)pr.dtype);
  if (pr.na_dim < 1 || pr.na_dim > 3)
    return window_fail(err, err_len, 1, "na_dim must be 1, 2 or 3, got %lld", (long long)pr.na_dim);
  if (pr.batch < 1 || pr.heads < 1 || pr.heads_kv < 1 || pr.heads % pr.heads_kv || pr.dim < 8 || pr.dim % 8 ||
      pr.heads > (1 << 20) || pr.dim > (1 << 16))
    return window_fail(err, err_len, 1,
                       "%s: need batch, heads, heads_kv >= 1, heads divisible by heads_kv and dim a multiple of 8 "
                       "(got batch=%lld heads=%lld heads_kv=%lld dim=%lld)", kOpNames[pr.op], (long long)pr.batch,
                       (long long)pr.heads, (long long)pr.heads_kv, (long long)pr.dim);
  nattn::window::WindowParams p = {};
  p.op = int(pr.op);
  p.na_dim = int(pr.na_dim);
  p.batch = int(pr.batch);
  p.heads = int(pr.heads);
  p.heads_kv = int(pr.heads_kv);
  p.groups = p.heads / p.heads_kv;
  p.dim = int(pr.dim);
  p.tokens = 1;
  p.window = 1;
  for (int a = 0; a < 3; ++a) {
    const bool used = a < p.na_dim;
    const int64_t n = used ? pr.spatial[a] : 1, k = used ? pr.kernel[a] : 1, s = used ? pr.stride[a] : 1,
                  d = used ? pr.dilation[a] : 1;
    if (n < 1 || n > (1 << 24) || k < 1 || s < 1 || s > k || d < 1 || k * d > n)
      return window_fail(err, err_len, 1,
                         "%s: axis %d needs 1 <= stride <= kernel and kernel * dilation <= size (got size=%lld "
                         "kernel=%lld stride=%lld dilation=%lld)", kOpNames[pr.op], a, (long long)n, (long long)k,
                         (long long)s, (long long)d);
    p.spatial[a] = int(n);
    p.kernel[a] = int(k);
    p.stride[a] = int(s);
    p.dilation[a] = int(d);
    p.causal[a] = used && pr.causal[a] != 0;
    p.tokens *= n;
    p.window *= int(k);
  }
  if (p.tokens * p.batch > (int64_t(1) << 40) || p.window > (1 << 20))
    return window_fail(err, err_len, 1, "%s: problem too large", kOpNames[pr.op]);
  p.neg_inf = pr.neg_inf != 0;
  p.a = reinterpret_cast<const void*>(pr.a_ptr);
  p.b = reinterpret_cast<const void*>(pr.b_ptr);
  p.out = reinterpret_cast<void*>(pr.out_ptr);
  if (!p.a || !p.b || !p.out || (pr.a_ptr | pr.b_ptr | pr.out_ptr) % 16)
    return window_fail(err, err_len, 1, "%s: every tensor pointer must be non-null and 16-byte aligned",
                       kOpNames[pr.op]);
  const nattn::window::WindowEntry* entry = nullptr;
  for (int i = 0; i < nattn::window::kNumWindowKernels; ++i) {
    const nattn::window::WindowEntry& e = nattn::window::kWindowKernels[i];
    if (e.launch && e.dtype == pr.dtype && e.na_dim == pr.na_dim) entry = &e;
  }
  if (!entry)
    return window_fail(err, err_len, 2, "%s: not compiled for dtype code %lld, %lld-D (this build's NATTN_DTYPES / "
                       "NATTN_NA_DIMS)", kOpNames[pr.op], (long long)pr.dtype, (long long)pr.na_dim);
  cudaError_t e = cudaSetDevice(int(pr.device));
  if (e == cudaSuccess) {
    entry->launch(p, static_cast<cudaStream_t>(stream));
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    return window_fail(err, err_len, 3, "%s on device %lld: %s", kOpNames[pr.op], (long long)pr.device,
                       cudaGetErrorString(e));
  return 0;
}

// "dtype_code:na_dim" for every compiled window-op instance, ';'-separated.
NATTN_API const char* nattn_window_kernels() {
  static char buf[256];
  if (!buf[0]) {
    size_t used = 0;
    for (int i = 0; i < nattn::window::kNumWindowKernels && used < sizeof buf; ++i) {
      const nattn::window::WindowEntry& e = nattn::window::kWindowKernels[i];
      if (e.launch) used += snprintf(buf + used, sizeof buf - used, "%s%d:%d", used ? ";" : "", e.dtype, e.na_dim);
    }
  }
  return buf;
}
