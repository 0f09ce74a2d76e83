// The C ABI of libnattn: torch-free entry points that check a problem, pick the
// kernel from the generated table, launch it on the caller's stream and report
// errors as a code plus a message naming the configuration.
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nattn/common/philox.cuh"
#include "nattn/common/registry.h"
#include "nattn/simt/launch.h"
#include "nattn/sm90/tensor_map_spec.h"
#include "nattn/sm90/tiles.cuh"
#include "nattn/problem.h"  // generated from nattn/_cuda/kernel_table.py

#define NATTN_API extern "C" __attribute__((visibility("default")))

namespace {

const char* const kDtypeNames[] = {"float32", "float16", "bfloat16"};
const int kDtypeBytes[] = {4, 2, 2};

enum Status { kOk = 0, kInvalid = 1, kNotCompiled = 2, kCudaError = 3 };

// Formats "<what>: <detail> [config]" into the caller's buffer.
int fail(char* err, int64_t err_len, int code, const NattnProblem& pr, const char* what,
         const char* fmt, ...) {
  if (!err || err_len <= 0) return code;
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  const int nd = int(pr.na_dim);
  const char* dt = (pr.dtype >= 0 && pr.dtype < 3) ? kDtypeNames[pr.dtype] : "?";
  char drop[48] = "";
  if (pr.dropout_p_bits) {
    double p;
    memcpy(&p, &pr.dropout_p_bits, sizeof p);
    snprintf(drop, sizeof drop, " dropout_p=%.6g", p);
  }
  char tf32[40] = "";
  if (pr.allow_tf32) snprintf(tf32, sizeof tf32, " allow_tf32=%lld", (long long)pr.allow_tf32);
  snprintf(err, size_t(err_len),
           "%s: %s [dtype=%s na_dim=%d batch=%lld spatial=(%lld,%lld,%lld) heads=%lld "
           "heads_kv=%lld dim=%lld dim_v=%lld kernel=(%lld,%lld,%lld) stride=(%lld,%lld,%lld) "
           "dilation=(%lld,%lld,%lld) causal=(%lld,%lld,%lld)%s%s]",
           what, detail, dt, nd, (long long)pr.batch, (long long)pr.spatial[0],
           (long long)(nd > 1 ? pr.spatial[1] : 0), (long long)(nd > 2 ? pr.spatial[2] : 0),
           (long long)pr.heads, (long long)pr.heads_kv, (long long)pr.dim, (long long)pr.dim_v,
           (long long)pr.kernel[0], (long long)pr.kernel[1], (long long)pr.kernel[2],
           (long long)pr.stride[0], (long long)pr.stride[1], (long long)pr.stride[2],
           (long long)pr.dilation[0], (long long)pr.dilation[1], (long long)pr.dilation[2],
           (long long)pr.causal[0], (long long)pr.causal[1], (long long)pr.causal[2], drop, tf32);
  return code;
}

const nattn::KernelEntry* find_kernel(const char* family, int dtype, int na_dim, int dim) {
  const nattn::KernelEntry* best = nullptr;
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const nattn::KernelEntry& e = nattn::kKernels[i];
    if (!e.family || strcmp(e.family, family) || e.dtype != dtype || e.na_dim != na_dim) continue;
    if (e.head_dim >= dim && (!best || e.head_dim < best->head_dim)) best = &e;
  }
  return best;
}

bool aligned16(int64_t ptr) { return ptr % 16 == 0; }

// NATTN_FAMILY caps the family libnattn picks, for A/B measurements and for testing every
// family on one GPU: simt, tc, or sm90 (which also makes a forward that the Hopper family
// declines an error naming the reason). Unset, the most specialised family that takes a
// problem runs. Read on every call (a getenv), so a process can switch between runs.
enum FamilyCap { kCapSimt = 0, kCapTc = 1, kCapAny = 2, kCapSm90Only = 3 };
int family_cap() {
  const char* f = getenv("NATTN_FAMILY");
  if (!f || !*f) return kCapAny;
  return !strcmp(f, "simt") ? kCapSimt : !strcmp(f, "tc") ? kCapTc : !strcmp(f, "sm90") ? kCapSm90Only : kCapAny;
}

// Compute capability of a device as 10 * major + minor (0 when unknown), asked once.
int device_cc(int device) {
  static int cc[64] = {0};  // 0: not asked yet, -1: failed
  if (device < 0 || device >= 64) return 0;
  if (!cc[device]) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
      cc[device] = -1;
    else
      cc[device] = 10 * major + minor;
  }
  return cc[device] > 0 ? cc[device] : 0;
}

