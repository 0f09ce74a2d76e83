// Hopper (sm_90a) building blocks as inline PTX: mbarriers, the bulk tensor copy (TMA),
// warpgroup MMA fences and shared-memory matrix descriptors, register reallocation.
// The sm90 family is compiled for sm_90a only (CMakeLists.txt); the host pass and any
// other arch see empty bodies, and libnattn never launches the family elsewhere.
#pragma once
#include <stdint.h>

#include "nattn/common/softmax.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NATTN_SM90_ENABLED 1
#else
#define NATTN_SM90_ENABLED 0
#endif

namespace nattn { namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------- programmatic dependent launch
// Build switch NATTN_SM90_PDL (off; an experiment, not yet GPU-run): a kernel whose CTAs have
// all run griddep_launch_dependents() (or ended) lets the next kernel of the stream start, if
// that one was launched as a programmatic dependent (launch_dependent, kernels.cuh); the
// dependent's threads run up to griddep_wait(), which returns once the kernel before has
// completed and its writes are visible. Both are no-ops in a kernel launched without the
// attribute, and compile to nothing with the switch off.
#ifndef NATTN_SM90_PDL
#define NATTN_SM90_PDL 0
#endif
__device__ __forceinline__ void griddep_launch_dependents() {
#if NATTN_SM90_ENABLED && NATTN_SM90_PDL
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if NATTN_SM90_ENABLED && NATTN_SM90_PDL
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------- mbarriers
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#if NATTN_SM90_ENABLED
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
#endif
}

// Makes the initialised barriers visible to the async proxy (the TMA engine).
__device__ __forceinline__ void fence_barrier_init() {
#if NATTN_SM90_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if NATTN_SM90_ENABLED
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if NATTN_SM90_ENABLED
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// Spins until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
#if NATTN_SM90_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}

// ---------------------------------------------------------------- TMA
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
#if NATTN_SM90_ENABLED
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// One box of a tensor map into shared memory, completing `bar`'s transaction count.
// Coordinates are innermost first; out-of-bounds elements are written as zeros.
template <int RANK>
__device__ __forceinline__ void tma_load(void* dst, const void* map, uint64_t* bar, const int* c) {
#if NATTN_SM90_ENABLED
  const uint64_t m = reinterpret_cast<uint64_t>(map);
  const uint32_t d = smem_u32(dst), b = smem_u32(bar);
  if constexpr (RANK == 3) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
        ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  } else if constexpr (RANK == 4) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
        ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
  } else {
    static_assert(RANK == 5, "tensor maps here have rank 3, 4 or 5");
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
        ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
  }
#endif
}

// One shared-memory box into the tensor a map covers at coordinates c (innermost first),
// as one bulk copy of the copy engine; elements outside the tensor are not written. The
// caller fenced the box's stores (fence_proxy_async_smem), commits the group and waits for
// it to have read shared memory (bulk_wait_read) before the CTA may exit or reuse the box.
template <int RANK>
__device__ __forceinline__ void tma_store(const void* map, const void* src, const int* c) {
#if NATTN_SM90_ENABLED
  const uint64_t m = reinterpret_cast<uint64_t>(map);
  const uint32_t s = smem_u32(src);
  if constexpr (RANK == 3) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  } else if constexpr (RANK == 4) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
  } else {
    static_assert(RANK == 5, "tensor maps here have rank 3, 4 or 5");
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
                 ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
  }
#endif
}

