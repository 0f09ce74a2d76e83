// C ABI of the forward LayerNorm (csrc/include/nattn/norm/layer_norm.cuh): checks the call and
// launches the (input dtype, output dtype) instance on the caller's stream.
#include <cuda_runtime.h>
#include <stdarg.h>

#include "error_text.h"
#include "lookup.h"
#include "nattn/norm/layer_norm.cuh"

#define NATTN_API extern "C" __attribute__((visibility("default")))

namespace {

using nattn::norm::LayerNormParams;

int norm_fail(char* err, int64_t err_len, int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int rc = nattn::host::write_error(err, err_len, code, "nattn layer_norm: ", fmt, ap);
  va_end(ap);
  return rc;
}

template <typename TIn>
void launch_for_output(const LayerNormParams& p, int y_dtype, cudaStream_t stream) {
  using namespace nattn::norm;
  if (y_dtype == kF32) launch_layer_norm<TIn, float>(p, stream);
  else if (y_dtype == kF16) launch_layer_norm<TIn, __half>(p, stream);
  else launch_layer_norm<TIn, nattn::bf16_t>(p, stream);
}

}  // namespace

// The largest channel count the kernel takes (larger rows: torch's own kernel is efficient).
NATTN_API int64_t nattn_layer_norm_max_channels() { return nattn::norm::kMaxChannels; }