// Streaming multiprocessors of a device (0 when unknown), asked once.
int device_sms(int device) {
  static int sms[64] = {0};  // 0: not asked yet, -1: failed
  if (device < 0 || device >= 64) return 0;
  if (!sms[device] && cudaDeviceGetAttribute(&sms[device], cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    sms[device] = -1;
  return sms[device] > 0 ? sms[device] : 0;
}

// The tensor-core family runs on SM80+ (its code is built for every arch from 8.0).
bool tc_allowed(int device) { return family_cap() >= kCapTc && device_cc(device) >= 80; }

// The Hopper family's code is sm_90a: it runs on compute capability 9.0 exactly.
bool sm90_allowed(int device) { return family_cap() >= kCapAny && device_cc(device) == 90; }

// Attention dropout runs on the tensor-core and SIMT families (kernel_table.DROPOUT_FAMILIES):
// a problem with it never goes to the Hopper family.
const char* const kSm90NoDropout = "dropout_p > 0 is not supported by the sm90 family (the tc and simt families run it)";

// Smallest window (keys per query) from which the Hopper family runs a forward unless
// NATTN_FAMILY says otherwise, per NA dim. Measured on the H200 (bf16, docs/dev/PERF.md):
// its 128-query boxes walk whole 128-key boxes of the window union, which costs little
// next to a large window but 4-10x the work of a 7x7 or 13x13 one, where the tensor-core
// family's 16-query warps are 2x faster. 1-D: it wins from 128 keys (0.22 vs 0.26 ms at
// 32k tokens); 2-D: 33x33 wins, 25x25 loses; 3-D: 9x11x11 still loses 2.3 vs 1.3 ms, the
// 18x24x24 video window wins 92 vs 222 ms. Sixth session: 64-query pairs (one consumer
// warpgroup, key boxes shaped to the union) beat tc from 13x13 in 2-D (0.41 vs 0.47 ms on
// 128^2 at head dim 64; 0.23 vs 0.27 at 56^2, head dim 32; 17x17-25x25 0.47-0.77 vs
// 0.69-1.26) and tie at 7x7 (but lose 2x with dilation 4 on 28^2: 7-token groups); in
// 3-D they lose (5x7x7 0.55 vs 0.43), while the 128-query pairs now win from 9x11x11 (1.15
// vs 1.34 ms; 7x9x9 0.86 vs 0.79).
// Seventh session (the tuner's table, PERF.md): at head dim 32 the 2-D 64-query pairs (three
// CTAs per SM) also beat tc at 7x7 (DiNAT 56^2 0.138 vs 0.151 ms, dilation 4 on 28^2 0.071
// vs 0.079, batch 1 0.012 vs 0.016; 14^2 with 12 heads 0.072 vs 0.068), so 2-D problems at
// head dim <= 32 run sm90 from kSm90MinWindow2dSmallHead keys.
// Twelfth session (after the plain mask, BoxWalk and LDS/STS: PERF.md, twelfth session): in
// 3-D sm90 now wins from 3x7x7 (147 keys; 16x32x32 B2 H8 D64: 0.290 vs 0.301 ms; 5x7x7 0.327
// vs 0.429, at head dim 128 0.394 vs 0.885) and still loses at 3x5x5 (0.241 vs 0.201).
constexpr int64_t kSm90MinWindow[3] = {128, 150, 128};
constexpr int64_t kSm90MinWindow2dSmallHead = 49;
// Thirteenth session (PERF.md; 2-D forward at head dims 64 and 128, ms): without dilation,
// stride or causality sm90 wins from 7x7 too (56x56 B32: 7x7 0.161 vs 0.197, 9x9 0.185 vs
// 0.238, 11x11 0.244 vs 0.309, 7x7 at head dim 128 0.161 vs 0.197; 112x112 7x7 0.163 vs
// 0.200; 28x28 and 14x14 tie), while with dilation tc stays ahead (56x56 7x7 dilation 2:
// 0.191 vs 0.205; 28x28 9x9 dilation 3: 0.156 vs 0.250; dilation 4: 0.098 vs 0.167).
constexpr int64_t kSm90MinWindow2dPlain = 49;
constexpr int kSm90SmallHeadDim = 32;
// Head dims above 128 (256): the tensor-core family stops at 128, so the Hopper forward's
// alternative is the SIMT family (CUDA cores), and it runs at any window (its GPU sweep passed
// in the eighth session: 2800 random forward cases with NATTN_FAMILY=sm90, head dim 256 among them).
constexpr int kTcMaxHeadDim = 128;
// The backward's (its pairs are 128-token / 64-token boxes), from forward + backward times
// against tc (PERF.md, twelfth session; bf16, ms): 2-D 13x13 1.79 vs 2.08, 21x21 1.35 vs 1.97,
// 7x7 loses (0.96 vs 0.70); 3-D 3x7x7 1.33 vs 1.47, 5x7x7 1.69 vs 2.05, causal 8x17x17 3.9 vs
// 15.2 (tc's backward walks the causal window's whole box), 3x5x5 loses (1.27 vs 1.07).
constexpr int64_t kSm90MinWindowBackward[3] = {128, 150, 128};
// Fourteenth session (PERF.md; tc's passes 20-30% faster: no binary searches, no cursors),
// backward = forward + backward minus forward, GPU time, ms, tc vs sm90: 2-D at head dim 32
// 13x13 0.34 vs 0.45 (28x28) and 0.59 vs 0.72 (56x56), 15x15 0.70 vs 0.78, 17x17 0.85 vs
// 0.92, 21x21 0.61 vs 0.56; 3-D at head dims 32 / 64 3x7x7 0.75 vs 0.83, 5x7x7 1.08 vs 1.13,
// 7x7x7 1.36 vs 1.44, 5x9x9 1.68 vs 1.51, 7x9x9 2.20 vs 1.93; 2-D 13x13 at head dim 64 and
// 3-D 5x7x7 at 128 stay sm90's (1.14 vs 1.05, 0.95 vs 0.74). So the backward of 2-D windows
// at head dims <= 32 and of 3-D ones at head dims <= 64 runs sm90 from 400 keys.
constexpr int64_t kSm90MinWindowBackwardSmallHead = 400;
constexpr int kSm90BackwardSmallHeadDim[3] = {0, 32, 64};

// The backward's minimum window for a head dim (the larger of D and D_v).
int64_t sm90_min_window_backward(int na_dim, int64_t head_dim) {
  if (head_dim > 0 && head_dim <= kSm90BackwardSmallHeadDim[na_dim - 1]) return kSm90MinWindowBackwardSmallHead;
  return kSm90MinWindowBackward[na_dim - 1];
}

// Keys in a query's window (the product of the kernel sizes).
int64_t window_keys(const nattn::Params& p) {
  int64_t window = 1;
  for (int a = 0; a < p.na_dim; ++a) window *= p.kernel[a];
  return window;
}

// Keys the Hopper family walks per query with a (query box, key box) pair: per axis, the
// union of a query box's windows (the window plus the leaders' spread: blocks of `stride`
// queries share a window) rounded up to whole key boxes. 64-key boxes count 15% more (a
// narrower wgmma keeps the tensor cores less busy); 64-query boxes (one consumer
// warpgroup, no ping-pong, boxes run one after the other) count kSm90SmallQueryCost more,
// per NA dim: in 2-D the key count alone ranked the measured pairs of 9x9-33x33 windows
// right (PERF.md sixth session); in 3-D they lost to 128-query pairs on every window.
// At head dim 32 a 2-D 64-query pair counts 0.6x: three of its CTAs share an SM (two at
// head dim 64), and the tuner's table (seventh session) had it ahead of 128-query pairs
// walking fewer keys (dilation 4: 112 vs 74 keys, 0.071 vs 0.153 ms; 33x33: 2016 vs 1920,
// 0.335 vs 0.379 ms).
constexpr double kSm90SmallQueryCost[3] = {1.3, 1.0, 1.5};
constexpr double kSm90SmallQueryCost2dSmallHead = 0.6;
// 3-D query boxes four frames deep (4x4x8) at head dims <= 64 count 0.85x below
// kSm90DeepBoxMaxWindow keys. Thirteenth session (PERF.md, forward ms, bf16): at equal or
// slightly smaller key counts they beat the 2x8x8 box by 13-22% (16x48x48 7x9x9 D64: 0.370
// vs 0.424 with 6% fewer keys; 8x64x64 5x9x9: 0.319 vs 0.389 with equal keys; 16x32x32
// 7x7x7: 0.382-0.401 vs 0.492) while at head dim 128 they lose (HunyuanVideo's 18x24x24:
// 49.0 vs 46.9 with 4% fewer keys; 12x40x40 9x15x15 1.55 vs 1.37).
constexpr double kSm90DeepBoxCost = 0.85;
constexpr int64_t kSm90DeepBoxMaxWindow = 4096;
double sm90_tile_cost(const nattn::Params& p, const nattn::KernelEntry& e) {
  double keys = 1;
  int kbox_size = 1, qbox_size = 1;
  if (p.na_dim == 3 && e.head_dim <= 64 && e.qbox[0] >= 4 && window_keys(p) < kSm90DeepBoxMaxWindow)
    keys = kSm90DeepBoxCost;
  for (int a = 0; a < p.na_dim; ++a) {
    const int d = p.dilation[a], s = p.stride[a], k = p.kernel[a];
    const int len = (p.spatial[a] + d - 1) / d;
    const int leaders = (e.qbox[a] + s - 1) / s;
    const int span = k + (leaders - 1) * s;
    const int uni = span < len ? span : len;
    keys *= double((uni + e.kbox[a] - 1) / e.kbox[a]) * e.kbox[a];
    kbox_size *= e.kbox[a];
    qbox_size *= e.qbox[a];
  }
  if (kbox_size <= 64) keys *= 1.15;
  if (qbox_size >= 128) return keys;
  const bool small_head = p.na_dim == 2 && e.head_dim <= kSm90SmallHeadDim;
  return keys * (small_head ? kSm90SmallQueryCost2dSmallHead : kSm90SmallQueryCost[p.na_dim - 1]);
}

// The first pair of an NA dim in the table (SM90_TILES) is its default; another runs only
// when it walks at least 10% fewer keys. Measured on the H200 (docs/dev/PERF.md, fourth
// session, call 8): the key count alone mispredicts small differences (hunyuan-3d: 4x4x8
// queries with 2x4x16 keys walk 4% fewer keys than 2x8x8 / 2x8x8 but ran 67.7 vs 61.8 ms),
// while large ones hold (video-3d 5x7x7: 17% fewer, 0.73 vs 0.89 ms; 9x11x11: 40% fewer,
// 1.70 vs 2.19 ms; DiNAT 7x7 with 8x8 key boxes: 0.46 vs 0.52 ms).
constexpr double kSm90TileGain = 0.9;

// "q8x16_k4x32": a tile pair's name (NATTN_SM90_TILE forces one, for tests and tuning).
void sm90_tile_name(const nattn::KernelEntry& e, int na_dim, char* buf, size_t n) {
  int used = snprintf(buf, n, "q");
  for (int a = 0; a < na_dim; ++a) used += snprintf(buf + used, n - used, a ? "x%d" : "%d", e.qbox[a]);
  used += snprintf(buf + used, n - used, "_k");
  for (int a = 0; a < na_dim; ++a) used += snprintf(buf + used, n - used, a ? "x%d" : "%d", e.kbox[a]);
}

// Whether a pair can take the problem's RPB (64-query pairs stage the head's table in
// shared memory, up to kSmallRpbStageFloats) and its split-KV (split_kv_built); the
// default choice skips those that cannot.
bool sm90_pair_fits(const nattn::Params& p, const nattn::KernelEntry& e) {
  if (p.kv_splits > 1 && !nattn::sm90::split_kv_built(e.qbox[0], e.qbox[1], e.qbox[2], e.head_dim)) return false;
  const int queries = e.qbox[0] * (p.na_dim > 1 ? e.qbox[1] : 1) * (p.na_dim > 2 ? e.qbox[2] : 1);
  return !p.rpb || queries >= nattn::sm90::kQueryRows || p.rpb_head_size <= nattn::sm90::kSmallRpbStageFloats;
}

bool is_sm90_entry(const nattn::KernelEntry& e, const nattn::Params& p, int dim) {
  return e.family && !strcmp(e.family, "sm90") && e.dtype == p.dtype && e.na_dim == p.na_dim && e.head_dim == dim;
}

// The pair a problem runs by default: the one walking the fewest keys (sm90_tile_cost)
// among those that fit it, unless the table's first pair of the NA dim is within
// kSm90TileGain of it.
const nattn::KernelEntry* default_sm90(const nattn::Params& p, int dim) {
  const nattn::KernelEntry* best = nullptr;
  const nattn::KernelEntry* first = nullptr;
  double best_cost = 0;
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const nattn::KernelEntry& e = nattn::kKernels[i];
    if (!is_sm90_entry(e, p, dim) || !sm90_pair_fits(p, e)) continue;
    const double cost = sm90_tile_cost(p, e);
    if (!first) first = &e;
    if (!best || cost < best_cost) best = &e, best_cost = cost;
  }
  if (best && best != first && best_cost > kSm90TileGain * sm90_tile_cost(p, *first)) best = first;
  return best;
}

// Whether the call names a tile pair (Params::tile_q / tile_k), and whether `e` is it.
bool tile_requested(const nattn::Params& p) { return p.tile_q[0] > 0; }
bool is_requested_tile(const nattn::Params& p, const nattn::KernelEntry& e) {
  for (int a = 0; a < 3; ++a)
    if (e.qbox[a] != p.tile_q[a] || e.kbox[a] != p.tile_k[a]) return false;
  return true;
}

// Whether NATTN_SM90_TILE (`forced`, non-empty) names pair `e`.
bool is_forced_tile(const nattn::KernelEntry& e, int na_dim, const char* forced) {
  char name[64];
  sm90_tile_name(e, na_dim, name, sizeof name);
  return !strcmp(name, forced);
}

// The Hopper entry for a problem: the call's tile pair, else NATTN_SM90_TILE's, else the
// default one.
const nattn::KernelEntry* find_sm90(const nattn::Params& p, int dim, const char** why) {
  if (tile_requested(p)) {
    for (int i = 0; i < nattn::kNumKernels; ++i)
      if (is_sm90_entry(nattn::kKernels[i], p, dim) && is_requested_tile(p, nattn::kKernels[i])) return &nattn::kKernels[i];
    *why = "the call's tile pair is not compiled for this dtype, NA dim and head dim";
    return nullptr;
  }
  const char* forced = getenv("NATTN_SM90_TILE");
  if (forced && *forced) {
    for (int i = 0; i < nattn::kNumKernels; ++i)
      if (is_sm90_entry(nattn::kKernels[i], p, dim) && is_forced_tile(nattn::kKernels[i], p.na_dim, forced))
        return &nattn::kKernels[i];
    *why = "NATTN_SM90_TILE names no compiled tile pair for this NA dim and head dim";
    return nullptr;
  }
  const nattn::KernelEntry* best = default_sm90(p, dim);
  if (!best) *why = "no compiled sm90 kernel for this dtype, NA dim and head dim";
  return best;
}

// The Hopper entry for a backward: the pair of SM90_BACKWARD_TILES for this NA dim (or the
// call's / NATTN_SM90_TILE's pair when it has a backward; a forced forward-only pair leaves
// the backward on the default, so forcing a pair never makes training fail).
const nattn::KernelEntry* find_sm90_backward(const nattn::Params& p, int dim, const char** why) {
  const char* forced = getenv("NATTN_SM90_TILE");
  if (tile_requested(p)) forced = nullptr;  // the call's pair decides (below)
  const nattn::KernelEntry* first = nullptr;
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const nattn::KernelEntry& e = nattn::kKernels[i];
    if (!is_sm90_entry(e, p, dim) || !e.backward) continue;
    if (tile_requested(p) && is_requested_tile(p, e)) return &e;
    if (forced && *forced && is_forced_tile(e, p.na_dim, forced)) return &e;
    if (!first) first = &e;
  }
  if (!first) *why = "no compiled sm90 backward for this dtype, NA dim and head dim";
  return first;
}

