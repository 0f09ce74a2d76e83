// Host side: tensor maps (TMA descriptors) over [B, *spatial, H, D] tensors, encoded from
// a MapSpec (tensor_map_spec.h): the 128-byte swizzle at 64 channels per box (64-byte at
// head dim 32). cuTensorMapEncodeTiled comes from the driver through the runtime's
// entry-point query, so libnattn links neither libcuda nor torch.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "nattn/common/registry.h"
#include "nattn/sm90/tensor_map_spec.h"

namespace nattn { namespace sm90 {

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

enum class MapType { kHalf, kBfloat16, kFloat };

// Encodes `m` over `ptr`; the swizzle is the box's inner row (128 bytes, or 64).
inline const char* encode(CUtensorMap* map, const MapSpec& m, const void* ptr, MapType type) {
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
  const CUtensorMapDataType dt = type == MapType::kFloat      ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                 : type == MapType::kBfloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const uint32_t row_bytes = m.box[0] * (type == MapType::kFloat ? 4 : 2);
  const CUresult r = fn(map, dt, cuuint32_t(m.rank), const_cast<void*>(ptr), dim, stride, box, es,
                        CU_TENSOR_MAP_INTERLEAVE_NONE,
                        row_bytes >= 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
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

inline const char* encode(CUtensorMap* map, const MapSpec& m, const void* ptr, bool bf16) {
  return encode(map, m, ptr, bf16 ? MapType::kBfloat16 : MapType::kHalf);
}

}  }  // namespace nattn::sm90