// ---------------------------------------------------------------- warpgroup MMA
__device__ __forceinline__ void wgmma_fence() {
#if NATTN_SM90_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if NATTN_SM90_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if NATTN_SM90_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Keeps the compiler from moving reads or writes of accumulator registers across the
// asynchronous MMAs that own them between issue and wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N, int M>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format"): start address,
// leading and stride byte offsets (all in 16-byte units), and the swizzle mode of the
// canonical layout. Tiles here start on 1024-byte boundaries, so the base offset is 0.
//   swizzle bytes 128 -> mode 1, 64 -> 2, 32 -> 3.
// The operand starts `offset` bytes (a multiple of 16) into `tile`: added to the encoded
// tile address, so that a loop over k-steps encodes the tile once and adds a constant per
// product (re-encoding tile + offset cost seven uniform instructions per wgmma). Shared
// addresses stay below 2^18 bytes, so the 14-bit address field never carries over.
template <int SWIZZLE_BYTES>
__device__ __forceinline__ uint64_t smem_desc(const void* tile, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                              uint32_t offset = 0) {
  static_assert(SWIZZLE_BYTES == 128 || SWIZZLE_BYTES == 64 || SWIZZLE_BYTES == 32, "swizzle");
  constexpr uint32_t mode = SWIZZLE_BYTES == 128 ? 1 : SWIZZLE_BYTES == 64 ? 2 : 3;
  const uint32_t base = ((smem_u32(tile) >> 4) & 0x3FFF) | (((lbo_bytes >> 4) & 0x3FFF) << 16);
  const uint32_t hi = ((sbo_bytes >> 4) & 0x3FFF) | (mode << 30);
  return (uint64_t(hi) << 32) | (base + (offset >> 4));
}

// ---------------------------------------------------------------- shared memory
// The block's dynamic shared memory from its first 1024-byte boundary (the 128-byte swizzle
// of TMA and wgmma tiles repeats every 1024 bytes; launches ask for 1024 bytes more). An
// offset from the shared array itself, not a rounded integer: the compiler then knows the
// pointers stay in shared memory and emits shared loads and stores (LDS / STS) instead of
// generic ones.
__device__ __forceinline__ unsigned char* aligned_smem() {
  extern __shared__ unsigned char smem_raw[];
  return smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
}

// ---------------------------------------------------------------- warpgroups
// The thread's warpgroup, as a value the compiler knows is the same across the warp (a
// shuffle from lane 0, as CUTLASS's canonical_warp_group_idx): what depends on it (the
// wgmma descriptors of a warpgroup's rows, barrier ids) is then computed in uniform
// registers. From threadIdx.x / 128 directly, ptxas built those descriptors in vector
// registers and moved each into uniform ones for its product (two R2UR per wgmma).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }

// ---------------------------------------------------------------- registers, barriers
template <int REGS>
__device__ __forceinline__ void regs_dealloc() {
#if NATTN_SM90_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

template <int REGS>
__device__ __forceinline__ void regs_alloc() {
#if NATTN_SM90_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

// A CTA's register split: one producer warpgroup down to PRODUCER registers a thread,
// CONSUMERS consumer warpgroups up to CONSUMER. setmaxnreg only moves registers within the
// CTA, which is launched with 168 a thread at one 384-thread CTA per SM (64512 in all), or
// 128 at two 256-thread CTAs: a split above that makes the consumers' increase wait forever
// (a 240 / 32 split hung the dK/dV pass, PERF.md twenty-fifth session). ptxas allocates the
// code after the increase by CONSUMER, not by the launch count: the split dK/dV CTAs spilled
// at 216 and compile clean at 224 (backward_dkv.cuh, DkvCta).
template <int PRODUCER, int CONSUMER, int CONSUMERS = 2>
struct RegisterSplit {
  static_assert(PRODUCER % 8 == 0 && CONSUMER % 8 == 0 && PRODUCER >= 24 && CONSUMER <= 256,
                "setmaxnreg takes multiples of 8 from 24 to 256");
  static_assert(CONSUMERS == 1 || CONSUMERS == 2, "one or two consumer warpgroups");
  static_assert(128 * PRODUCER + CONSUMERS * 128 * CONSUMER <= (CONSUMERS == 2 ? 384 * 168 : 256 * 128),
                "more registers than the CTA is launched with");
  static constexpr int kProducer = PRODUCER, kConsumer = CONSUMER;
};
// The split of the 128-query forward, the dQ pass and the dK/dV pass (which widens it in
// one instance, backward_dkv.cuh).
using DefaultRegisterSplit = RegisterSplit<40, 232>;

// A named barrier among `threads` threads (one consumer warpgroup); id 0 is __syncthreads'.
__device__ __forceinline__ void named_sync(int id, int threads) {
#if NATTN_SM90_ENABLED
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Arrives at a named barrier without waiting (the other side of a named_sync).
__device__ __forceinline__ void named_arrive(int id, int threads) {
#if NATTN_SM90_ENABLED
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Makes this thread's shared-memory stores visible to the async proxy (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if NATTN_SM90_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Adds a shared-memory box into the tensor `map` covers at coordinates c (innermost first;
// out-of-bounds elements are skipped), as one bulk reduction of the copy engine; the caller
// fenced the box's stores (fence_proxy_async_smem) and commits the group.
template <int RANK>
__device__ __forceinline__ void tma_reduce_add(const void* map, const void* src, const int* c) {
#if NATTN_SM90_ENABLED
  const uint64_t m = reinterpret_cast<uint64_t>(map);
  const uint32_t s = smem_u32(src);
  if constexpr (RANK == 3) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  } else if constexpr (RANK == 4) {
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
  } else {
    static_assert(RANK == 5, "tensor maps here have rank 3, 4 or 5");
    asm volatile("cp.reduce.async.bulk.tensor.5d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
                 ::"l"(m), "r"(s), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
  }
#endif
}

// Closes this thread's group of bulk operations issued since the last commit.
__device__ __forceinline__ void bulk_commit() {
#if NATTN_SM90_ENABLED
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
#if NATTN_SM90_ENABLED
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}

// Waits until at most N of this thread's committed bulk groups are incomplete (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
#if NATTN_SM90_ENABLED
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// *p += a, p[1] += b in global memory (one reduction, no return value).
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if NATTN_SM90_ENABLED
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#endif
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r = 0;
#if NATTN_SM90_ENABLED
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  uint32_t r = 0;
#if NATTN_SM90_ENABLED
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

}  }  // namespace nattn::sm90