// Split-KV by default (a call that leaves kv_splits at 0): a forward whose 128-query boxes
// fill at most half the GPU, with a window of at least kSplitMinWindow keys, runs the Hopper
// family with kDefaultSplits CTAs per box. Measured on the H200 (PERF.md seventh and eighth
// sessions, GPU time): 1-D 4096 tokens, window 2048, B=1, H=2 (64 CTAs) 0.031 vs 0.039 ms
// unsplit; 3-D 8x16x16, window 7x7x7, B=1, H=4 (64 CTAs) 0.041 vs 0.063 ms on the
// tensor-core family; kv=4 was slower than kv=2 on both, and with B=4 (256 CTAs) splitting
// lost 1.7x. A split call that the family declines runs unsplit.
constexpr int kDefaultSplits = 2;
constexpr int64_t kSplitMinWindow = 128;
bool split_by_default(const nattn::Params& p, int device) {
  if (window_keys(p) < kSplitMinWindow || p.dim != p.dim_v || p.dim > kTcMaxHeadDim) return false;
  const int64_t ctas = (p.tokens + 127) / 128 * p.heads * p.batch;
  const int sms = device_sms(device);
  return sms > 0 && ctas * kDefaultSplits <= sms;
}

// No dilation, stride or causality on any axis (kSm90MinWindow2dPlain).
bool plain_2d_window(const nattn::Params& p) {
  for (int a = 0; a < p.na_dim; ++a)
    if (p.dilation[a] != 1 || p.stride[a] != 1 || p.causal[a]) return false;
  return true;
}

