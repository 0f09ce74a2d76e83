// dRPB summed in fixed point: integer additions, so the sum is the same in any order
// (bitwise-reproducible dRPB) and a block adds a score with one native shared-memory integer
// atomic instead of a float compare-and-swap loop (float atomics on shared memory are CAS loops
// on SM80 / SM90).
//
// The dQ pass, which computes every score's dS before the dK/dV pass, records the largest
// |dS| of each query head h (bits of a non-negative float: as unsigned integers they order
// as the floats do, and a NaN's bits exceed every finite value's and infinity's). The dK/dV
// pass then adds round(dS * 2^s_h) into a 32-bit table per block, s_h = bits - e_h where
// |dS| < 2^e_h: a term is below 2^(bits + 1) even if the pass's dS exceeds the dQ pass's
// maximum by rounding (up to 2x), and the block's terms of one entry (each key meets a table
// entry of a query head through at most one query: the entry is the key's relative
// position), at most its keys, stay below 2^31: bits = fixed_bits(keys a block). A block's
// table is added to an int64 table in global memory; a finishing kernel writes each entry
// times 2^-s_h as float32. The rounding error of a term is at most 2^-bits of its head's
// largest |dS| (float32 atomics instead round each partial sum). Heads whose largest |dS| is
// NaN or infinite get NaN in every entry.
#pragma once
#include "nattn/common/registry.h"

