// Tile-level helpers of the tensor-core family over mma.cuh: loading and staging rows,
// the products over a staged chunk (S = A B^T and the row products that take P / dS from
// registers), packing the score fragments as an A operand, and storing output rows.
#pragma once
#include "nattn/tc/config.cuh"
#include "nattn/tc/mma.cuh"

namespace nattn { namespace tc {

__device__ __forceinline__ unsigned ld32(const void* p) { return *reinterpret_cast<const unsigned*>(p); }

// A fragments (rows r0 = lane/4 and r1 = r0 + 8 of the warp's box) of a token-major tensor.
template <int HD, typename T>
__device__ __forceinline__ void load_a(unsigned (*a)[4], const T* r0, const T* r1, int dim, int t) {
#pragma unroll
  for (int kt = 0; kt < HD / 16; ++kt) {
    const int c = kt * 16 + 2 * t;
    a[kt][0] = c < dim ? ld32(r0 + c) : 0u;
    a[kt][1] = c < dim ? ld32(r1 + c) : 0u;
    a[kt][2] = c + 8 < dim ? ld32(r0 + c + 8) : 0u;
    a[kt][3] = c + 8 < dim ? ld32(r1 + c + 8) : 0u;
  }
}

// Copies the warp's own 16 rows (rows lane/4 and lane/4 + 8 at r0 / r1) of a token-major
// tensor into a padded tile, channels past `dim` zero-filled: the A operand of the products
// below, read with ldmatrix each chunk instead of held in registers (a 16 x HD fragment
// costs HD / 4 registers a thread; the backward kernels spilled with them).
template <typename T, int HD>
__device__ __forceinline__ void stage_rows(typename Layout<T, HD>::S* tile, const T* r0, const T* r1, int dim,
                                           int lane) {
  using Lt = Layout<T, HD>;
  const int row = lane / 4, tq = lane % 4;
#pragma unroll
  for (int c = tq * Lt::VEC; c < HD; c += 4 * Lt::VEC) {
    cp_async16(tile + row * Lt::P + c, c < dim ? static_cast<const void*>(r0 + c) : r0, c < dim);
    cp_async16(tile + (row + 8) * Lt::P + c, c < dim ? static_cast<const void*>(r1 + c) : r1, c < dim);
  }
}

// TF32: rounds the pieces this lane staged with stage_rows (once they have landed: its own
// cp.async groups waited for) to TF32 in place, so that the products read them as A operands
// without a conversion per chunk. The warp synchronises before another lane reads them.
template <int HD>
__device__ __forceinline__ void round_rows_tf32(float* tile, int lane) {
  using Lt = Layout<float, HD>;
  const int row = lane / 4, tq = lane % 4;
#pragma unroll
  for (int c = tq * Lt::VEC; c < HD; c += 4 * Lt::VEC)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float4* x = reinterpret_cast<float4*>(tile + (row + 8 * r) * Lt::P + c);
      float4 v = *x;
      v.x = __uint_as_float(to_tf32(v.x));
      v.y = __uint_as_float(to_tf32(v.y));
      v.z = __uint_as_float(to_tf32(v.z));
      v.w = __uint_as_float(to_tf32(v.w));
      *x = v;
    }
}

// s[2][4] = A (16 x HD, a staged tile) times another staged tile's rows transposed (HD x 16).
// TF32: A is a tile rounded by round_rows_tf32; the other tile's fragments are rounded here.
template <typename T, int HD>
__device__ __forceinline__ void mma_tiles_t(float (*s)[4], const typename Layout<T, HD>::S* a_tile,
                                            const typename Layout<T, HD>::S* tile, int lane) {
  using Lt = Layout<T, HD>;
  const int mi = lane / 8, ri = lane % 8;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
  if constexpr (Lt::kF32) {
    // k-step kt: channels 8 kt .. 8 kt + 7. A's four 8x4 matrices: rows 0-7 / 8-15 (mi & 1) by
    // channels 0-3 / 4-7 (mi >> 1), giving a0..a3; B's: tokens 0-7 / 8-15 (mi >> 1, the n-tile)
    // by channels 0-3 / 4-7 (mi & 1), giving b0, b1 of n-tile 0 and of n-tile 1. Unrolled by 2
    // only: fully unrolled, the fragment loads ptxas hoists cost 30-60 registers a thread and
    // the forward / dK/dV passes spilled at head dims 64 and 128.
#pragma unroll 2
    for (int kt = 0; kt < Lt::KT; ++kt) {
      unsigned a[4], b[4];
      ldmatrix_x4(a, a_tile + ((mi & 1) * 8 + ri) * Lt::P + kt * 8 + (mi >> 1) * 4);
      ldmatrix_x4(b, tile + ((mi >> 1) * 8 + ri) * Lt::P + kt * 8 + (mi & 1) * 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = to_tf32(__uint_as_float(b[i]));
      Mma<T>::run(s[0], a, b);
      Mma<T>::run(s[1], a, b + 2);
    }
  } else {
#pragma unroll
    for (int kt = 0; kt < Lt::KT; ++kt) {
      unsigned a[4], b[4];
      ldmatrix_x4(a, a_tile + (lane % 16) * Lt::P + kt * 16 + (lane / 16) * 8);
      ldmatrix_x4(b, tile + (ri + (mi >> 1) * 8) * Lt::P + kt * 16 + (mi & 1) * 8);
      Mma<T>::run(s[0], a, b);
      Mma<T>::run(s[1], a, b + 2);
    }
  }
}

// acc[NT][4] += A (16 x 16, packed from two score n-tiles by pack_a) times the staged tile
// (16 x HD). TF32: two k-steps of 8 tokens (one per score n-tile); k-step ks's A column t is
// token 8 ks + 2t and column t + 4 token 8 ks + 2t + 1 (pack_a), so lane (g, t) takes B's b0
// / b1 from tokens 8 ks + 2t / + 1. Its column n = g is channel 16 m + 2g + j in n-tile 2m + j
// (the n columns may be in any order): the lane reads both n-tiles of a pair with one 64-bit
// load per token (lanes g, t of a half-warp hit banks 8t + 2g, + 1), and an accumulator row's
// four channels 16 m + 4t .. + 3 end up in one lane (store_rows: one 16-byte store).
template <typename T, int HD>
__device__ __forceinline__ void mma_rows(float (*acc)[4], const unsigned* a, const typename Layout<T, HD>::S* tile,
                                         int lane) {
  using Lt = Layout<T, HD>;
  if constexpr (Lt::kF32) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const float* r0 = tile + (ks * 8 + 2 * t) * Lt::P + 2 * g;
#pragma unroll
      for (int m = 0; m < Lt::NT / 2; ++m) {
        const float2 x0 = *reinterpret_cast<const float2*>(r0 + 16 * m);          // token 2t
        const float2 x1 = *reinterpret_cast<const float2*>(r0 + Lt::P + 16 * m);  // token 2t + 1
        const unsigned b0[2] = {to_tf32(x0.x), to_tf32(x1.x)}, b1[2] = {to_tf32(x0.y), to_tf32(x1.y)};
        Mma<T>::run(acc[2 * m], a + 4 * ks, b0);
        Mma<T>::run(acc[2 * m + 1], a + 4 * ks, b1);
      }
    }
  } else {
    const int mi = lane / 8, ri = lane % 8;
#pragma unroll
    for (int np = 0; np < Lt::NT / 2; ++np) {
      unsigned b[4];
      ldmatrix_x4_trans(b, tile + (ri + (mi & 1) * 8) * Lt::P + np * 16 + (mi >> 1) * 8);
      Mma<T>::run(acc[2 * np], a, b);
      Mma<T>::run(acc[2 * np + 1], a, b + 2);
    }
  }
}