bool sm90_preferred(const nattn::Params& p, bool backward) {
  const int64_t window = window_keys(p);
  if (!backward && (p.dim > kTcMaxHeadDim || p.dim_v > kTcMaxHeadDim)) return true;
  if (!backward && p.na_dim == 2 && p.dim <= kSm90SmallHeadDim && p.dim_v <= kSm90SmallHeadDim)
    return window >= kSm90MinWindow2dSmallHead;
  if (!backward && p.na_dim == 2 && plain_2d_window(p)) return window >= kSm90MinWindow2dPlain;
  if (backward) return window >= sm90_min_window_backward(p.na_dim, p.dim > p.dim_v ? p.dim : p.dim_v);
  return window >= kSm90MinWindow[p.na_dim - 1];
}

// Validates the problem and fills the kernel parameters. `backward` adds the
// gradient tensors to the checks.
int build_params(const int64_t* fields, int64_t n_fields, double scale, bool backward,
                 nattn::Params& p, const nattn::KernelEntry*& entry, char* err, int64_t err_len) {
  NattnProblem pr;
  memset(&pr, 0, sizeof pr);
  const char* what = backward ? "nattn backward" : "nattn forward";
  if (n_fields != NATTN_NUM_PROBLEM_FIELDS)
    return fail(err, err_len, kInvalid, pr, what, "got %lld problem fields, this library expects %d "
                "(Python package and libnattn are from different builds)",
                (long long)n_fields, NATTN_NUM_PROBLEM_FIELDS);
  memcpy(&pr, fields, sizeof pr);
  if (pr.abi_version != NATTN_ABI_VERSION)
    return fail(err, err_len, kInvalid, pr, what, "ABI version %lld, library has %d",
                (long long)pr.abi_version, NATTN_ABI_VERSION);
  if (pr.dtype < 0 || pr.dtype > 2)
    return fail(err, err_len, kInvalid, pr, what, "dtype code %lld is not float32/float16/bfloat16",
                (long long)pr.dtype);
  if (pr.na_dim < 1 || pr.na_dim > 3)
    return fail(err, err_len, kInvalid, pr, what, "na_dim must be 1, 2 or 3");
  if (pr.dim <= 0 || pr.dim % 8 || pr.dim_v <= 0 || pr.dim_v % 8)
    return fail(err, err_len, kInvalid, pr, what, "head dims must be positive multiples of 8");
  if (pr.heads <= 0 || pr.heads_kv <= 0 || pr.heads % pr.heads_kv)
    return fail(err, err_len, kInvalid, pr, what, "heads must be a multiple of heads_kv");
  if (pr.batch <= 0 || pr.batch > 65535 || pr.heads > 65535)
    return fail(err, err_len, kInvalid, pr, what, "batch and heads must be in 1..65535 (grid limits)");
  // Attention dropout: p as float64 bits, its keep threshold (which must be floor(p * 2^32),
  // common/philox.cuh) and the device pointer of the call's int64 [seed, offset].
  const bool dropout = pr.dropout_p_bits != 0;
  double drop_p = 0.0;
  memcpy(&drop_p, &pr.dropout_p_bits, sizeof drop_p);
  if (dropout) {
    if (!(drop_p > 0.0 && drop_p < 1.0))
      return fail(err, err_len, kInvalid, pr, what, "dropout_p must be in [0, 1), got %g", drop_p);
    if (pr.dropout_threshold != int64_t(nattn::dropout_threshold(drop_p)))
      return fail(err, err_len, kInvalid, pr, what, "dropout_threshold %lld does not match dropout_p %.17g "
                  "(floor(p * 2^32) = %u)", (long long)pr.dropout_threshold, drop_p, nattn::dropout_threshold(drop_p));
    if (!pr.rng_ptr || pr.rng_ptr % 8)
      return fail(err, err_len, kInvalid, pr, what, "dropout_p > 0 needs rng_ptr: the call's int64 [seed, offset] "
                  "on the device, 8-byte aligned");
  } else if (pr.dropout_threshold != 0) {
    return fail(err, err_len, kInvalid, pr, what, "dropout_threshold %lld without dropout_p",
                (long long)pr.dropout_threshold);
  }
  // ABI 4: whether a float32 call may run the tensor-core family's TF32 instances.
  if (pr.allow_tf32 != 0 && pr.allow_tf32 != 1)
    return fail(err, err_len, kInvalid, pr, what, "allow_tf32 must be 0 or 1, got %lld", (long long)pr.allow_tf32);
  const bool tf32 = pr.dtype == 0 && pr.allow_tf32 == 1;
  const int64_t dim_max = pr.dim > pr.dim_v ? pr.dim : pr.dim_v;
  entry = find_kernel("simt", int(pr.dtype), int(pr.na_dim), int(dim_max));
  if (!entry)
    return fail(err, err_len, kNotCompiled, pr, what,
                "no compiled SIMT kernel for this dtype, NA dim and head dim %lld "
                "(see nattn.build_info.build_config())", (long long)dim_max);
  // 16-bit inputs on SM80+, and float32 ones that allow TF32: the tensor-core family where it
  // is compiled for this head dim (its float32 instances compute in TF32). float32 without
  // allow_tf32 stays on the SIMT family's exact fp32; it never runs the Hopper family.
  if ((pr.dtype != 0 || tf32) && tc_allowed(int(pr.device))) {
    const nattn::KernelEntry* tc = find_kernel("tc", int(pr.dtype), int(pr.na_dim), int(dim_max));
    if (tc) entry = tc;
  }
  memset(&p, 0, sizeof p);
  p.na_dim = int(pr.na_dim);
  p.dtype = int(pr.dtype);
  p.batch = int(pr.batch);
  p.heads = int(pr.heads);
  p.heads_kv = int(pr.heads_kv);
  p.groups = int(pr.heads / pr.heads_kv);
  p.dim = int(pr.dim);
  p.dim_v = int(pr.dim_v);
  p.tokens = 1;
  p.rpb_head_size = 1;
  for (int a = 0; a < 3; ++a) {
    const bool live = a < p.na_dim;
    const int64_t n = live ? pr.spatial[a] : 1, k = live ? pr.kernel[a] : 1;
    const int64_t s = live ? pr.stride[a] : 1, d = live ? pr.dilation[a] : 1;
    if (live && (n < 1 || n > 0x7fffffff || k < 2 || d < 1 || s < 1 || s > k || k * d > n))
      return fail(err, err_len, kInvalid, pr, what,
                  "axis %d: need 2 <= kernel, 1 <= stride <= kernel, kernel * dilation <= size < 2^31", a);
    p.spatial[a] = int(n);
    p.kernel[a] = int(k);
    p.stride[a] = int(s);
    p.dilation[a] = int(d);
    p.causal[a] = live ? int(pr.causal[a] != 0) : 0;
    p.rpb_size[a] = live ? int(2 * k - 1) : 1;
    p.tokens *= n;
    p.rpb_head_size *= p.rpb_size[a];
  }
  const int64_t qpb = nattn::simt::kThreads / (entry->head_dim / 8);
  if ((p.tokens + qpb - 1) / qpb > 0x7fffffff)
    return fail(err, err_len, kInvalid, pr, what, "too many tokens (%lld) for the launch grid",
                (long long)p.tokens);
  for (int a = 0; a < 6; ++a)
    if (pr.tile[a] < 0 || pr.tile[a] > 256)
      return fail(err, err_len, kInvalid, pr, what, "tile extents must be in [0, 256] (0: the default pair)");
  for (int a = 0; a < 3; ++a) {
    p.tile_q[a] = int(pr.tile[a]);
    p.tile_k[a] = int(pr.tile[3 + a]);
  }
  if (pr.dq_mode < 0 || pr.dq_mode > 2)
    return fail(err, err_len, kInvalid, pr, what, "dq_mode must be 0 (default), 1 (deterministic pass) or 2 (KV-parallel), got %lld",
                (long long)pr.dq_mode);
  p.dq_mode = int(pr.dq_mode);
  if (pr.kv_splits < 0 || pr.kv_splits > 64)
    return fail(err, err_len, kInvalid, pr, what, "kv_splits must be in [0, 64] (0 or 1: no split), got %lld",
                (long long)pr.kv_splits);
  p.kv_splits = pr.kv_splits > 1 ? int(pr.kv_splits) : 1;
  p.o_part = p.lse_part = nullptr;
  if (dropout) {
    p.drop_rng = reinterpret_cast<const int64_t*>(pr.rng_ptr);
    p.drop_threshold = uint32_t(pr.dropout_threshold);
    p.drop_scale = float(1.0 / (1.0 - drop_p));
  }
  p.scale = float(scale);
  p.scale_log2 = float(scale * 1.4426950408889634);
  const int eb = kDtypeBytes[pr.dtype];
  struct Tensor { const char* name; int64_t ptr; const int64_t* stride; int64_t* dst; bool used; };
  const Tensor tensors[] = {
      {"q", pr.q_ptr, pr.q_stride, p.q_s, true},
      {"k", pr.k_ptr, pr.k_stride, p.k_s, true},
      {"v", pr.v_ptr, pr.v_stride, p.v_s, true},
      {"out", pr.out_ptr, pr.out_stride, p.out_s, true},
      {"grad_out", pr.grad_out_ptr, pr.grad_out_stride, p.grad_out_s, backward},
      {"dq", pr.dq_ptr, pr.dq_stride, p.dq_s, backward},
      {"dk", pr.dk_ptr, pr.dk_stride, p.dk_s, backward},
      {"dv", pr.dv_ptr, pr.dv_stride, p.dv_s, backward},
  };
  for (const Tensor& t : tensors) {
    if (!t.used) continue;
    if (!t.ptr)
      return fail(err, err_len, kInvalid, pr, what, "%s pointer is null", t.name);
    if (!aligned16(t.ptr))
      return fail(err, err_len, kInvalid, pr, what, "%s is not 16-byte aligned", t.name);
    for (int i = 0; i < 5; ++i) {
      if ((t.stride[i] * eb) % 16)
        return fail(err, err_len, kInvalid, pr, what,
                    "%s stride %d (%lld elements) is not a multiple of 16 bytes", t.name, i,
                    (long long)t.stride[i]);
      t.dst[i] = t.stride[i];
    }
  }
  if (!pr.lse_ptr) return fail(err, err_len, kInvalid, pr, what, "lse pointer is null");
  if (backward && !pr.delta_ptr) return fail(err, err_len, kInvalid, pr, what, "delta pointer is null");
  if (backward && pr.rpb_ptr && !pr.drpb_ptr)
    return fail(err, err_len, kInvalid, pr, what, "rpb given without a drpb buffer");
  p.q = reinterpret_cast<const void*>(pr.q_ptr);
  p.k = reinterpret_cast<const void*>(pr.k_ptr);
  p.v = reinterpret_cast<const void*>(pr.v_ptr);
  p.out = reinterpret_cast<void*>(pr.out_ptr);
  p.lse = reinterpret_cast<float*>(pr.lse_ptr);
  p.rpb = reinterpret_cast<const float*>(pr.rpb_ptr);
  p.grad_out = reinterpret_cast<const void*>(pr.grad_out_ptr);
  p.grad_lse = reinterpret_cast<const float*>(pr.grad_lse_ptr);
  p.delta = reinterpret_cast<float*>(pr.delta_ptr);
  p.dq = reinterpret_cast<void*>(pr.dq_ptr);
  p.dk = reinterpret_cast<void*>(pr.dk_ptr);
  p.dv = reinterpret_cast<void*>(pr.dv_ptr);
  p.drpb = reinterpret_cast<float*>(pr.drpb_ptr);
  (void)err;
  return kOk;
}

