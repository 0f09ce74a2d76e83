// The shape of a tensor map (TMA descriptor) over a [B, *spatial, H, D] tensor, and whether
// the copy engine can address the tensor that way: plain host code with no driver call, so
// that libnattn's problem checks (src/api.cu) can ask it on any toolkit. tensor_map.h encodes it.
//
// A map has rank NA + 2, innermost first: the channels, the spatial axes from last to first,
// and an outer axis. Heads sit in one of two places:
// - inside a token's row (head stride == head dim: plain heads-last tensors, q/k/v sliced
//   from one fused projection): the innermost axis is heads x channels, the outer the batch;
//   a head's first channel is at coordinate h * D, batch b at b;
// - next to the batch (batch stride == heads x head stride, or one batch entry: heads-first
//   [B, H, *spatial, D] tensors viewed heads-last): the innermost axis is the D channels, the
//   outer batch x heads; head h of batch b is at outer coordinate b * H + h
//   (MapSpec::heads_outer; the kernels' head_coords).
// Its box is one key (or query) box of 64 channels (32 at head dim 32); the spatial element
// strides are the dilations, so a box of E tokens spans E * d real tokens. The copy engine
// takes at most 256 elements per axis: where E * d is more on axis 0 (1-D boxes of 64 or 128
// tokens at dilation 3 to 8), the map's box is a piece of E / n tokens and the kernels copy
// a box in n pieces (box_pieces; the tile's rows are axis-0 major, so the pieces' rows are
// consecutive and land where one copy would put them).
#pragma once
#include <stdint.h>

#include "nattn/common/registry.h"

namespace nattn { namespace sm90 {

// The copy engine's largest box extent per axis, in elements, and its largest element
// stride (the family's largest dilation).
constexpr int kMaxBoxElements = 256;
constexpr int kMaxElementStride = 8;

// Pieces of a box of `extent` tokens along axis 0 at `dilation` (a power of two dividing the
// extent; 1 when it fits the copy engine's box). Host (map_spec) and device (the producers'
// copies) agree through this function.
// (A loop, not recursion: a recursive call stays an extern call in device code, which
// serializes the kernel's wgmma.)
__host__ __device__ __forceinline__ constexpr int box_pieces(int extent, int dilation) {
  int n = 1;
  while (extent / n * dilation > kMaxBoxElements && (extent / n) % 2 == 0) n *= 2;
  return n;
}

// Piece j of such a box: its first axis-0 step in the tile (times the tile rows per step
// for its first row) and its axis-0 coordinate offset from the box's first (real tokens).
struct BoxPiece {
  int step, offset;
};
__host__ __device__ __forceinline__ constexpr BoxPiece box_piece(int extent, int dilation, int j) {
  return BoxPiece{j * (extent / box_pieces(extent, dilation)), j * (extent / box_pieces(extent, dilation)) * dilation};
}

struct MapSpec {
  int rank;
  uint64_t dim[5];
  uint64_t stride_bytes[4];
  uint32_t box[5];
  uint32_t element_stride[5];
  bool heads_outer;  // heads merged with the batch (above), else inside a token's row
};

// Fills a map spec for tensor `ptr` with element strides s (batch, axes 0..2, heads),
// `heads` heads of `hd` channels, spatial box extents `box` (per axis 0..2); elements of
// `eb` bytes, `inner` channels per box (0: 64, or hd below 64).
// `pieces`: whether axis 0's box may be copied in pieces (box_pieces; not for the bulk
// reductions, which take one box at a time).
// Returns a reason when the copy engine cannot address the tensor this way.
inline const char* map_spec(const Params& p, const int64_t* s, int heads, int hd, const int* box, MapSpec& m,
                            int eb = 2, int inner = 0, bool pieces = true) {
  const int nd = p.na_dim;
  m.heads_outer = heads > 1 && s[4] != hd;
  if (m.heads_outer && p.batch > 1 && s[0] != int64_t(heads) * s[4])
    return "a head stride other than the head dim needs the batch stride to be heads x head stride "
           "(heads-first [B, H, *spatial, D] tensors viewed heads-last)";
  if (m.heads_outer && int64_t(p.batch) * heads > 0x7fffffff) return "more than 2^31 - 1 batch x heads";
  m.rank = nd + 2;
  m.dim[0] = m.heads_outer ? uint64_t(hd) : uint64_t(heads) * hd;
  m.box[0] = inner ? inner : hd >= 64 ? 64 : hd;
  m.element_stride[0] = 1;
  for (int a = 0; a < nd; ++a) {
    const int i = nd - a;  // map axis of spatial axis a
    m.dim[i] = uint64_t(p.spatial[a]);
    m.stride_bytes[i - 1] = uint64_t(s[1 + a]) * eb;
    const int n = a == 0 && pieces ? box_pieces(box[a], p.dilation[a]) : 1;
    m.box[i] = uint32_t(box[a] / n * p.dilation[a]);
    m.element_stride[i] = uint32_t(p.dilation[a]);
    if (p.dilation[a] > kMaxElementStride) return "dilation above 8 (the copy engine's largest element stride)";
    if (m.box[i] > kMaxBoxElements) return "box extent times dilation above 256";
  }
  m.dim[nd + 1] = uint64_t(p.batch) * (m.heads_outer ? heads : 1);
  m.stride_bytes[nd] = uint64_t(m.heads_outer ? s[4] : s[0]) * eb;
  m.box[nd + 1] = 1;
  m.element_stride[nd + 1] = 1;
  uint64_t packed = m.dim[0] * eb;  // the stride a packed tensor would have
  for (int i = 1; i <= nd + 1; ++i) {
    uint64_t& st = m.stride_bytes[i - 1];
    if (m.dim[i] == 1) st = (packed + 15) / 16 * 16;  // never stepped along: any legal stride
    if (st == 0 || st % 16 || st >= (uint64_t(1) << 40))
      return "a token, head or batch stride is zero, or not a multiple of 16 bytes below 2^40";
    packed = st * m.dim[i];
  }
  return nullptr;
}

// Where head h of batch entry b starts in a tensor's map: the channel coordinate of its
// first channel and the outer coordinate, for heads inside a token's row (h * HD, b) or next
// to the batch (0, b * heads + h). `tensor` is the tensor's kRows* bit in
// Params::map_heads_outer (the launchers copy it from the maps' MapSpec::heads_outer).
struct HeadCoords {
  int channel, outer;
};
template <int HD>
__host__ __device__ __forceinline__ HeadCoords head_coords(const Params& p, int tensor, int heads, int h, int b) {
  return (p.map_heads_outer & tensor) ? HeadCoords{0, b * heads + h} : HeadCoords{h * HD, b};
}

}  }  // namespace nattn::sm90