namespace {

// Checks one call (r_ptr 0: no branch) and launches it; see the two entries below.
int run_norm(int64_t device, int64_t x_ptr, int64_t x_row, int64_t x_dtype, int64_t r_ptr, int64_t r_row,
             int64_t r_dtype, int64_t s_ptr, int64_t s_dtype, int64_t y_ptr, int64_t y_dtype, int64_t w_ptr,
             int64_t b_ptr, int64_t w_dtype, int64_t rows, int64_t channels, double eps, int64_t round, void* stream,
             char* err, int64_t err_len) {
  using namespace nattn::norm;
  const int64_t dtypes[5] = {x_dtype, y_dtype, w_dtype, r_dtype, s_dtype};
  const char* names[5] = {"x_dtype", "y_dtype", "w_dtype", "r_dtype", "s_dtype"};
  for (int i = 0; i < (r_ptr ? 5 : 3); ++i)
    if (dtypes[i] < kF32 || dtypes[i] > kBF16)
      return norm_fail(err, err_len, 1, "%s must be 0 (float32), 1 (float16) or 2 (bfloat16), got %lld", names[i],
                       (long long)dtypes[i]);
  if (channels < kChunk || channels > kMaxChannels || channels % kChunk)
    return norm_fail(err, err_len, 1, "channels must be a multiple of %d from %d to %d, got %lld", kChunk, kChunk,
                     kMaxChannels, (long long)channels);
  if (rows < 0 || (rows + kThreads - 1) / kThreads * 32 >= (int64_t(1) << 31))
    return norm_fail(err, err_len, 1, "rows must be from 0 to 2^34, got %lld", (long long)rows);
  if (rows == 0) return 0;  // nothing to read or write (empty tensors may have null pointers)
  if (x_row < channels) return norm_fail(err, err_len, 1, "x_row (%lld) must be >= channels (%lld)",
                                         (long long)x_row, (long long)channels);
  const int x_size = x_dtype == kF32 ? 4 : 2, w_size = w_dtype == kF32 ? 4 : 2;
  if (!x_ptr || !y_ptr || x_ptr % 16 || y_ptr % 16 || (x_row * x_size) % 16)
    return norm_fail(err, err_len, 1, "x and y must be non-null with 16-byte aligned rows (x_row=%lld)",
                     (long long)x_row);
  if (w_ptr % 16 || b_ptr % 16 || (channels * w_size) % 16)
    return norm_fail(err, err_len, 1, "w and b must be 16-byte aligned");
  if (r_ptr) {
    const int r_size = r_dtype == kF32 ? 4 : 2;
    if (r_row < channels) return norm_fail(err, err_len, 1, "r_row (%lld) must be >= channels (%lld)",
                                           (long long)r_row, (long long)channels);
    if (r_ptr % 16 || !s_ptr || s_ptr % 16 || (r_row * r_size) % 16)
      return norm_fail(err, err_len, 1, "r and s must be non-null with 16-byte aligned rows (r_row=%lld)",
                       (long long)r_row);
  }
  if (!(eps >= 0.0)) return norm_fail(err, err_len, 1, "eps must be >= 0, got %g", eps);
  LayerNormParams p;
  p.x = reinterpret_cast<const void*>(x_ptr);
  p.y = reinterpret_cast<void*>(y_ptr);
  p.w = reinterpret_cast<const void*>(w_ptr);
  p.b = reinterpret_cast<const void*>(b_ptr);
  p.rows = rows;
  p.x_row = x_row;
  p.channels = int(channels);
  p.lanes = layer_norm_lanes(int(channels));
  p.w_dtype = int(w_dtype);
  p.eps = float(eps);
  p.round = round != 0;
  p.passes = layer_norm_passes(rows, p.lanes, nattn::host::device_sms(int(device)));
  p.r = reinterpret_cast<const void*>(r_ptr);
  p.s = r_ptr ? reinterpret_cast<void*>(s_ptr) : nullptr;
  p.r_row = r_row;
  p.r_dtype = int(r_dtype);
  p.s_dtype = int(s_dtype);
  cudaError_t e = cudaSetDevice(int(device));
  if (e == cudaSuccess) {
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (x_dtype == kF32) launch_for_output<float>(p, int(y_dtype), st);
    else if (x_dtype == kF16) launch_for_output<__half>(p, int(y_dtype), st);
    else launch_for_output<nattn::bf16_t>(p, int(y_dtype), st);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    return norm_fail(err, err_len, 3, "on device %lld: %s", (long long)device, cudaGetErrorString(e));
  return 0;
}

}  // namespace

// y = LayerNorm(x) over the last axis: rows x channels, x's rows `x_row` elements apart (its
// channels packed), y packed; dtypes are kernel_table.DTYPES codes (w_dtype: w's and b's; w
// and b may be 0). Returns 0, or 1 (invalid call) or 3 (CUDA error) with the message in err.
NATTN_API int nattn_layer_norm(int64_t device, int64_t x_ptr, int64_t x_row, int64_t x_dtype, int64_t y_ptr,
                               int64_t y_dtype, int64_t w_ptr, int64_t b_ptr, int64_t w_dtype, int64_t rows,
                               int64_t channels, double eps, int64_t round, void* stream, char* err,
                               int64_t err_len) {
  return run_norm(device, x_ptr, x_row, x_dtype, 0, 0, 0, 0, 0, y_ptr, y_dtype, w_ptr, b_ptr, w_dtype, rows,
                  channels, eps, round, stream, err, err_len);
}

// s = x + r, then y = LayerNorm(s), in one pass (a residual add and the next pre-norm): r's
// rows `r_row` elements apart (channels packed), r_ptr non-null; s (s_dtype: x + r's type
// promotion, the caller's choice) and y packed; the rest as nattn_layer_norm, whose
// `round` rounds s.
NATTN_API int nattn_add_layer_norm(int64_t device, int64_t x_ptr, int64_t x_row, int64_t x_dtype, int64_t r_ptr,
                                   int64_t r_row, int64_t r_dtype, int64_t s_ptr, int64_t s_dtype, int64_t y_ptr,
                                   int64_t y_dtype, int64_t w_ptr, int64_t b_ptr, int64_t w_dtype, int64_t rows,
                                   int64_t channels, double eps, int64_t round, void* stream, char* err,
                                   int64_t err_len) {
  if (!r_ptr && rows > 0) return norm_fail(err, err_len, 1, "r must be non-null");
  return run_norm(device, x_ptr, x_row, x_dtype, r_ptr, r_row, r_dtype, s_ptr, s_dtype, y_ptr, y_dtype, w_ptr,
                  b_ptr, w_dtype, rows, channels, eps, round, stream, err, err_len);
}