int run(const int64_t* fields, int64_t n_fields, double scale, void* stream, bool backward,
        char* err, int64_t err_len) {
  nattn::Params p;
  const nattn::KernelEntry* entry = nullptr;
  int code = build_params(fields, n_fields, scale, backward, p, entry, err, err_len);
  if (code != kOk) return code;
  NattnProblem pr;
  memcpy(&pr, fields, sizeof pr);
  const char* what = backward ? "nattn backward" : "nattn forward";
  // cudaSetDevice also makes the device's primary context current on this thread: a thread
  // that has made no runtime call yet (autograd's backward worker) has none, and the driver's
  // tensor-map encoding (sm90) refuses to run without one (CUDA_ERROR_INVALID_CONTEXT).
  cudaError_t e = cudaSetDevice(int(pr.device));
  if (e != cudaSuccess)
    return fail(err, err_len, kCudaError, pr, what, "selecting device %lld: %s",
                (long long)pr.device, cudaGetErrorString(e));
  // The Hopper family where it takes the problem (its prepare steps write the tensor maps
  // into `workspace`); else the tensor-core or SIMT entry build_params chose.
  alignas(64) unsigned char workspace[nattn::kPrepareBytes];
  if (p.dtype != 0) {
    // A forward naming its tile pair or a split-KV factor runs the Hopper family (or fails
    // saying why), whatever the window.
    const bool named = !backward && (tile_requested(p) || p.kv_splits > 1);
    const bool required = family_cap() == kCapSm90Only || named;
    const int dim_max = p.dim > p.dim_v ? p.dim : p.dim_v;
    const char* why = nullptr;
    // The Hopper family's entry for this call, prepared (its tensor maps in `workspace`).
    auto try_sm90 = [&]() {
      const nattn::KernelEntry* h = backward ? find_sm90_backward(p, dim_max, &why) : find_sm90(p, dim_max, &why);
      if (h) why = (backward ? h->prepare_backward : h->prepare)(p, workspace);
      if (!why) {
        entry = h;
        p.prepared = workspace;
      }
    };
    const bool auto_split = !backward && !named && pr.kv_splits == 0 && sm90_allowed(int(pr.device)) &&
                            split_by_default(p, int(pr.device)) && !p.drop_rng;
    if (auto_split) {
      p.kv_splits = kDefaultSplits;
      try_sm90();
      if (why) p.kv_splits = 1;  // declined: the usual choice, unsplit
    }
    if (p.drop_rng) {
      why = kSm90NoDropout;  // the entry build_params chose runs it (tc, or simt when opted in)
    } else if (!auto_split || why) {
      why = nullptr;
      if (sm90_allowed(int(pr.device)) && (required || sm90_preferred(p, backward)))
        try_sm90();
      else
        why = sm90_allowed(int(pr.device)) ? "window below the family's minimum" : "the device is not compute capability 9.0";
    }
    if (why && required)
      return fail(err, err_len, kNotCompiled, pr, what, "%s, but the Hopper family declines: %s",
                  named ? "the call names a Hopper configuration (tile pair or split-KV)" : "NATTN_FAMILY=sm90", why);
  }
  (backward ? entry->backward : entry->forward)(p, static_cast<cudaStream_t>(stream));
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return fail(err, err_len, kCudaError, pr, what, "kernel launch (%s family, head-dim bucket %d) failed: %s",
                entry->family, entry->head_dim, cudaGetErrorString(e));
  if (err && err_len > 0) err[0] = '\0';
  return kOk;
}