namespace nattn {

__host__ __device__ constexpr int ceil_log2(long long x) {
  int n = 0;
  while ((1ll << n) < x) ++n;
  return n;
}

// Fraction bits for blocks of up to `terms` keys: terms * 2^(bits + 1) <= 2^30.
__host__ __device__ constexpr int fixed_bits(int terms) { return 29 - ceil_log2(terms); }
static_assert(fixed_bits(64) == 23 && fixed_bits(128) == 22 && fixed_bits(100) == 22, "fixed_bits");

// The SIMT family's float32 dRPB wants more than 32-bit blocks give: its blocks stage int64
// tables, so the bound is the whole call's terms of one entry (one per key token and batch):
// terms * 2^(bits + 1) <= 2^62, at most 52 bits (a double's mantissa).
__host__ __device__ constexpr int fixed_bits_wide(long long terms) {
  return 61 - ceil_log2(terms) < 52 ? 61 - ceil_log2(terms) : 52;
}
static_assert(fixed_bits_wide(1 << 19) == 42 && fixed_bits_wide(2) == 52, "fixed_bits_wide");

// s_h for the largest-|dS| bits m; heads without a finite largest |dS| return 0 (their
// table is overwritten with NaN). The scale stays a normal float: s_h in [-126, 126].
__host__ __device__ inline int drpb_fixed_shift(unsigned m, int bits) {
  if (m >= 0x7f800000u) return 0;
  const int biased = int(m >> 23);  // m < 2^(biased - 126): the exponent field bounds it
  const int e = biased == 0 ? -126 : biased - 126;
  const int s = bits - e;
  return s > 126 ? 126 : (s < -126 ? -126 : s);
}

// 2^s as a float (s in [-126, 126]).
__device__ __forceinline__ float drpb_fixed_scale(unsigned m, int bits) {
  return __int_as_float((drpb_fixed_shift(m, bits) + 127) << 23);
}

// |ds|'s bits folded into a running maximum (NaN's bits win).
__device__ __forceinline__ unsigned drpb_abs_max(unsigned running, float ds) {
  const unsigned bits = __float_as_uint(ds) & 0x7fffffffu;
  return bits > running ? bits : running;
}

// A block's largest |dS| into head_max without a barrier (the SIMT dQ pass returns early for
// threads past the last query): every thread folds its maximum m into the block's (blk[0])
// and counts itself in (blk[1]); the last one adds the block's maximum to the head's. blk
// is zeroed before any thread returns.
__device__ __forceinline__ void drpb_max_arrive(unsigned* blk, unsigned m, unsigned* head_max) {
  atomicMax(blk, m);
  __threadfence_block();  // the max before the count
  if (atomicAdd(blk + 1, 1u) == blockDim.x - 1) {
    __threadfence_block();
    atomicMax(head_max, atomicOr(blk, 0u));
  }
}

// Branch-free adds into a staged table. `if (kept) atomicAdd(table + idx, term)` per score
// compiles to a branch region per score, which runs a step's score chains (exp2, dS, the
// conversion, the add) one after another. Every lane adds every score instead, a masked one
// (dS = 0, its idx maybe outside the table) into a 32-int sink at the bank its table address
// would have had, so it takes no bank the kept scores' adds do not. The sink sits at the
// first bank-0 address at or past the table's end: kDrpbSinkBytes of shared memory.
constexpr int kDrpbSinkBytes = 256;
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ int* drpb_sink_at(int* end) { return end + (32 - smem_addr(end) / 4u % 32u) % 32u; }
// (the add of a score with table index idx, kept or not; bank: smem_addr(table) / 4)
__device__ __forceinline__ void drpb_add_or_sink(bool kept, int* table, int* sink, int bank, int idx, int term) {
  atomicAdd(kept ? table + idx : sink + ((bank + idx) & 31), term);
}
// The same with 32-bit shared-memory addresses (smem_addr) for table and sink: a generic
// pointer takes two registers, and the strip dK/dV pass's fixed-point loops run at their
// register cap (3-D head dim 64: 29 fewer instructions a line pair, cuobjdump). In the tensor-core
// pass this form spilled 16 bytes more than the pointer form.
__device__ __forceinline__ void red_add_shared(uint32_t addr, int v) {
  asm volatile("red.shared.add.s32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void drpb_add_or_sink(bool kept, uint32_t table, uint32_t sink, int idx, int term) {
  const uint32_t at = table + 4u * static_cast<uint32_t>(idx);
  red_add_shared(kept ? at : sink + at % 128u, term);  // (the sink's slot: the same bank)
}

// Adds a block's staged table (32-bit entries, or the SIMT family's 64-bit ones) to the int64
// table of KV head hkv's query heads, from threads first, first + step, ...; the caller has
// synchronised the threads that staged it.
template <typename E>
__device__ __forceinline__ void drpb_fixed_add(const Params& p, int hkv, const E* smem, int64_t len, unsigned first,
                                               unsigned step) {
  unsigned long long* dst = reinterpret_cast<unsigned long long*>(p.drpb_fixed) + int64_t(hkv) * p.groups * p.rpb_head_size;
  for (int64_t i = first; i < len; i += step)
    if (smem[i] != 0) atomicAdd(dst + i, (unsigned long long)(long long)smem[i]);  // two's complement: signed sums
}

// The same by every thread of the block, after a barrier; every thread of the block calls it.
template <typename E>
__device__ __forceinline__ void drpb_fixed_flush(const Params& p, int hkv, const E* smem, int64_t len) {
  __syncthreads();
  drpb_fixed_add(p, hkv, smem, len, threadIdx.x, blockDim.x);
}

// drpb = table * 2^-s_h, one thread per entry (NaN for heads without a finite maximum).
static __global__ void drpb_fixed_finish_kernel(const Params p, int bits) {  // static: one per translation unit
  const int64_t n = int64_t(p.heads) * p.rpb_head_size;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const unsigned m = p.drpb_max[i / p.rpb_head_size];
    const double v = double(p.drpb_fixed[i]) * ldexp(1.0, -drpb_fixed_shift(m, bits));
    p.drpb[i] = m >= 0x7f800000u ? __int_as_float(0x7fc00000) : float(v);
  }
}

// Host: the stream-ordered workspace of a fixed-point dRPB (query heads' maxima, then the
// int64 table), zeroed; false (and p untouched) when it cannot be had: the caller keeps the
// float32 path.
inline bool drpb_fixed_begin(Params& p, cudaStream_t stream) {
  const size_t max_bytes = (size_t(p.heads) * sizeof(unsigned) + 15) / 16 * 16;
  const size_t bytes = max_bytes + size_t(p.heads) * size_t(p.rpb_head_size) * sizeof(long long);
  char* ws = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void**>(&ws), bytes, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  cudaMemsetAsync(ws, 0, bytes, stream);
  p.drpb_max = reinterpret_cast<unsigned*>(ws);
  p.drpb_fixed = reinterpret_cast<long long*>(ws + max_bytes);
  return true;
}

// Host: writes p.drpb from the fixed-point table (summed with `bits`) and frees the workspace.
inline void drpb_fixed_end(const Params& p, int bits, cudaStream_t stream) {
  const int64_t n = int64_t(p.heads) * p.rpb_head_size;
  const unsigned blocks = unsigned((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
  drpb_fixed_finish_kernel<<<blocks, 256, 0, stream>>>(p, bits);
  cudaFreeAsync(p.drpb_max, stream);
}

}  // namespace nattn
