// See sm90_padded.h.
#include "sm90_padded.h"

#include <stdint.h>
#include <string.h>

#include "nattn/common/device.h"  // poison_workspace
#include "nattn/sm90/pad_copy.cuh"
#include "nattn/sm90/tiles.cuh"
#include "sm90_dispatch.h"

namespace nattn { namespace host {

namespace {

constexpr int kCopyThreads = 256;

using nattn::sm90::PadCopy;

// `pad` fills the copy (channels C..HD zero), else the first C channels go back; grid
// (items / kCopyThreads, batch).
template <bool kPad, int NA>
__global__ void __launch_bounds__(kCopyThreads) pad_copy_kernel(const PadCopy c) {
  const unsigned i = blockIdx.x * kCopyThreads + threadIdx.x;
  if (i >= c.items) return;
  int64_t off, packed;
  const unsigned part = nattn::sm90::pad_copy_offsets<NA>(c, blockIdx.y, i, off, packed);
  if (kPad) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (int(part) * 8 < c.channels) v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(c.src) + off);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(c.dst) + packed) = v;
  } else if (int(part) * 8 < c.channels) {
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(c.dst) + off) =
        *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(c.src) + packed);
  }
}

// The problem's tensors a padded run may copy.
enum Field { kQ, kK, kV, kOut, kGradOut, kDq, kDk, kDv };

const void* pointer(const nattn::Params& p, Field f) {
  const void* const ptrs[] = {p.q, p.k, p.v, p.out, p.grad_out, p.dq, p.dk, p.dv};
  return ptrs[f];
}

void set_pointer(nattn::Params& p, Field f, void* ptr) {
  switch (f) {
    case kQ: p.q = ptr; break;
    case kK: p.k = ptr; break;
    case kV: p.v = ptr; break;
    case kOut: p.out = ptr; break;
    case kGradOut: p.grad_out = ptr; break;
    case kDq: p.dq = ptr; break;
    case kDk: p.dk = ptr; break;
    case kDv: p.dv = ptr; break;
  }
}

int64_t* strides(nattn::Params& p, Field f) {
  int64_t* const s[] = {p.q_s, p.k_s, p.v_s, p.out_s, p.grad_out_s, p.dq_s, p.dk_s, p.dv_s};
  return s[f];
}

// One tensor with fewer channels than the instance's head dim: its packed copy's place in
// the workspace, and whether the kernels write it (copied back after) or read it (before).
struct Slot {
  Field field;
  bool written;
  int heads, channels;
  int64_t offset;  // bytes into the workspace
  int64_t s[5];    // the caller's strides
};

PadCopy copy_of(const nattn::Params& p, const Slot& t, int hd) {
  PadCopy c;
  memcpy(c.s, t.s, sizeof c.s);
  for (int a = 0; a < 3; ++a) c.spatial[a] = unsigned(p.spatial[a]);
  c.na_dim = p.na_dim;
  c.channels = t.channels;
  c.part_shift = 0;
  while ((8 << c.part_shift) < hd) ++c.part_shift;
  c.heads = unsigned(t.heads);
  c.items = unsigned(p.tokens * t.heads * (hd / 8));
  return c;
}

template <bool kPad>
void launch_copy(const PadCopy& c, int batch, cudaStream_t stream) {
  const dim3 grid((c.items + kCopyThreads - 1) / kCopyThreads, unsigned(batch));
  if (c.na_dim == 1) pad_copy_kernel<kPad, 1><<<grid, kCopyThreads, 0, stream>>>(c);
  else if (c.na_dim == 2) pad_copy_kernel<kPad, 2><<<grid, kCopyThreads, 0, stream>>>(c);
  else pad_copy_kernel<kPad, 3><<<grid, kCopyThreads, 0, stream>>>(c);
}

// Packed [B, *spatial, H, hd] element strides (0 for absent axes, as the Python side passes).
void packed_strides(const nattn::Params& p, int heads, int hd, int64_t* s) {
  int64_t stride = int64_t(heads) * hd;
  s[4] = hd;
  for (int a = 2; a >= 0; --a) {
    s[1 + a] = a < p.na_dim ? stride : 0;
    if (a < p.na_dim) stride *= p.spatial[a];
  }
  s[0] = stride;
}

}  // namespace

int sm90_padded_head_dim(const nattn::Params& p, bool backward) {
  const int need = p.dim > p.dim_v ? p.dim : p.dim_v;
  int own = 0, best = 0;
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i) {
    const nattn::KernelEntry& e = *all.e[i];
    if (e.dtype != p.dtype || e.na_dim != p.na_dim) continue;
    if (backward && !e.backward) continue;
    if (e.head_dim == p.dim && p.dim == p.dim_v) own = e.head_dim;
    if (e.head_dim >= need && (!best || e.head_dim < best)) best = e.head_dim;
  }
  return own ? 0 : best;
}