// Why the Hopper family would decline a forward with this tile pair before any driver
// call (head dims, the tensor maps' shapes), or nullptr.
const char* sm90_pair_declines(const nattn::Params& p, const nattn::KernelEntry& e) {
  if (p.dim != e.head_dim || p.dim_v != e.head_dim) return "head dims must both equal the instance's";
  if (!sm90_pair_fits(p, e)) return "an RPB table above 4096 entries per head needs a 128-query tile pair";
  nattn::sm90::MapSpec m;
  const char* why = nattn::sm90::map_spec(p, p.q_s, p.heads, e.head_dim, e.qbox, m);
  if (!why) why = nattn::sm90::map_spec(p, p.k_s, p.heads_kv, e.head_dim, e.kbox, m);
  if (!why) why = nattn::sm90::map_spec(p, p.v_s, p.heads_kv, e.head_dim, e.kbox, m);
  return why;
}

}  // namespace

NATTN_API int64_t nattn_abi_version() { return NATTN_ABI_VERSION; }

NATTN_API int64_t nattn_num_problem_fields() { return NATTN_NUM_PROBLEM_FIELDS; }

// The smallest window (keys) from which an NA forward of this dimension runs the Hopper
// family when it can (Python's dispatch orders backends with it).
NATTN_API int64_t nattn_sm90_min_window(int64_t na_dim) {
  return na_dim >= 1 && na_dim <= 3 ? kSm90MinWindow[na_dim - 1] : -1;
}

