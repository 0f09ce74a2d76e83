// Warp-tiled SIMT kernels: a warp serves a small box of queries (of keys, in the dK/dV
// pass) of one dilation group and walks the union of their windows in lockstep. Chunks of
// that union are staged in shared memory as fp32, so every staged element is loaded and
// converted once and then read by all the warp's queries at once (shared-memory
// broadcast), and the per-key address and window bookkeeping is done once per warp
// instead of once per query. Each lane checks its own window with two compares per key.
//
// A query (key) is served by TPQ lanes of C channels each; dot products are reduced with
// TPQ-lane shuffles. Only SM50 instructions: this family runs on every GPU from Maxwell on.
#pragma once
#include <math.h>

#include "nattn/common/registry.h"
#include "nattn/common/vec.cuh"
#include "nattn/common/tiling.cuh"
#include "nattn/common/window.cuh"

// Tokens per staged chunk for head dims <= 64 (overridable with -D for tuning builds).
#ifndef NATTN_TILED_CW
#define NATTN_TILED_CW 16
#endif

namespace nattn { namespace simt { namespace tiled {

using namespace nattn::tiling;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kWarps = 4;  // warps per block; warps never wait for each other except at dRPB flush

// Per head-dim bucket: lanes per token (TPQ), channels per lane (C), tokens per warp (QW),
// tokens per staged chunk (CW), and the padded smem layout of one staged token
// (TPQ parts of PS floats: the 4-float pad puts the parts on different banks).
template <int HD>
struct Cfg {
  static constexpr int TPQ = HD <= 64 ? 2 : HD / 32;
  static constexpr int C = HD / TPQ;
  static constexpr int QW = 32 / TPQ;
  static constexpr int CW = HD <= 64 ? NATTN_TILED_CW : 1024 / HD;
  static constexpr int PS = C + 4;
  static constexpr int KS = TPQ * PS;
};

// Sums N values over aligned groups of TPQ lanes (the whole warp takes part).
template <int TPQ, int N>
__device__ __forceinline__ void lane_group_sum(float* x) {
#pragma unroll
  for (int o = TPQ / 2; o > 0; o >>= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] += __shfl_xor_sync(0xffffffffu, x[i], o);
  }
}

template <int C>
__device__ __forceinline__ float dot_smem(const float* r, const float* s) {
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < C / 4; ++i) {
    const float4 x = reinterpret_cast<const float4*>(s)[i];
    a = fmaf(r[4 * i], x.x, a);
    a = fmaf(r[4 * i + 1], x.y, a);
    a = fmaf(r[4 * i + 2], x.z, a);
    a = fmaf(r[4 * i + 3], x.w, a);
  }
  return a;
}

template <int C>
__device__ __forceinline__ void axpy_smem(float* acc, float w, const float* s) {
#pragma unroll
  for (int i = 0; i < C / 4; ++i) {
    const float4 x = reinterpret_cast<const float4*>(s)[i];
    acc[4 * i] = fmaf(w, x.x, acc[4 * i]);
    acc[4 * i + 1] = fmaf(w, x.y, acc[4 * i + 1]);
    acc[4 * i + 2] = fmaf(w, x.z, acc[4 * i + 2]);
    acc[4 * i + 3] = fmaf(w, x.w, acc[4 * i + 3]);
  }
}

// Stages CW tokens of one line (group coordinates cs.. along the last axis) into smem as
// fp32; channels past `dim` and tokens past `n` become zeros (never garbage).
template <typename T, int HD>
__device__ __forceinline__ void stage_line(float* dst, const T* line, int64_t step, int64_t first_off,
                                           int n, int dim, int lane) {
  using K = Cfg<HD>;
  constexpr int U = HD / 8;  // 8-channel pieces per token
#pragma unroll
  for (int u = lane; u < K::CW * U; u += 32) {
    const int j = u / U, e = (u % U) * 8;
    float x[8];
    load8(x, line + first_off + int64_t(j) * step + e, j < n && e < dim);
    float* o = dst + j * K::KS + (e / K::C) * K::PS + (e % K::C);
    reinterpret_cast<float4*>(o)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(o)[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
}

// ------------------------------------------------------------------------- forward
template <typename T, int NA, int HD>
__global__ void __launch_bounds__(kWarps * 32) forward_kernel(const Params p) {
  using K = Cfg<HD>;
  constexpr int C = K::C, TPQ = K::TPQ, QW = K::QW, CW = K::CW, KS = K::KS, PS = K::PS, A = NA - 1;
  __shared__ __align__(16) float smem[kWarps][2 * CW * KS];
  const int lane = threadIdx.x % 32;
  float* sK = smem[threadIdx.x / 32];
  float* sV = sK + CW * KS;
  int g[3], L[3], first[3], ig[3];
  int box[3];
  fixed_box<NA, QW>(box);
  if (!warp_box<NA>(p, box, int64_t(blockIdx.x) * kWarps + threadIdx.x / 32, g, L, first)) return;
  const bool qok = lane_token<NA>(box, lane / TPQ, first, L, ig);
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups, part = lane % TPQ, ch = part * C;
  AxisRange win[3], u[3];
#pragma unroll
  for (int a = 0; a < NA; ++a)
    win[a] = query_window(ig[a], L[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
  box_union<NA, false>(p, box, first, L, u);
  int rmult[3];
  rpb_mults<NA>(p, rmult);

  float q[C], acc[C];
  load_channels<C>(q, static_cast<const T*>(p.q) + int64_t(b) * p.q_s[0] + spatial_offset<NA>(p, p.q_s, ig, g) +
                          int64_t(h) * p.q_s[4] + ch, ch, p.dim, true);
#pragma unroll
  for (int i = 0; i < C; ++i) {
    q[i] *= p.scale_log2;  // logits in log2 units
    acc[i] = 0.f;
  }
  const T* Kb = static_cast<const T*>(p.k) + int64_t(b) * p.k_s[0] + int64_t(hkv) * p.k_s[4];
  const T* Vb = static_cast<const T*>(p.v) + int64_t(b) * p.v_s[0] + int64_t(hkv) * p.v_s[4];
  const int64_t kstep = int64_t(p.dilation[A]) * p.k_s[1 + A], vstep = int64_t(p.dilation[A]) * p.v_s[1 + A];
  const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
  const int rpb_last = p.kernel[A] - 1 - ig[A];  // + key coordinate: the last axis's RPB slot
  float m = -INFINITY, l = 0.f;
  const int lines = leading_lines<NA>(u), uend = u[A].start + u[A].count;
  for (int li = 0; li < lines; ++li) {
    const Line ln = line_at<NA, false>(p, li, u, win, g, ig, rmult, p.k_s, p.v_s);
    for (int cs = u[A].start; cs < uend; cs += CW) {
      const int n = nattn_min(CW, uend - cs);
      const int64_t c0 = int64_t(cs) * p.dilation[A] + g[A];
      __syncwarp();  // the previous chunk is consumed
      stage_line<T, HD>(sK, Kb, kstep, ln.off0 + c0 * p.k_s[1 + A], n, p.dim, lane);
      stage_line<T, HD>(sV, Vb, vstep, ln.off1 + c0 * p.v_s[1 + A], n, p.dim_v, lane);
      __syncwarp();
      float s[CW];
#pragma unroll
      for (int j = 0; j < CW; ++j) s[j] = dot_smem<C>(q, sK + j * KS + part * PS);
      lane_group_sum<TPQ, CW>(s);
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < CW; ++j) {
        const int kc = cs + j;
        const bool ok = ln.ok && j < n && unsigned(kc - win[A].start) < unsigned(win[A].count);
        const float bias = rpb && ok ? rpb[ln.rpb + rpb_last + kc] * kLog2e : 0.f;
        s[j] = ok ? s[j] + bias : -INFINITY;
        mx = fmaxf(mx, s[j]);
      }
      if (mx > m) {  // rescale only when the running max grows
        const float corr = exp2f(m - mx);
        l *= corr;
#pragma unroll
        for (int i = 0; i < C; ++i) acc[i] *= corr;
        m = mx;
      }
      const float mref = m == -INFINITY ? 0.f : m;
#pragma unroll
      for (int j = 0; j < CW; ++j) {
        const float pr = exp2f(s[j] - mref);
        l += pr;
        axpy_smem<C>(acc, pr, sV + j * KS + part * PS);
      }
    }
  }
  if (!qok) return;
  const float inv_l = 1.f / l;
#pragma unroll
  for (int i = 0; i < C; ++i) acc[i] *= inv_l;
  store_channels<C>(static_cast<T*>(p.out) + int64_t(b) * p.out_s[0] + spatial_offset<NA>(p, p.out_s, ig, g) +
                        int64_t(h) * p.out_s[4] + ch, acc, ch, p.dim_v);
  if (part == 0) p.lse[(int64_t(b) * p.tokens + token_index<NA>(p, ig, g)) * p.heads + h] = (m + log2f(l)) * kLn2;
}

// --------------------------------------------------------------- backward: dQ + delta
template <typename T, int NA, int HD>
__global__ void __launch_bounds__(kWarps * 32) backward_dq_kernel(const Params p) {
  using K = Cfg<HD>;
  constexpr int C = K::C, TPQ = K::TPQ, QW = K::QW, CW = K::CW, KS = K::KS, PS = K::PS, A = NA - 1;
  __shared__ __align__(16) float smem[kWarps][2 * CW * KS];
  const int lane = threadIdx.x % 32;
  float* sK = smem[threadIdx.x / 32];
  float* sV = sK + CW * KS;
  int g[3], L[3], first[3], ig[3];
  int box[3];
  fixed_box<NA, QW>(box);
  if (!warp_box<NA>(p, box, int64_t(blockIdx.x) * kWarps + threadIdx.x / 32, g, L, first)) return;
  const bool qok = lane_token<NA>(box, lane / TPQ, first, L, ig);
  const int h = blockIdx.y, b = blockIdx.z, hkv = h / p.groups, part = lane % TPQ, ch = part * C;
  AxisRange win[3], u[3];
#pragma unroll
  for (int a = 0; a < NA; ++a)
    win[a] = query_window(ig[a], L[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
  box_union<NA, false>(p, box, first, L, u);
  int rmult[3];
  rpb_mults<NA>(p, rmult);

  const int64_t row = (int64_t(b) * p.tokens + token_index<NA>(p, ig, g)) * p.heads + h;
  float q[C], dout[C], dq[C], delta;
  {
    float o[C];
    load_channels<C>(q, static_cast<const T*>(p.q) + int64_t(b) * p.q_s[0] + spatial_offset<NA>(p, p.q_s, ig, g) +
                            int64_t(h) * p.q_s[4] + ch, ch, p.dim, true);
    load_channels<C>(dout, static_cast<const T*>(p.grad_out) + int64_t(b) * p.grad_out_s[0] +
                               spatial_offset<NA>(p, p.grad_out_s, ig, g) + int64_t(h) * p.grad_out_s[4] + ch,
                     ch, p.dim_v, true);
    load_channels<C>(o, static_cast<const T*>(p.out) + int64_t(b) * p.out_s[0] +
                            spatial_offset<NA>(p, p.out_s, ig, g) + int64_t(h) * p.out_s[4] + ch, ch, p.dim_v, true);
    float dl[1] = {dot<C>(dout, o)};
    lane_group_sum<TPQ, 1>(dl);
    delta = dl[0] - (p.grad_lse && qok ? p.grad_lse[row] : 0.f);  // delta = rowsum(dO * O) - dLSE
  }
  if (qok && part == 0) p.delta[row] = delta;
  const float lse2 = qok ? p.lse[row] * kLog2e : 0.f;
#pragma unroll
  for (int i = 0; i < C; ++i) {
    q[i] *= p.scale_log2;
    dq[i] = 0.f;
  }
  const T* Kb = static_cast<const T*>(p.k) + int64_t(b) * p.k_s[0] + int64_t(hkv) * p.k_s[4];
  const T* Vb = static_cast<const T*>(p.v) + int64_t(b) * p.v_s[0] + int64_t(hkv) * p.v_s[4];
  const int64_t kstep = int64_t(p.dilation[A]) * p.k_s[1 + A], vstep = int64_t(p.dilation[A]) * p.v_s[1 + A];
  const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
  const int rpb_last = p.kernel[A] - 1 - ig[A];
  const int lines = leading_lines<NA>(u), uend = u[A].start + u[A].count;
  for (int li = 0; li < lines; ++li) {
    const Line ln = line_at<NA, false>(p, li, u, win, g, ig, rmult, p.k_s, p.v_s);
    for (int cs = u[A].start; cs < uend; cs += CW) {
      const int n = nattn_min(CW, uend - cs);
      const int64_t c0 = int64_t(cs) * p.dilation[A] + g[A];
      __syncwarp();
      stage_line<T, HD>(sK, Kb, kstep, ln.off0 + c0 * p.k_s[1 + A], n, p.dim, lane);
      stage_line<T, HD>(sV, Vb, vstep, ln.off1 + c0 * p.v_s[1 + A], n, p.dim_v, lane);
      __syncwarp();
      float red[2 * CW];  // logits, then dP
#pragma unroll
      for (int j = 0; j < CW; ++j) {
        red[j] = dot_smem<C>(q, sK + j * KS + part * PS);
        red[CW + j] = dot_smem<C>(dout, sV + j * KS + part * PS);
      }
      lane_group_sum<TPQ, 2 * CW>(red);
      __syncwarp();  // reload K below instead of keeping CW x C values live in registers
#pragma unroll
      for (int j = 0; j < CW; ++j) {
        const int kc = cs + j;
        const bool ok = qok && ln.ok && j < n && unsigned(kc - win[A].start) < unsigned(win[A].count);
        const float bias = rpb && ok ? rpb[ln.rpb + rpb_last + kc] * kLog2e : 0.f;
        const float ds = ok ? exp2f(red[j] + bias - lse2) * (red[CW + j] - delta) : 0.f;
        axpy_smem<C>(dq, ds, sK + j * KS + part * PS);
      }
    }
  }
  if (!qok || ch >= p.dim) return;
#pragma unroll
  for (int i = 0; i < C; ++i) dq[i] *= p.scale;
  store_channels<C>(static_cast<T*>(p.dq) + int64_t(b) * p.dq_s[0] + spatial_offset<NA>(p, p.dq_s, ig, g) +
                        int64_t(h) * p.dq_s[4] + ch, dq, ch, p.dim);
}

// ------------------------------------------------------ backward: dK, dV, dRPB per key
template <int HD>
__host__ __device__ constexpr int dkv_static_floats() {
  return kWarps * (2 * Cfg<HD>::CW * Cfg<HD>::KS + 2 * Cfg<HD>::CW);
}

template <typename T, int NA, int HD>
__global__ void __launch_bounds__(kWarps * 32) backward_dkv_kernel(const Params p) {
  using K = Cfg<HD>;
  constexpr int C = K::C, TPQ = K::TPQ, QW = K::QW, CW = K::CW, KS = K::KS, PS = K::PS, A = NA - 1;
  __shared__ __align__(16) float smem[kWarps][2 * CW * KS + 2 * CW];
  extern __shared__ float drpb_smem[];  // [groups, rpb_head_size] when p.rpb_in_smem
  const int lane = threadIdx.x % 32;
  float* sQ = smem[threadIdx.x / 32];
  float* sD = sQ + CW * KS;
  float* sL = sD + CW * KS;  // lse (log2 units) of the staged queries
  float* sDelta = sL + CW;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const bool stage = p.rpb != nullptr && p.rpb_in_smem;
  const int64_t smem_len = int64_t(p.groups) * p.rpb_head_size;
  if (stage) {
    for (int64_t i = threadIdx.x; i < smem_len; i += blockDim.x) drpb_smem[i] = 0.f;
    __syncthreads();
  }
  int g[3], L[3], first[3], jg[3];
  // no early return: the block meets again at the dRPB flush
  int box[3];
  fixed_box<NA, QW>(box);
  if (warp_box<NA>(p, box, int64_t(blockIdx.x) * kWarps + threadIdx.x / 32, g, L, first)) {
    const bool kok = lane_token<NA>(box, lane / TPQ, first, L, jg);
    const int part = lane % TPQ, ch = part * C;
    AxisRange inv[3], u[3];
#pragma unroll
    for (int a = 0; a < NA; ++a)
      inv[a] = key_inverse(jg[a], L[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
    box_union<NA, true>(p, box, first, L, u);
    int rmult[3];
    rpb_mults<NA>(p, rmult);

    float kk[C], vv[C], dk[C], dv[C];
    load_channels<C>(kk, static_cast<const T*>(p.k) + int64_t(b) * p.k_s[0] + spatial_offset<NA>(p, p.k_s, jg, g) +
                             int64_t(hkv) * p.k_s[4] + ch, ch, p.dim, true);
    load_channels<C>(vv, static_cast<const T*>(p.v) + int64_t(b) * p.v_s[0] + spatial_offset<NA>(p, p.v_s, jg, g) +
                             int64_t(hkv) * p.v_s[4] + ch, ch, p.dim_v, true);
#pragma unroll
    for (int i = 0; i < C; ++i) {
      kk[i] *= p.scale_log2;
      dk[i] = 0.f;
      dv[i] = 0.f;
    }
    const int64_t qstep = int64_t(p.dilation[A]) * p.q_s[1 + A];
    const int64_t dstep = int64_t(p.dilation[A]) * p.grad_out_s[1 + A];
    const int rpb_last = p.kernel[A] - 1 + jg[A];  // - query coordinate: the last axis's RPB slot
    const int lines = leading_lines<NA>(u), uend = u[A].start + u[A].count;
    for (int hg = 0; hg < p.groups; ++hg) {  // GQA: every query head of this KV head
      const int h = hkv * p.groups + hg;
      const T* Qb = static_cast<const T*>(p.q) + int64_t(b) * p.q_s[0] + int64_t(h) * p.q_s[4];
      const T* Db = static_cast<const T*>(p.grad_out) + int64_t(b) * p.grad_out_s[0] + int64_t(h) * p.grad_out_s[4];
      const float* rpb = p.rpb ? p.rpb + int64_t(h) * p.rpb_head_size : nullptr;
      float* drpb = stage ? drpb_smem + int64_t(hg) * p.rpb_head_size
                          : (p.drpb ? p.drpb + int64_t(h) * p.rpb_head_size : nullptr);
      const int64_t row0 = int64_t(b) * p.tokens;
      for (int li = 0; li < lines; ++li) {
        const Line ln = line_at<NA, true>(p, li, u, inv, g, jg, rmult, p.q_s, p.grad_out_s);
        for (int cs = u[A].start; cs < uend; cs += CW) {
          const int n = nattn_min(CW, uend - cs);
          const int64_t c0 = int64_t(cs) * p.dilation[A] + g[A];
          __syncwarp();
          stage_line<T, HD>(sQ, Qb, qstep, ln.off0 + c0 * p.q_s[1 + A], n, p.dim, lane);
          stage_line<T, HD>(sD, Db, dstep, ln.off1 + c0 * p.grad_out_s[1 + A], n, p.dim_v, lane);
          if (lane < CW) {
            const int64_t r = (row0 + ln.tok + c0 + int64_t(lane) * p.dilation[A]) * p.heads + h;
            sL[lane] = lane < n ? p.lse[r] * kLog2e : 0.f;
            sDelta[lane] = lane < n ? p.delta[r] : 0.f;
          }
          __syncwarp();
          float red[2 * CW];  // logits, then dP; then P and dS
#pragma unroll
          for (int j = 0; j < CW; ++j) {
            red[j] = dot_smem<C>(kk, sQ + j * KS + part * PS);
            red[CW + j] = dot_smem<C>(vv, sD + j * KS + part * PS);
          }
          lane_group_sum<TPQ, 2 * CW>(red);
#pragma unroll
          for (int j = 0; j < CW; ++j) {
            const int qc = cs + j;
            const bool ok = kok && ln.ok && j < n && unsigned(qc - inv[A].start) < unsigned(inv[A].count);
            const int ridx = ln.rpb + rpb_last - qc;
            const float bias = rpb && ok ? rpb[ridx] * kLog2e : 0.f;
            const float pr = ok ? exp2f(red[j] + bias - sL[j]) : 0.f;
            const float ds = pr * (red[CW + j] - sDelta[j]);
            red[j] = pr;
            red[CW + j] = ds;
            if (rpb && ok && part == 0) atomicAdd(drpb + ridx, ds);
          }
          __syncwarp();  // reload Q and dO below instead of keeping them live in registers
#pragma unroll
          for (int j = 0; j < CW; ++j) {
            axpy_smem<C>(dv, red[j], sD + j * KS + part * PS);
            axpy_smem<C>(dk, red[CW + j], sQ + j * KS + part * PS);
          }
        }
      }
    }
    if (kok) {
      if (ch < p.dim) {
#pragma unroll
        for (int i = 0; i < C; ++i) dk[i] *= p.scale;
        store_channels<C>(static_cast<T*>(p.dk) + int64_t(b) * p.dk_s[0] + spatial_offset<NA>(p, p.dk_s, jg, g) +
                              int64_t(hkv) * p.dk_s[4] + ch, dk, ch, p.dim);
      }
      if (ch < p.dim_v)
        store_channels<C>(static_cast<T*>(p.dv) + int64_t(b) * p.dv_s[0] + spatial_offset<NA>(p, p.dv_s, jg, g) +
                              int64_t(hkv) * p.dv_s[4] + ch, dv, ch, p.dim_v);
    }
  }
  if (stage) {
    __syncthreads();
    float* dst = p.drpb + int64_t(hkv) * p.groups * p.rpb_head_size;
    for (int64_t i = threadIdx.x; i < smem_len; i += blockDim.x)
      if (drpb_smem[i] != 0.f) atomicAdd(dst + i, drpb_smem[i]);
  }
}

// ------------------------------------------------------------------------- launchers
template <typename T, int NA, int HD>
void launch_forward(const Params& p, cudaStream_t stream) {
  int box[3];
  fixed_box<NA, Cfg<HD>::QW>(box);
  const int64_t warps = num_warps<NA>(p, box);
  const dim3 grid(unsigned((warps + kWarps - 1) / kWarps), unsigned(p.heads), unsigned(p.batch));
  forward_kernel<T, NA, HD><<<grid, kWarps * 32, 0, stream>>>(p);
}

// dRPB staged in shared memory when it fits beside the kernel's static staging buffers
// within the 48 KiB every GPU gives a block; larger tables go straight to global atomics.
template <int HD>
constexpr int64_t max_drpb_smem_bytes() {
  return 48 * 1024 - int64_t(dkv_static_floats<HD>()) * 4;
}

template <typename T, int NA, int HD>
void launch_backward(const Params& p, cudaStream_t stream) {
  int box[3];
  fixed_box<NA, Cfg<HD>::QW>(box);
  const int64_t warps = num_warps<NA>(p, box);
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  backward_dq_kernel<T, NA, HD><<<dim3(blocks, p.heads, p.batch), kWarps * 32, 0, stream>>>(p);
  Params pk = p;
  const int64_t smem = int64_t(p.groups) * p.rpb_head_size * int64_t(sizeof(float));
  pk.rpb_in_smem = p.rpb != nullptr && smem <= max_drpb_smem_bytes<HD>();
  backward_dkv_kernel<T, NA, HD><<<dim3(blocks, p.heads_kv, p.batch), kWarps * 32,
                                   pk.rpb_in_smem ? size_t(smem) : 0, stream>>>(pk);
}

}  }  }  // namespace nattn::simt::tiled
