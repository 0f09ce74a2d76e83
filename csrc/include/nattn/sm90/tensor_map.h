// Host side: tensor maps (TMA descriptors) over [B, *spatial, H, D] tensors.
//
// A map has rank NA + 2, innermost first: heads x channels merged into one axis (so the
// tensor's head stride must equal its head dim), the spatial axes from last to first, the
// batch. Its box is one key (or query) box of 64 channels (the 128-byte swizzle span;
// head dim 32: 32 channels, 64-byte swizzle); the spatial element strides are the
// dilations, so a box of E tokens spans E * d real tokens of one dilation group.
// cuTensorMapEncodeTiled comes from the driver through the runtime's entry-point query,
// so libnattn links neither libcuda nor torch.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "nattn/common/registry.h"

namespace nattn { namespace sm90 {

struct MapSpec {
  int rank;
  uint64_t dim[5];
  uint64_t stride_bytes[4];
  uint32_t box[5];
  uint32_t element_stride[5];
};

// Fills a map spec for tensor `ptr` with element strides s (batch, axes 0..2, heads),
// `heads` heads of `hd` channels, spatial box extents `box` (per axis 0..2).
// Returns a reason when the copy engine cannot address the tensor this way.
inline const char* map_spec(const Params& p, const int64_t* s, int heads, int hd, const int* box, MapSpec& m) {
  const int nd = p.na_dim, eb = 2;
  if (heads > 1 && s[4] != hd) return "head stride differs from the head dim";
  m.rank = nd + 2;
  m.dim[0] = uint64_t(heads) * hd;
  m.box[0] = hd >= 64 ? 64 : hd;
  m.element_stride[0] = 1;
  for (int a = 0; a < nd; ++a) {
    const int i = nd - a;  // map axis of spatial axis a
    m.dim[i] = uint64_t(p.spatial[a]);
    m.stride_bytes[i - 1] = uint64_t(s[1 + a]) * eb;
    m.box[i] = uint32_t(box[a] * p.dilation[a]);
    m.element_stride[i] = uint32_t(p.dilation[a]);
    if (p.dilation[a] > 8) return "dilation above 8 (the copy engine's largest element stride)";
    if (m.box[i] > 256) return "box extent times dilation above 256";
  }
  m.dim[nd + 1] = uint64_t(p.batch);
  m.stride_bytes[nd] = uint64_t(s[0]) * eb;
  m.box[nd + 1] = 1;
  m.element_stride[nd + 1] = 1;
  uint64_t packed = m.dim[0] * eb;  // the stride a packed tensor would have
  for (int i = 1; i <= nd + 1; ++i) {
    uint64_t& st = m.stride_bytes[i - 1];
    if (m.dim[i] == 1) st = (packed + 15) / 16 * 16;  // never stepped along: any legal stride
    if (st == 0 || st % 16 || st >= (uint64_t(1) << 40))
      return "a token or batch stride is zero, or not a multiple of 16 bytes below 2^40";
    packed = st * m.dim[i];
  }
  return nullptr;
}

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

inline const char* encode(CUtensorMap* map, const MapSpec& m, const void* ptr, bool bf16) {
  EncodeTiledFn fn = encode_tiled_fn();
  if (!fn) return "the driver has no cuTensorMapEncodeTiled";
  cuuint64_t dim[5], stride[4];
  cuuint32_t box[5], es[5];
  for (int i = 0; i < m.rank; ++i) {
    dim[i] = m.dim[i];
    box[i] = m.box[i];
    es[i] = m.element_stride[i];
    if (i < m.rank - 1) stride[i] = m.stride_bytes[i];
  }
  const CUresult r = fn(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                        cuuint32_t(m.rank), const_cast<void*>(ptr), dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        m.box[0] * 2 >= 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return nullptr;
  // The map itself, so a refusal can be understood from the error message alone.
  static thread_local char why[320];
  int n = snprintf(why, sizeof why, "cuTensorMapEncodeTiled refused the tensor (CUresult %d, address %p; dims",
                   int(r), ptr);
  for (int i = 0; i < m.rank && n < int(sizeof why); ++i) n += snprintf(why + n, sizeof why - n, " %llu", (unsigned long long)dim[i]);
  n += snprintf(why + n, sizeof why - n, ", byte strides");
  for (int i = 0; i + 1 < m.rank && n < int(sizeof why); ++i)
    n += snprintf(why + n, sizeof why - n, " %llu", (unsigned long long)stride[i]);
  n += snprintf(why + n, sizeof why - n, ", box");
  for (int i = 0; i < m.rank && n < int(sizeof why); ++i) n += snprintf(why + n, sizeof why - n, " %u", box[i]);
  n += snprintf(why + n, sizeof why - n, ", element strides");
  for (int i = 0; i < m.rank && n < int(sizeof why); ++i) n += snprintf(why + n, sizeof why - n, " %u", es[i]);
  if (n < int(sizeof why)) snprintf(why + n, sizeof why - n, ")");
  return why;
}

}  }  // namespace nattn::sm90