// The same for a head dim (D == D_v): 2-D at head dim <= 32 starts lower
// (kSm90MinWindow2dSmallHead), head dims above 128 at any window.
NATTN_API int64_t nattn_sm90_min_window_head(int64_t na_dim, int64_t head_dim) {
  if (na_dim >= 1 && na_dim <= 3 && head_dim > kTcMaxHeadDim) return 1;
  if (na_dim == 2 && head_dim > 0 && head_dim <= kSm90SmallHeadDim) return kSm90MinWindow2dSmallHead;
  return nattn_sm90_min_window(na_dim);
}

// The same for the backward.
NATTN_API int64_t nattn_sm90_min_window_backward(int64_t na_dim) {
  return na_dim >= 1 && na_dim <= 3 ? kSm90MinWindowBackward[na_dim - 1] : -1;
}

// The backward's for a head dim (D == D_v): 2-D at head dims <= 32 and 3-D at <= 64 start
// later (kSm90MinWindowBackwardSmallHead).
NATTN_API int64_t nattn_sm90_min_window_backward_head(int64_t na_dim, int64_t head_dim) {
  return na_dim >= 1 && na_dim <= 3 ? sm90_min_window_backward(int(na_dim), head_dim) : -1;
}

// Whether this build has the Hopper family's backward for a dtype code, NA dim and head dim
// (Python's dispatch sends training calls to cuda only then).
NATTN_API int64_t nattn_sm90_has_backward(int64_t dtype, int64_t na_dim, int64_t head_dim) {
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const nattn::KernelEntry& e = nattn::kKernels[i];
    if (e.family && !strcmp(e.family, "sm90") && e.dtype == dtype && e.na_dim == na_dim && e.head_dim == head_dim &&
        e.backward)
      return 1;
  }
  return 0;
}

