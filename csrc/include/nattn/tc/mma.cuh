// SM80 tensor-core building blocks: mma.sync m16n8k16 (fp32 accumulate), ldmatrix,
// cp.async and fp32 -> 16-bit packing, for __half and bf16; mma.sync m16n8k8 on TF32
// operands (fp32 accumulate) for float. Everything compiles for any arch; on archs below
// SM80 the bodies are empty (the library never launches the tc family there: src/api.cu
// checks the device).
//
// Fragment layouts (lane l, g = l / 4, t = l % 4), PTX ISA "mma.m16n8k16":
//   A 16x16: {a0,a1} = (g, 2t..2t+1), {a2,a3} = (g+8, 2t..), {a4,a5} = (g, 2t+8..), {a6,a7} = (g+8, 2t+8..)
//   B 16x8 : {b0,b1} = (k 2t..2t+1, n g), {b2,b3} = (k 2t+8.., n g)
//   C 16x8 : {c0,c1} = (g, 2t..2t+1),     {c2,c3} = (g+8, 2t..)
// so the C fragments of two adjacent n-tiles are, packed to 16 bits, the A fragment of
// the next product (the flash-attention register reuse).
//
// PTX ISA "mma.m16n8k8" with .tf32 operands (one 32-bit register per element):
//   A 16x8 : a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4)
//   B 8x8  : b0 = (k t, n g), b1 = (k t+4, n g)
//   C 16x8 : as above, {c0,c1} = (g, 2t..2t+1), {c2,c3} = (g+8, 2t..)
// Here a C fragment's columns (2t, 2t+1) are not the A fragment's (t, t+4): the kernels
// reuse it as A by ordering the product's k dimension so that A column t is C column 2t and
// A column t + 4 is C column 2t + 1 (tc/fragments.cuh, mma_rows), and read B's rows in that order.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "nattn/common/registry.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define NATTN_TC_ENABLED 1
#else
#define NATTN_TC_ENABLED 0
#endif

namespace nattn { namespace tc {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <typename T> struct Mma;

template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float* c, const unsigned* a, const unsigned* b) {
#if NATTN_TC_ENABLED
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    unsigned r = 0;
#if NATTN_TC_ENABLED
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
  }
  static __device__ __forceinline__ void unpack(unsigned x, float& lo, float& hi) {
    lo = __half2float(__ushort_as_half((unsigned short)(x & 0xffffu)));
    hi = __half2float(__ushort_as_half((unsigned short)(x >> 16)));
  }
};

template <> struct Mma<bf16_t> {
  static __device__ __forceinline__ void run(float* c, const unsigned* a, const unsigned* b) {
#if NATTN_TC_ENABLED
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    unsigned r = 0;
#if NATTN_TC_ENABLED
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
  }
  static __device__ __forceinline__ void unpack(unsigned x, float& lo, float& hi) {
    lo = __uint_as_float(x << 16);
    hi = __uint_as_float(x & 0xffff0000u);
  }
};

// TF32: fp32 operands rounded to TF32 (10-bit mantissa, round to nearest, ties away from
// zero: cvt.rna), products accumulated in fp32.
__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned r = 0;
#if NATTN_TC_ENABLED
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
  (void)x;
#endif
  return r;
}

template <> struct Mma<float> {
  // c (16x8, fp32) += a (16x8, TF32) b (8x8, TF32); the operands hold to_tf32 bits.
  static __device__ __forceinline__ void run(float* c, const unsigned* a, const unsigned* b) {
#if NATTN_TC_ENABLED
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

// Four 8x8 16-bit matrices; lane l gives the address of row l % 8 of matrix l / 8. On 32-bit
// data each is an 8x4 matrix of which lane l gets element (l / 4, l % 4): the TF32 A and B
// fragments' layout (rows along g, columns along t), read from a row-major tile.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* row) {
#if NATTN_TC_ENABLED
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(row)));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* row) {
#if NATTN_TC_ENABLED
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(row)));
#endif
}

// 16-byte (4-byte) asynchronous copy global -> shared; zero-filled when !pred.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
#if NATTN_TC_ENABLED
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(pred ? 16 : 0));
#endif
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool pred) {
#if NATTN_TC_ENABLED
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(pred ? 4 : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if NATTN_TC_ENABLED
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if NATTN_TC_ENABLED
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

}  }  // namespace nattn::tc
