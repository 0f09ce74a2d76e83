// The shape of a tensor map (TMA descriptor) over a [B, *spatial, H, D] tensor, and whether
// the copy engine can address the tensor that way: plain host code with no driver call, so
// that libnattn's problem checks (src/api.cu) can ask it on any toolkit. tensor_map.h encodes it.
//
// A map has rank NA + 2, innermost first: heads x channels merged into one axis (so the
// tensor's head stride must equal its head dim), the spatial axes from last to first, the
// batch. Its box is one key (or query) box of 64 channels (32 at head dim 32); the spatial
// element strides are the dilations, so a box of E tokens spans E * d real tokens.
#pragma once
#include <stdint.h>

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
// `heads` heads of `hd` channels, spatial box extents `box` (per axis 0..2); elements of
// `eb` bytes, `inner` channels per box (0: 64, or hd below 64).
// Returns a reason when the copy engine cannot address the tensor this way.
inline const char* map_spec(const Params& p, const int64_t* s, int heads, int hd, const int* box, MapSpec& m,
                            int eb = 2, int inner = 0) {
  const int nd = p.na_dim;
  if (heads > 1 && s[4] != hd) return "head stride differs from the head dim";
  m.rank = nd + 2;
  m.dim[0] = uint64_t(heads) * hd;
  m.box[0] = inner ? inner : hd >= 64 ? 64 : hd;
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

}  }  // namespace nattn::sm90