// The Hopper family's configurations (tile pairs) for a forward problem, for profilers and
// tuners: one line per compiled pair of the problem's dtype, NA dim and head dim,
// "name keys flags" ('\n'-separated), keys = the keys its boxes walk per query (the cost
// the default choice uses), flags among "default" (what a call runs unless NATTN_SM90_TILE
// says otherwise), "backward" (the pair has the backward), "declined:<reason>". Returns 0,
// or the error code and message of a forward with the same fields.
NATTN_API int nattn_sm90_configs(const int64_t* fields, int64_t n_fields, char* out, int64_t out_len, char* err,
                                 int64_t err_len) {
  nattn::Params p;
  const nattn::KernelEntry* entry = nullptr;
  const int code = build_params(fields, n_fields, 1.0, false, p, entry, err, err_len);
  if (code != kOk) return code;
  if (!out || out_len <= 0) return kInvalid;
  const int dim_max = p.dim > p.dim_v ? p.dim : p.dim_v;
  const nattn::KernelEntry* best = default_sm90(p, dim_max);
  int64_t used = 0;
  out[0] = '\0';
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const nattn::KernelEntry& e = nattn::kKernels[i];
    if (!is_sm90_entry(e, p, dim_max)) continue;
    char name[64];
    sm90_tile_name(e, p.na_dim, name, sizeof name);
    const char* why = sm90_pair_declines(p, e);
    const int n = snprintf(out + used, size_t(out_len - used), "%s%s %.0f%s%s%s%s", used ? "\n" : "", name,
                           sm90_tile_cost(p, e), &e == best ? " default" : "", e.backward ? " backward" : "",
                           why ? " declined:" : "", why ? why : "");
    if (n < 0 || used + n >= out_len) return fail(err, err_len, kInvalid, NattnProblem{}, "nattn_sm90_configs",
                                                  "output buffer of %lld bytes too small", (long long)out_len);
    used += n;
  }
  return kOk;
}

// The families of this build whose kernels run attention dropout (kernel_table.DROPOUT_FAMILIES
// with compiled instances), ';'-separated: "tc;simt", "tc", "simt" or "" (Python's cuda backend
// then declines dropout, as it does with a library from before ABI 3, which lacks this
// function).
NATTN_API const char* nattn_dropout_families() {
  bool tc = false, simt = false;
  for (int i = 0; i < nattn::kNumKernels; ++i) {
    const char* f = nattn::kKernels[i].family;
    tc = tc || (f && !strcmp(f, "tc"));
    simt = simt || (f && !strcmp(f, "simt"));
  }
  return tc ? (simt ? "tc;simt" : "tc") : (simt ? "simt" : "");
}

// "family:dtype:na_dim:head_dim" for every compiled instance, ';'-separated.
NATTN_API const char* nattn_kernels() {
  static char buf[16384];
  if (!buf[0]) {
    size_t used = 0;
    for (int i = 0; i < nattn::kNumKernels && nattn::kKernels[i].family; ++i) {
      const nattn::KernelEntry& e = nattn::kKernels[i];
      used += snprintf(buf + used, sizeof buf - used, "%s%s:%s:%d:%d", used ? ";" : "", e.family,
                       kDtypeNames[e.dtype], e.na_dim, e.head_dim);
      if (used >= sizeof buf) break;
    }
  }
  return buf;
}

NATTN_API int nattn_forward(const int64_t* fields, int64_t n_fields, double scale, void* stream,
                            char* err, int64_t err_len) {
  return run(fields, n_fields, scale, stream, false, err, err_len);
}

NATTN_API int nattn_backward(const int64_t* fields, int64_t n_fields, double scale, void* stream,
                             char* err, int64_t err_len) {
  return run(fields, n_fields, scale, stream, true, err, err_len);
}