bool sm90_padded_preferred(const nattn::Params& p, int hd, bool backward) {
  nattn::Params pp = p;
  pp.dim = pp.dim_v = hd;
  if (p.dim > kTcMaxHeadDim || p.dim_v > kTcMaxHeadDim) return true;  // no tc instance
  const int64_t minimum = kSm90PaddedMinWindow[p.na_dim - 1];
  return minimum > 0 && window_keys(p) >= minimum && sm90_preferred(pp, backward);
}

const char* run_sm90_padded(const nattn::Params& p, int hd, bool backward, cudaStream_t stream) {
  nattn::Params pp = p;
  pp.dim = pp.dim_v = hd;
  pp.token_rows = 0;  // the tensor-core walks' row flags: not read by the Hopper family
  Slot slots[8];
  int n = 0;
  int64_t bytes = 0;
  auto add = [&](Field f, bool written, int heads, int channels) {
    if (channels == hd) return;
    Slot& t = slots[n++];
    t = Slot{f, written, heads, channels, bytes, {}};
    memcpy(t.s, strides(pp, f), sizeof t.s);
    packed_strides(p, heads, hd, strides(pp, f));  // the family's checks and maps see the copy
    bytes += int64_t(p.batch) * p.tokens * heads * hd * 2;
  };
  add(kQ, false, p.heads, p.dim);
  add(kK, false, p.heads_kv, p.dim);
  add(kV, false, p.heads_kv, p.dim_v);
  add(kOut, !backward, p.heads, p.dim_v);  // the backward reads the output (delta)
  if (backward) {
    add(kGradOut, false, p.heads, p.dim_v);
    add(kDq, true, p.heads, p.dim);
    add(kDk, true, p.heads_kv, p.dim);
    add(kDv, true, p.heads_kv, p.dim_v);
  }
  if (p.tokens * (p.heads > p.heads_kv ? p.heads : p.heads_kv) * (hd / 8) > 0x7fffffff)
    return "more than 2^31 - 1 16-byte chunks a batch entry for the zero-padded copies";
  if (p.batch > 65535) return "batch above 65535 for the zero-padded copies' grid";
  const char* why = nullptr;
  const nattn::KernelEntry* e = backward ? find_sm90_backward(pp, hd, &why) : find_sm90(pp, hd, &why);
  if (!e) return why;
  char* base = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void**>(&base), size_t(bytes), stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return "no device memory for the zero-padded copies of the head dims";
  }
  nattn::host::poison_workspace(base, size_t(bytes), stream);
  for (int i = 0; i < n; ++i) set_pointer(pp, slots[i].field, base + slots[i].offset);
  // The tensor maps are encoded from the copies' addresses.
  alignas(nattn::kPrepareAlign) unsigned char workspace[nattn::kPrepareBytes];
  why = (backward ? e->prepare_backward : e->prepare)(pp, workspace);
  if (why) {
    cudaFreeAsync(base, stream);
    return why;
  }
  pp.prepared = workspace;
  for (int i = 0; i < n; ++i) {
    PadCopy c = copy_of(p, slots[i], hd);
    if (!slots[i].written) {
      c.src = pointer(p, slots[i].field);
      c.dst = base + slots[i].offset;
      launch_copy<true>(c, p.batch, stream);
    } else if (nattn::sm90::has_query_range(p)) {  // rows outside a query range are not written: they carry zeros back
      cudaMemsetAsync(base + slots[i].offset, 0, size_t(p.batch) * c.items * 16, stream);
    }
  }
  (backward ? e->backward : e->forward)(pp, stream);
  for (int i = 0; i < n; ++i) {
    if (!slots[i].written) continue;
    PadCopy c = copy_of(p, slots[i], hd);
    c.src = base + slots[i].offset;
    c.dst = const_cast<void*>(pointer(p, slots[i].field));
    launch_copy<false>(c, p.batch, stream);
  }
  cudaFreeAsync(base, stream);
  return nullptr;
}

}  }  // namespace nattn::host

// Per NA dim, the window (keys) from which problems without a Hopper instance of their head
// dims run it with zero-padded copies (head dims up to 128; above, forwards at any window),
// for Python's dispatch; 0: never.
extern "C" __attribute__((visibility("default"))) int64_t nattn_sm90_padded_min_window(int64_t na_dim) {
  return na_dim >= 1 && na_dim <= 3 ? nattn::host::kSm90PaddedMinWindow[na_dim - 1] : 0;
}