// The A operand of mma_rows from two score n-tiles s (Layout::AREGS registers). TF32: k-step
// ks is n-tile ks, its A registers {(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)} the
// fragment's {c0, c2, c1, c3} (columns 2t and 2t + 1 as A columns t and t + 4), rounded.
template <typename T>
__device__ __forceinline__ void pack_a(unsigned* a, const float (*s)[4]) {
  if constexpr (is_tf32<T>()) {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      a[4 * ks + 0] = to_tf32(s[ks][0]);
      a[4 * ks + 1] = to_tf32(s[ks][2]);
      a[4 * ks + 2] = to_tf32(s[ks][1]);
      a[4 * ks + 3] = to_tf32(s[ks][3]);
    }
  } else {
    a[0] = Mma<T>::pack(s[0][0], s[0][1]);
    a[1] = Mma<T>::pack(s[0][2], s[0][3]);
    a[2] = Mma<T>::pack(s[1][0], s[1][1]);
    a[3] = Mma<T>::pack(s[1][2], s[1][3]);
  }
}

// Stores rows r0/r1 of an accumulator (times f0/f1) to a token-major tensor.
// TF32 instances: fragments of n-tiles 2m, 2m + 1 hold channels 16 m + 4t .. + 3 (mma_rows).
template <typename T, int HD>
__device__ __forceinline__ void store_rows(T* r0, T* r1, bool ok0, bool ok1, const float (*acc)[4], float f0,
                                           float f1, int dim, int t) {
  if constexpr (is_tf32<T>()) {  // float32 outputs: four channels a store
#pragma unroll
    for (int m = 0; m < HD / 16; ++m) {
      const int c = 16 * m + 4 * t;
      if (c >= dim) continue;  // dim is a multiple of 8: the four channels are all in or all out
      const float* x = acc[2 * m];
      const float* y = acc[2 * m + 1];
      if (ok0) *reinterpret_cast<float4*>(r0 + c) = make_float4(x[0] * f0, y[0] * f0, x[1] * f0, y[1] * f0);
      if (ok1) *reinterpret_cast<float4*>(r1 + c) = make_float4(x[2] * f1, y[2] * f1, x[3] * f1, y[3] * f1);
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      const int c = nt * 8 + 2 * t;
      if (c >= dim) continue;
      if (ok0) *reinterpret_cast<unsigned*>(r0 + c) = Mma<T>::pack(acc[nt][0] * f0, acc[nt][1] * f0);
      if (ok1) *reinterpret_cast<unsigned*>(r1 + c) = Mma<T>::pack(acc[nt][2] * f1, acc[nt][3] * f1);
    }
  }
}

// TF32 dQ pass: this lane's part of rowsum(dO * O) for rows r0 / r1 (channels 8 j + 2t, + 1):
// fp32 loads two channels at a time (the 16-bit instances load their fragments: load_a).
template <int HD>
__device__ __forceinline__ void row_dots_f32(float* dl, const float* d0, const float* d1, const float* o0,
                                             const float* o1, int dim, int t) {
#pragma unroll 4
  for (int c = 2 * t; c < HD; c += 8) {
    if (c >= dim) break;
    const float2 a0 = *reinterpret_cast<const float2*>(d0 + c), b0 = *reinterpret_cast<const float2*>(o0 + c);
    const float2 a1 = *reinterpret_cast<const float2*>(d1 + c), b1 = *reinterpret_cast<const float2*>(o1 + c);
    dl[0] += a0.x * b0.x + a0.y * b0.y;
    dl[1] += a1.x * b1.x + a1.y * b1.y;
  }
}

}  }  // namespace nattn::tc
