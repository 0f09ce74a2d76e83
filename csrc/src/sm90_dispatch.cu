// See sm90_dispatch.h.
#include "sm90_dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lookup.h"
#include "nattn/sm90/tensor_map_spec.h"
#include "nattn/sm90/square_geometry.cuh"
#include "nattn/sm90/strip_geometry.cuh"
#include "nattn/sm90/tiles.cuh"
#include "nattn/problem.h"

#define NATTN_API extern "C" __attribute__((visibility("default")))

namespace nattn { namespace host {

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
// Twenty-second session (PERF.md call 1; bf16, CUDA-graph replays, ms, tc vs sm90, head dim
// 32, no RPB): tc's passes have caught up below 11x11 (DiNAT 56x56 B32 H4 7x7 0.104 vs
// 0.112, dilation 4 on 28x28 0.056 vs 0.063, 9x9 0.126 vs 0.134, NAT's 14x14 B128 H8 0.060
// vs 0.076), sm90 still wins 13x13 (0.179 vs 0.194).
// Thirtieth session (PERF.md call 1; the self-fed 64-query CTAs, bf16, GPU time, ms, sm90 vs
// tc, no RPB): the choice below 150 keys in 2-D follows how well the boxes fit, not the
// window. 56x56 B32 H4 D32: 7x7 0.094 vs 0.104, 9x9 0.115 vs 0.126, 13x13 0.176 vs 0.194;
// D64 7x7 0.123 vs 0.147, 9x9 0.146 vs 0.183, 11x11 0.199 vs 0.229; dilation 4 on 28x28
// D32 0.049 vs 0.056; but 7x7 on 28x28 (B128 H4, the same tokens) 0.115 vs 0.102, on 14x14
// 0.064 vs 0.060 and dilation 2 on 56x56 at D64 0.150 vs 0.141: there the 8x8 query boxes
// cover 1.31 query rows a query (28 = 3.5 boxes). Measured as the keys walked per query
// times the rows covered, over the window's keys (sm90_walk_ratio), sm90 won every problem
// up to 4.6 and lost every one from 5.2 at D32 but one (11x11 at D32: 4.0, 0.176 vs 0.164);
// at D64 it won up to 5.4 (28x28 9x9: 0.051 vs 0.053) and lost at 6.0. In 3-D the ratio
// ranks the families as well (calls 2-3, 16x32x32 B2 H8 and 8x64x64 B1 H8): at D64 sm90
// wins from 5.2 down (video-3d's 5x7x7 0.320 vs 0.335, 5x5x9 0.261 vs 0.305, 5x9x9 0.349
// vs 0.487) and loses at 5.4 and above (3x7x9 0.283 vs 0.268, 3x7x7 0.281 vs 0.235, 3x5x5
// 0.234 vs 0.157); at D32 it wins from 4.1 down (5x7x9 0.294 vs 0.309, 5x9x9 0.316 vs
// 0.374) and loses from 5.2 (5x7x7 0.292 vs 0.260, 3x11x11 0.432 vs 0.346). So 2-D forwards
// below kSm90MinWindow and 3-D ones at any window, at head dims <= 64 without an RPB, run
// sm90 when that ratio is at most kSm90MaxWalkRatio[NA dim - 2][head dim above 32] (at 128:
// kSm90MaxWalkRatioHead128).
// Forty-eighth session (H100, bf16, GPU ms, sm90 vs tc, 16x32x32 B2 H8, windows the strip
// pairs do not take): in 3-D at D64 sm90 now wins at 5.3 (3x12x12 0.386 vs 0.559) and 5.8
// (4x10x10 0.451 vs 0.527), ties at 6.0 (2x8x8 0.248 vs 0.241) and loses from 6.35 (8x64x64
// 3x11x11 0.947 vs 0.912; 3x10x10 at 7.7 0.448 vs 0.420); at D32 it wins at 4.6 (5x10x10
// 0.414 vs 0.435) and loses at 5.8 (4x10x10 0.413 vs 0.366).
constexpr int64_t kSm90MinWindow[3] = {128, 150, 128};
constexpr double kSm90MaxWalkRatio[2][2] = {{5.0, 5.5}, {4.8, 5.8}};
// Fifteenth session (PERF.md calls 4-7, bf16, GPU time, ms): with an RPB the 64-query pairs'
// forward loses that lead at 7x7 (every key box is partly masked, so each score takes the
// mask's bias path): DiNAT 56x56 B32 H4 D32 0.144 vs tc's 0.126, dilation 4 on 28x28 B32 H8
// 0.074 vs 0.066. Sixteenth session (PERF.md call 2-3): the same up to 13x13 and at head dim 64
// (56x56 B32 H4, tc vs sm90: D32 9x9 0.153 vs 0.178, 11x11 0.200 vs 0.241, 13x13 0.238 vs
// 0.241; D64 7x7 0.162 vs 0.205, 9x9 0.198 vs 0.248, 11x11 0.257 vs 0.336, 13x13 0.304 vs
// 0.337; 28x28 dilation 4 at D64 0.084 vs 0.191; NAT's 14x14 B128 H8 D32 0.072 vs 0.099).
// In 3-D likewise (call 4; 16x32x32 B2 H8 D64: 5x9x9 0.532 vs 0.634, 7x9x9 0.681 vs 0.804).
// Forwards with an RPB run tc up to kTcRpbMaxWindow's keys (per NA dim and head dim; 1-D:
// the rule without RPB, measured with one in the thirtieth session), but for 2-D windows
// the boxes fit well (sm90_rpb_small_window_2d).
// Thirtieth session (PERF.md call 1; the self-fed 64-query CTAs, sm90 vs tc with an RPB):
// at head dim 64 13x13 on 128x128 (B4 H8) runs 0.321 vs 0.394 ms and 11x11 on 56x56 ties
// (0.244 vs 0.243), while at head dim 32 tc still wins 13x13 (0.245 vs 0.221); 7x7 ties or
// goes to tc (0.121 vs 0.117 on 56x56, 0.143 vs 0.114 on 28x28). So in 2-D the 169-key
// limit holds at head dims <= 32 only (at 33-64 an RPB keeps tc below kSm90MinWindow).
// In 3-D (call 3, 16x32x32 B2 H8, tc vs sm90) tc wins with an RPB up to 13x17x17 (3757
// keys; D64 9x11x11 1.134 vs 1.453, 11x15x15 2.261 vs 2.363, 13x17x17 3.365 vs 3.329; D32
// 13x17x17 2.640 vs 3.027).
// Call 5 (56x56 B8 H4 and 28x28 B32 H4, D128): at head dim 128 tc wins with an RPB up to
// 13x13 (7x7 0.087 vs 0.114, 11x11 with dilation 2 0.124 vs 0.188, 13x13 with dilation 2
// 0.148 vs 0.195). Rows: NA dims; columns: head dims <= 32, <= 64, <= 128.
constexpr int64_t kTcRpbMaxWindow[3][3] = {{0, 0, 0}, {169, 149, 169}, {4000, 4000, 0}};

int64_t tc_rpb_max_window(int na_dim, int64_t head_dim) {
  if (head_dim > 128) return 0;
  return kTcRpbMaxWindow[na_dim - 1][head_dim <= 32 ? 0 : head_dim <= 64 ? 1 : 2];
}
// Forty-eighth session (H100, bf16, forward with an RPB, GPU ms, sm90 vs tc; windows the strip
// pairs do not take): at head dims 33-64 sm90 wins up to walk ratio 4.2 (28x28 7x7 dilation 4
// at 3.0 0.071 vs 0.083, 56x56 9x9 at 4.2 0.175 vs 0.214, 11x11 at 4.0 0.229 vs 0.269), ties
// at 5.4 (28x28 9x9 0.209 vs 0.204) and loses at 6.0 (56x56 7x7 dilation 4 0.188 vs 0.178);
// at head dim 32 only where each window spans its whole dilation group, so no key is masked
// (DiNAT's dilated layers: 28x28 7x7 dilation 4 0.055 vs 0.058, 56x56 dilation 8 0.194 vs
// 0.208), and not on masked windows of any ratio (56x56 13x13 at 2.8 0.233 vs 0.212, 11x11
// at 4.0 0.234 vs 0.178, 7x7 dilation 4 at 6.0 0.149 vs 0.124). Sixty-second session (H100,
// the 16x4 / 7x16 boxes, ratio 4.2): 28x28 11x11 at head dim 64, B32 H8, 0.113 vs 0.134.
constexpr double kSm90MaxWalkRatioRpb2d = 5.0;  // head dims 33-64
// The backward with an RPB (call 4, forward + backward, bf16, ms, tc vs the default's sm90
// backward): 2-D D64 13x13 1.53 vs 2.90, 17x17 2.53 vs 3.99, 21x21 3.07 vs 5.43, D32 21x21
// 2.23 vs 5.03; 3-D D64 5x9x9 3.38 vs 6.38, 7x9x9 4.48 vs 8.46: the sm90 dK/dV pass's dRPB
// makes it ~2x slower. Twenty-first session, with both dK/dV passes' dRPB in fixed point
// (PERF.md call 2; backward = f+b - forward, GPU time, tc vs sm90): 2-D D64 13x13 0.98 vs
// 1.69, 21x21 1.97 vs 3.13, 31x31 4.40 vs 4.35, 45x45 (B8) 3.14 vs 2.53; D32 21x21 1.39 vs
// 2.88; 3-D D64 5x7x7 1.13 vs 2.54, 7x9x9 2.83 vs 4.71, 9x13x13 8.14 vs 8.41. With an RPB
// the backward runs sm90 only from this many keys (per NA dim; 1-D not measured).
constexpr int64_t kSm90MinWindowBackwardRpb[3] = {2048, 1024, 2048};
// Thirteenth session (PERF.md; 2-D forward at head dims 64 and 128, ms): without dilation,
// stride or causality sm90 wins from 7x7 too (56x56 B32: 7x7 0.161 vs 0.197, 9x9 0.185 vs
// 0.238, 11x11 0.244 vs 0.309, 7x7 at head dim 128 0.161 vs 0.197; 112x112 7x7 0.163 vs
// 0.200; 28x28 and 14x14 tie), while with dilation tc stays ahead (56x56 7x7 dilation 2:
// 0.191 vs 0.205; 28x28 9x9 dilation 3: 0.156 vs 0.250; dilation 4: 0.098 vs 0.167).
// Sixteenth session (PERF.md call 3; tc's passes 10-25% faster since): at head dim 64 tc wins
// 7x7 again (56x56 B32 H4: 0.148 vs 0.159) and ties 9x9 (0.184 vs 0.183), sm90 wins 13x13
// (0.242 vs 0.283); head dim 128 keeps the thirteenth session's rule.
// (Head dim 64 since the thirtieth session: kSm90MaxWalkRatio.)
// Thirtieth session (call 5, D128, no RPB, sm90 vs tc): 7x7 0.084 vs 0.081 on 56x56 B8 H4,
// 0.085 vs 0.077 on 28x28 B32 H4; with dilation 2 9x9 0.091 vs 0.096, 13x13 0.123 vs 0.141.
// (Thirty-fifth session: the walk ratio decides there instead, kSm90MaxWalkRatioHead128; the
// plain windows' 81-key minimum ran 7x7 on tc at 6-11% more time on large grids.)
constexpr int kSm90SmallHeadDim = 32;
// Head dims above kTcMaxHeadDim (256): the tensor-core family stops at 128, so the Hopper
// family's alternative is the SIMT family (CUDA cores), and it runs at any window, forward
// (its GPU sweep passed in the eighth session: 2800 random forward cases with
// NATTN_FAMILY=sm90, head dim 256 among them) and backward (backward_wide.cuh, since the
// twenty-ninth session).
// The backward's (its pairs are 128-token / 64-token boxes), from forward + backward times
// against tc (PERF.md, twelfth session; bf16, ms): 2-D 13x13 1.79 vs 2.08, 21x21 1.35 vs 1.97,
// 7x7 loses (0.96 vs 0.70); 3-D 3x7x7 1.33 vs 1.47, 5x7x7 1.69 vs 2.05, causal 8x17x17 3.9 vs
// 15.2 (tc's backward walks the causal window's whole box), 3x5x5 loses (1.27 vs 1.07).
constexpr int64_t kSm90MinWindowBackward[3] = {128, 150, 128};
// Forty-fifth session (GPU ms, backward = f+b - forward, sm90 vs tc, head dim 64): with the
// 16x8 / 4x24 pair sm90 wins 2-D windows without dilation from 9x9 (H100: 128x128 9x9 B4 H8
// 0.656 vs 0.697, 64x64 11x11 B16 H4 0.393 vs 0.431, 96x96 11x13 B4 H8 0.454 vs 0.546), not
// dilated ones (H200: 128x128 B4 H8 9x9 dilation 2 0.685 vs 0.668, 11x11 dilation 3 0.930
// vs 0.861), which keep kSm90MinWindowBackward, as do strided and causal ones (not measured).
constexpr int64_t kSm90MinWindowBackward2dPlain = 81;
// Forty-sixth session (H100, backward alone, sm90 vs tc, head dim 64; the passes' split CTAs
// made sm90's backward 6-8% faster on small 2-D windows): 1-D without dilation or causality
// on 16384 tokens B2 H8 w33 0.212 vs 0.225, w49 0.212 vs 0.245, w65 0.215 vs 0.269, w97 0.244
// vs 0.313 (at head dim 32 tc stays ahead: w65 0.176 vs 0.155, w97 0.203 vs 0.181); 2-D with
// dilation (no stride or causal axis) 64x64 B8 H8 11x11 dilation 2 0.392 vs 0.427, 128x128 B4
// H8 11x11 dilation 3 0.891 vs 0.900, 96x96 13x13 dilation 2 0.478 vs 0.624, while at 81 keys
// it was mixed (128x128 9x9 dilation 2 0.677 vs 0.711, 48x48 B32 H4 0.418 vs 0.394).
constexpr int64_t kSm90MinWindowBackward1dPlain = 33;
constexpr int64_t kSm90MinWindowBackward2dDilated = 121;
// Fourteenth session (PERF.md; tc's passes 20-30% faster: no binary searches, no cursors),
// backward = forward + backward minus forward, GPU time, ms, tc vs sm90: 2-D at head dim 32
// 13x13 0.34 vs 0.45 (28x28) and 0.59 vs 0.72 (56x56), 15x15 0.70 vs 0.78, 17x17 0.85 vs
// 0.92, 21x21 0.61 vs 0.56; 3-D at head dims 32 / 64 3x7x7 0.75 vs 0.83, 5x7x7 1.08 vs 1.13,
// 7x7x7 1.36 vs 1.44, 5x9x9 1.68 vs 1.51, 7x9x9 2.20 vs 1.93; 2-D 13x13 at head dim 64 and
// 3-D 5x7x7 at 128 stay sm90's (1.14 vs 1.05, 0.95 vs 0.74). So the backward of 2-D windows
// at head dims <= 32 and of 3-D ones at head dims <= 64 runs sm90 from 400 keys.
// Thirty-sixth session (PERF.md call 6, backward alone, sm90 vs tc, GPU ms, 2-D head dim 32):
// tc's passes have caught up at 21x21 (128x128 B4 H8 1.333 vs 1.272, 56x56 B32 H4 1.100 vs
// 0.997, 303x391 with dilation 4x1 2.762 vs 2.317; a causal 20x20 1.19x, dispatch_sweep seed
// 5) and sm90 wins from 25x25 (1.498 vs 1.713, on 256x256 1.562 vs 1.732): 2-D from 500 keys.
// (3-D without an RPB follows the walk ratio: kSm90MaxBackwardWalkRatio3d.)
constexpr int64_t kSm90MinWindowBackwardSmallHead[3] = {0, 500, 400};
constexpr int kSm90BackwardSmallHeadDim[3] = {0, 32, 64};
// Forty-fifth session (H100, head dim 32): where the backward runs the pair with 96-token
// column boxes sm90 wins 2-D from 17x17 (128x128 B4 H4 0.413 vs tc 0.484) and ties at 13x13
// (B4 H8 0.656 vs 0.643), so at head dims <= 32 such windows run it from this many keys;
// other pairs keep the 500 above (H200: 15x15, whose backward runs the 8x8 boxes, 0.821 vs
// tc 0.763).
constexpr int64_t kSm90MinWindowBackwardWideBox = 200;

// Head dims 65-128 (the 128-channel instances), where the tensor-core family runs one block
// per SM: thirty-fifth session (PERF.md calls 2-3; benchmarks/dispatch_sweep.py found the
// default up to 1.47x behind sm90 there; then `dispatch_check.py` on 65536 tokens B1 H16,
// 128x128 B2 H8, 16x32x32 B2 H8, bf16, GPU ms, sm90 vs tc, fwd / backward alone). Without an
// RPB, 1-D: w9 0.488 / 1.354 vs 0.423 / 1.308, w17 0.492 / 1.336 vs 0.449 / 1.363, w25 0.493
// / 1.348 vs 0.521 / 1.523, w49 0.509 / 1.354 vs 0.589 / 1.776 (and with dilation 3, w88 on
// 61653 tokens B4 H8, 1.20 / 3.15 vs 1.46 / 4.56: no per-dilation rule here); 2-D: 3x3 0.191 /
// 0.416 vs 0.127 / 0.374, 5x5 0.190 / 0.421 vs 0.154 / 0.425, 7x7 0.193 / 0.507 vs 0.205 /
// 0.549 (on 56x56 B8 H4 0.086 / 0.205 vs 0.084 / 0.218, dilation 2 0.195 / 0.504 vs 0.204 /
// 0.541), 9x9 backward 0.505 vs 0.679; 3-D: 3x3x3 0.284 / 0.885 vs 0.190 / 0.530, 3x5x5 0.284
// / 0.891 vs 0.297 / 0.856, 2x5x9 0.270 / 0.771 vs 0.331 / 0.946. The forward in 2-D and 3-D
// below kSm90MinWindow follows the walk ratio as at smaller head dims (kSm90MaxWalkRatio):
// 7x7 ran sm90 faster at ratios 7.8 (128x128) and 8.1 (384x404), tied at 8.9 (56x56) and lost
// at 10.3 (28x28 B32 H4, thirtieth session: 0.085 vs 0.077); in 3-D 3x5x5 (10.2) tied or won
// by 4%, 2x5x9 (8.5) won by 23%, 3x3x3 (28) lost. With an RPB (same shapes): 1-D w33 0.547 /
// 1.821 vs 0.526 / 1.737, w65 0.562 / 1.897 vs 0.676 / 2.211; the backward alone in 2-D 7x7
// 0.825 vs 0.658, 13x13 1.124 vs 1.247, 17x17 1.471 vs 1.855; in 3-D 5x7x7 2.732 vs 2.130,
// 5x9x9 3.880 vs 4.883 (the forward with an RPB keeps the rules above: kTcRpbMaxWindow).
constexpr int kSm90WideHeadDim = 64;  // above: these rules
constexpr int64_t kSm90MinWindow1dHead128 = 25;     // 1-D, forward and backward, no RPB
constexpr int64_t kSm90MinWindow1dHead128Rpb = 65;  // 1-D with an RPB (thirtieth session: w65 wins)
constexpr double kSm90MaxWalkRatioHead128[2] = {8.5, 10.5};  // 2-D, 3-D forwards below kSm90MinWindow
constexpr int64_t kSm90MinWindowBackwardHead128[3] = {kSm90MinWindow1dHead128, 49, 80};
constexpr int64_t kSm90MinWindowBackwardRpbHead128[3] = {kSm90MinWindow1dHead128Rpb, 150, 400};
// The 3-D backward without an RPB (same session, calls 3-4): the window alone mispredicted
// random shapes by up to 1.6x either way (17x33x58 7x5x13 at head dim 32: 455 keys, sm90
// 3.48 vs tc 2.13 ms; 12x42x51 3x14x8 with dilation 3 on H at 64: 336 keys, 0.654 vs 0.921;
// 17x40x52 5x3x7 at 128: 105 keys, 2.75 vs 2.11), the backward pair's walk ratio (as the
// forward's, on its 2x8x8 / 1x8x8 boxes) did not: sm90 won at head dim 32 up to 3.8 (5x9x9
// on 16x32x32, fourteenth session) and lost from 5.4 (tie; 5.5-9.5 lost by 20-64%), at 64
// won at 3.8-5.0 and 6.4 (by 10-43%) and lost at 6.3 (video-3d's 5x7x7: 0.988 vs 0.903,
// call 5) and 6.8, at 128 won at 6.3-8.5 (by 23-31%) and lost from 13.7. Thirty-sixth
// session: with the 4x4x8 / 2x4x8 backward pair (find_sm90_backward) video-3d's backward runs
// 0.901 vs tc's 0.930 (PERF.md call 4), so head dims <= 64 took sm90 up to 6.5.
// Forty-eighth session (H100, bf16, backward alone, GPU ms, sm90 vs tc; the split CTAs and
// the selected masks made sm90's 3-D backward 5-14% faster): at D32 sm90 wins from 4.5 to
// 7.7 (16x48x48 3x13x13 0.908 vs 1.396, 16x32x32 3x11x11 0.749 vs 0.915, 3x10x10 0.744 vs
// 0.790) and ties at 6.0 and 7.2 (2x8x8 0.420 vs 0.412, 2x8x10 0.503 vs 0.505), while above
// 8 the window's shape decides (8x48x48 3x5x12 at 8.5 0.674 vs 0.562, 2x6x10 at 9.6 0.515 vs
// 0.412, but 17x33x58 7x5x13 at 9.6 0.987 vs 1.102); at D64 it wins up to 9.8 (2x10x11
// 0.648 vs 0.883, 7x5x13 1.118 vs 1.551), ties at 9.6 (2x6x10 0.571 vs 0.586) and loses from
// 11.5 (2x5x10 0.577 vs 0.526, 3x3x10 at 17 0.608 vs 0.486).
constexpr double kSm90MaxBackwardWalkRatio3d[3] = {8.0, 10.0, 11.0};  // head dims <= 32, <= 64, <= 128

// The backward's minimum window for a head dim (the larger of D and D_v) without an RPB.
int64_t sm90_min_window_backward(int na_dim, int64_t head_dim) {
  if (head_dim > 0 && head_dim <= kSm90BackwardSmallHeadDim[na_dim - 1]) return kSm90MinWindowBackwardSmallHead[na_dim - 1];
  if (head_dim > kSm90WideHeadDim && head_dim <= kTcMaxHeadDim) return kSm90MinWindowBackwardHead128[na_dim - 1];
  return kSm90MinWindowBackward[na_dim - 1];
}

// Keys in a query's window (the product of the kernel sizes).
int64_t window_keys(const nattn::Params& p) {
  int64_t window = 1;
  for (int a = 0; a < p.na_dim; ++a) window *= p.kernel[a];
  return window;
}

// Keys the Hopper family walks per query with a (query box, key box) pair (walked_keys: per
// axis, the union of a query box's windows, the window plus the leaders' spread, since blocks
// of `stride` queries share a window, rounded up to whole key boxes) times the query rows its
// boxes cover per query (query_box_padding). 64-key boxes count 15% more (a
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
// 2-D 16x4 query boxes (with 7x16 key boxes: 4 boxes for a 13x13 window's 28x16 union)
// count 0.85x. Sixty-first session (PERF.md, H100, forward ms, bf16, each pair forced): they
// beat 8x8 / 4x24 by 7-39% on windows of 10 to 13, more than their key counts say (128x128
// 13x13 D64: 0.218 vs 0.239 with 7% fewer keys; 56x56 11x11 D32: 0.133 vs 0.162 with 6%
// more; 28x28 11x11 D32: 0.065 vs 0.103): four 112-key steps where 8x8 / 4x24 runs five of
// 96, and less padding on small maps.
constexpr double kSm90TallBoxCost = 0.85;
// Query rows a pair's boxes cover per real query (>= 1): per axis, each dilation group's
// queries rounded up to whole query boxes. Thirtieth session (PERF.md call 1): 28x28 with
// dilation 4 (7x7 groups) at head dim 64 ran the 8x16 pair, whose boxes cover 2.6 rows a
// query, at 0.152 ms against the tensor-core family's 0.074; the 8x8 boxes cover 1.3.
double query_box_padding(const nattn::Params& p, const nattn::KernelEntry& e) {
  double rows = 1;
  for (int a = 0; a < p.na_dim; ++a) {
    const int64_t len = p.spatial[a], d = p.dilation[a], qb = e.qbox[a];
    const int64_t longer = len % d, short_len = len / d;  // `longer` groups have short_len + 1 queries
    const int64_t covered = longer * ((short_len + qb) / qb * qb) + (d - longer) * ((short_len + qb - 1) / qb * qb);
    rows *= double(covered) / double(len);
  }
  return rows;
}

// Keys a pair's boxes walk per query: per axis, the union of a query box's windows rounded
// up to whole key boxes (a strip pair: its warps' strips' walks, strip_geometry.cuh; the
// square pair: its squares' walks, square_geometry.cuh).
double walked_keys(const nattn::Params& p, const nattn::KernelEntry& e) {
  if (nattn::sm90::is_strip_pair(p.na_dim, e.qbox, e.kbox)) return nattn::sm90::strip_walked_keys(p);  // per strip
  if (nattn::sm90::is_square_pair(p.na_dim, e.qbox, e.kbox)) return nattn::sm90::square_walked_keys(p);
  double keys = 1;
  for (int a = 0; a < p.na_dim; ++a) {
    const int d = p.dilation[a], s = p.stride[a], k = p.kernel[a];
    const int len = (p.spatial[a] + d - 1) / d;
    const int leaders = (e.qbox[a] + s - 1) / s;
    const int span = k + (leaders - 1) * s;
    const int uni = span < len ? span : len;
    keys *= double((uni + e.kbox[a] - 1) / e.kbox[a]) * e.kbox[a];
  }
  return keys;
}

double sm90_tile_cost(const nattn::Params& p, const nattn::KernelEntry& e) {
  double keys = walked_keys(p, e) * query_box_padding(p, e);
  // Strip and square pairs (named only: their own rules) count their warps' keys.
  if (nattn::sm90::is_strip_pair(p.na_dim, e.qbox, e.kbox) || nattn::sm90::is_square_pair(p.na_dim, e.qbox, e.kbox))
    return keys;
  int kbox_size = 1, qbox_size = 1;
  if (p.na_dim == 3 && e.head_dim <= 64 && e.qbox[0] >= 4 && window_keys(p) < kSm90DeepBoxMaxWindow)
    keys *= kSm90DeepBoxCost;
  for (int a = 0; a < p.na_dim; ++a) {
    kbox_size *= e.kbox[a];
    qbox_size *= e.qbox[a];
  }
  if (kbox_size <= 64) keys *= 1.15;
  if (p.na_dim == 2 && e.qbox[0] == 16 && e.qbox[1] == 4) keys *= kSm90TallBoxCost;
  // Key boxes copied in pieces (1-D, box x dilation above 256: tensor_map_spec.h) ran the
  // forward at half speed (twenty-eighth session, PERF.md call 3: 32768 tokens w2048 D128,
  // 0.52 ms at dilation 1 and 2, 1.09 at 4 with 128-key boxes in two pieces, with the same
  // L2 and DRAM bytes), while the backward's 64-token boxes (one copy at dilation 4) cost
  // nothing extra: 64-key pairs win there.
  if (nattn::sm90::box_pieces(e.kbox[0], p.dilation[0]) > 1) keys *= 2;
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

Sm90Entries sm90_entries() {
  static const Sm90Entries all = [] {
    const nattn::KernelEntry** list = new const nattn::KernelEntry*[nattn::kNumKernels > 0 ? nattn::kNumKernels : 1];
    int n = 0;
    for (int i = 0; i < nattn::kNumKernels; ++i)
      if (nattn::kKernels[i].family && !strcmp(nattn::kKernels[i].family, "sm90")) list[n++] = &nattn::kKernels[i];
    return Sm90Entries{list, n};
  }();
  return all;
}

// An entry of sm90_entries() for this problem's dtype, NA dim and head dim `dim`.
bool sm90_entry_for(const nattn::KernelEntry& e, const nattn::Params& p, int dim) {
  return e.dtype == p.dtype && e.na_dim == p.na_dim && e.head_dim == dim;
}

// The strip pairs (forward_strips.cuh, backward_dq_strips.cuh, backward_dkv_strips.cuh) run
// by default wherever they take a problem, forward and backward, ahead of the tensor-core
// family and the other pairs, unless an axis is dilated 4 or more (its groups are about a
// window long). Measured (H100, bf16, GPU ms, forward / forward + backward, strips vs the
// previous default; PERF.md forty-third session): dinat-s1 0.061 / 0.268 vs 0.085 / 0.345,
// 28x28 7x7 B128 0.074 / 0.314 vs 0.099 / 0.350, 56x56 7x7 D64 0.090 / 0.452 vs 0.110 /
// 0.541, video-3d 0.221 / 0.946 vs 0.310 / 1.214, 16x32x32 5x7x7 D32 0.131 / 0.568 vs 0.256 /
// 0.923, with an RPB dinat-s1 0.065 / 0.342 vs 0.112 / 0.425; but 28x28 7x7 dilation 4 D64
// 0.064 / 0.306 vs 0.059 / 0.269 (dinat-s2-dil4 at D32 equal). Dilated further they run where
// their walks are narrow (strip_problem_narrow: the columns axis' groups at most 8 long, as in
// DiNAT's dilated layers, whose windows are their whole groups). Measured there (H100, B128,
// RPB, D32, forward / forward + backward; PERF.md fifty-sixth session): 56x56 dilation 8 0.130
// / 0.614 vs 0.193 / 0.704, 28x28 dilation 4 0.069 / 0.322 vs 0.101 / 0.363; at D64 (B32)
// 28x28 dilation 4 0.035 / 0.159 vs 0.041 / 0.168. NATTN_SM90_STRIPS=0 (read on every call)
// turns the rule off.
constexpr int kStripMaxDilation = 3;
bool strips_by_default() {
  const char* s = getenv("NATTN_SM90_STRIPS");
  return !(s && !strcmp(s, "0"));
}

// The strip pair compiled for this problem's dtype, NA dim and head dim that takes it
// (sm90_pair_declines) and that the rule above prefers, or nullptr.
const nattn::KernelEntry* strip_pair_for(const nattn::Params& p, int dim) {
  for (int a = 0; a < p.na_dim; ++a)
    if (p.dilation[a] > kStripMaxDilation && !nattn::sm90::strip_problem_narrow(p)) return nullptr;
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i) {
    const nattn::KernelEntry& e = *all.e[i];
    if (sm90_entry_for(e, p, dim) && nattn::sm90::is_strip_pair(p.na_dim, e.qbox, e.kbox) && !sm90_pair_declines(p, e))
      return &e;
  }
  return nullptr;
}

// The square pair (forward_squares.cuh) runs the forward by default, ahead of the tensor-core
// family and the other pairs, where it takes the problem, the strips do not, and both window
// axes span at least kSquareMinKernel keys (a pair no GPU has run, KernelEntry::unverified,
// never does). Measured (H100, bf16, GPU ms, forward, square vs the previous default; PERF.md
// sixty-third session): 128x128 B4 H8 D64 13x13 0.194 vs 0.222, 11x11 0.194 vs 0.208, 9x9
// 0.168 vs 0.173, 13x13 dilation 2 0.207 vs 0.232; D32 64x64 13x13 0.063 vs 0.092, 56x56
// 11x11 0.092 vs 0.134, 9x9 0.079 vs 0.104 (tc 0.128); ties at D64 on 56x56 9x9 (0.132 vs
// 0.131) and 64x64 11x11 (0.103 vs 0.104). With an RPB against tc and the other pairs:
// mid-2d 0.253 vs 0.301, D32 56x56 9x9 0.100 vs 0.134 (tc), 28x28 13x13 0.083 vs 0.103,
// 96x96 13x13 0.096 vs 0.142, D64 64x64 11x11 0.119 vs 0.144.
// Its backward (its dQ pass, backward_dq_squares.cuh, then a dK/dV pass: square_dkv_pass in
// sm90/kernels.cuh) runs by default
// by the same rule. Measured (H100, bf16, GPU ms, forward + backward, the square forward
// with its backward vs with the previous default's; PERF.md sixty-fourth session): D32 56x56
// 11x11 B32 H4 0.417 vs 0.493, 9x9 0.350 vs 0.406, 64x64 13x13 B8 H8 0.333 vs 0.398 (tc's
// backward before); with an RPB 0.535 vs 0.604, 0.454 vs 0.491, 0.438 vs 0.503; D64 with an
// RPB, mid-2d's dQ pass 0.312 vs tc's 0.503 (f+b 1.247, 1.489 with the square rule off); D64
// without an RPB, mid-2d's dQ pass 0.258 vs 32x4 / 7x16's 0.287, the same dK/dV pass after
// it. NATTN_SM90_SQUARES=0 (read on every call) turns the rule off, forward and backward.
constexpr int kSquareMinKernel = 9;
bool squares_by_default() {
  const char* s = getenv("NATTN_SM90_SQUARES");
  return !(s && !strcmp(s, "0"));
}

const nattn::KernelEntry* square_pair_for(const nattn::Params& p, int dim) {
  if (p.na_dim != 2 || p.kernel[0] < kSquareMinKernel || p.kernel[1] < kSquareMinKernel) return nullptr;
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i) {
    const nattn::KernelEntry& e = *all.e[i];
    if (sm90_entry_for(e, p, dim) && !e.unverified && nattn::sm90::is_square_pair(p.na_dim, e.qbox, e.kbox) &&
        !sm90_pair_declines(p, e))
      return &e;
  }
  return nullptr;
}

// The pair a problem runs by default: the one walking the fewest keys (sm90_tile_cost)
// among those that fit it, unless the table's first pair of the NA dim is within
// kSm90TileGain of it (or the strip pair: strips_by_default; the square pair:
// squares_by_default).
const nattn::KernelEntry* default_sm90(const nattn::Params& p, int dim) {
  if (strips_by_default())
    if (const nattn::KernelEntry* e = strip_pair_for(p, dim)) return e;
  if (squares_by_default())
    if (const nattn::KernelEntry* e = square_pair_for(p, dim)) return e;
  const nattn::KernelEntry* best = nullptr;
  const nattn::KernelEntry* first = nullptr;
  double best_cost = 0;
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i) {
    const nattn::KernelEntry& e = *all.e[i];
    if (!sm90_entry_for(e, p, dim)) continue;
    // Pairs built for the backward's walk (2-D's 16x8 / 8x8, 3-D's 4x4x8 / 2x4x8:
    // SM90_NAMED_FORWARD_TILES) run a forward only when named: not timed against the others.
    if (e.forward_named_only) continue;
    if (!sm90_pair_fits(p, e)) continue;
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
  const Sm90Entries all = sm90_entries();
  if (tile_requested(p)) {
    for (int i = 0; i < all.n; ++i)
      if (sm90_entry_for(*all.e[i], p, dim) && is_requested_tile(p, *all.e[i])) return all.e[i];
    *why = "the call's tile pair is not compiled for this dtype, NA dim and head dim";
    return nullptr;
  }
  const char* forced = getenv("NATTN_SM90_TILE");
  if (forced && *forced) {
    for (int i = 0; i < all.n; ++i)
      if (sm90_entry_for(*all.e[i], p, dim) && is_forced_tile(*all.e[i], p.na_dim, forced)) return all.e[i];
    *why = "NATTN_SM90_TILE names no compiled tile pair for this NA dim and head dim";
    return nullptr;
  }
  const nattn::KernelEntry* best = default_sm90(p, dim);
  if (!best) *why = "no compiled sm90 kernel for this dtype, NA dim and head dim";
  return best;
}

// Keys walked by the dQ pass's warpgroups with a backward pair (a 128-query box halved along
// axis 0, one half per consumer warpgroup, walking 64-, 96- or 112-key boxes): its steps
// times the key box's size, over the whole problem (a 96-key step is 1.5 64-key ones: the
// products scale with the keys, the per-step waits amortize over more of them). Per axis
// and dilation group, each query box's union in key boxes (exact at the borders, with stride
// and causality: query_window); along axis 0 per half, the boxes of the CTA's walk that the
// half sees (the others it only releases: seen_steps). At head dims up to 64, where each
// half is a CTA of its own, a half walks its own union from where it starts (narrow_to_half,
// sm90/tiles.cuh): counted so in 2-D, where it is what makes 32x4 / 7x16 the pair of windows
// of 10 to 13 (mid-2d: 2.65x the window against 16x8 / 4x24's 2.77x; from the box's start
// 2.90x); not in 3-D, where the 3-D pairs were chosen by the box's walk as measured and the
// own walk's gain in the dQ pass can come with none in the dK/dV pass (8x64x64 3x11x11:
// 4x4x8 / 2x4x8 at 0.94x the first pair's dQ steps, 1.21x its dK/dV steps;
// benchmarks/pair_steps.py --own-walk). The walk is a product of per-axis
// ranges, so the per-axis sums multiply. The dK/dV pass walks the same boxes with the roles
// swapped; its count differs where boxes are deep along axis 0 or grids small (8x2x8 / 2x4x8
// on 16x32x32 5x7x7: 0.70x the first pair's dQ steps, 0.90x its dK/dV steps; benchmarks/
// pair_steps.py --passes counts both).
double backward_steps(const nattn::Params& p, const nattn::KernelEntry& e, int head_dim) {
  const bool own_halves = NATTN_SM90_SPLIT_OWN_WALK && head_dim <= 64 && p.na_dim == 2;
  double steps = 1;
  for (int a = 0; a < p.na_dim; ++a) {
    const int d = p.dilation[a], k = p.kernel[a], s = p.stride[a], qb = e.qbox[a], kb = e.kbox[a];
    steps *= kb;
    const bool c = p.causal[a] != 0;
    int64_t sum = 0;
    for (int g = 0; g < d; ++g) {
      const int len = group_len(p.spatial[a], g, d);
      for (int q0 = 0; q0 < len; q0 += qb) {
        const int lo = query_window(q0, len, k, s, c).start;
        const int parts = a == 0 ? 2 : 1;  // axis 0: the two warpgroups' halves
        for (int h = 0; h < parts; ++h) {
          const int first = q0 + h * qb / parts, last = nattn_min(first + qb / parts, len) - 1;
          if (first > last) continue;
          const AxisRange wf = query_window(first, len, k, s, c), wl = query_window(last, len, k, s, c);
          const int start = own_halves && a == 0 ? wf.start : lo;  // where the half's walk starts
          sum += (wl.start + wl.count - 1 - start) / kb - (wf.start - start) / kb + 1;
        }
      }
    }
    steps *= double(sum);
  }
  return steps;
}

// A backward pair other than its NA dim's first (2-D's 16x8 / 8x8, 3-D's 4x4x8 / 2x4x8) runs
// when its passes walk at most this share of the first pair's steps (backward_steps), per NA
// dim (1-D has one pair). In 2-D the square pair also straddles fewer window edges (fewer
// masked steps), so it wins from 0.96-0.97x the steps on large windows (H200, backward alone:
// FLUX's 80x80 at 0.96x 4% faster, 192x192 80x80 6%, 90x160 33x33 4%, 256x256 64x64 2%;
// PERF.md thirty-seventh session); in 3-D the counts were checked up to 0.95x.
constexpr double kSm90BackwardTileGain[3] = {1.0, 0.97, 0.95};

// A box pair with 96-token column boxes (16x8 / 4x24): its backward passes have no RPB paths
// (sm90/kernels.cuh declines an RPB). (The strip and square pairs' key boxes are window
// unions, with RPB paths.)
bool wide_column_box(int na_dim, const nattn::KernelEntry& e) {
  return !nattn::sm90::is_strip_pair(na_dim, e.qbox, e.kbox) && !nattn::sm90::is_square_pair(na_dim, e.qbox, e.kbox) &&
         e.kbox[0] * e.kbox[1] * e.kbox[2] > 64;
}

// The Hopper entry for a backward: the call's / NATTN_SM90_TILE's pair when it has a backward
// (a forced forward-only pair leaves the backward on the default, so forcing a pair never
// makes training fail; a strip or square pair runs its own, which declines what its forward
// declines),
// else the first pair of SM90_BACKWARD_TILES for this NA dim, or another
// that walks at least 3% (2-D) / 5% (3-D) fewer steps (backward_steps; head dims up to 128).
const nattn::KernelEntry* find_sm90_backward(const nattn::Params& p, int dim, const char** why) {
  const char* forced = getenv("NATTN_SM90_TILE");
  if (tile_requested(p)) forced = nullptr;  // the call's pair decides (below)
  if (!tile_requested(p) && !(forced && *forced) && strips_by_default())
    if (const nattn::KernelEntry* e = strip_pair_for(p, dim)) return e;
  if (!tile_requested(p) && !(forced && *forced) && squares_by_default())
    if (const nattn::KernelEntry* e = square_pair_for(p, dim)) return e;
  const nattn::KernelEntry* pairs[8];
  int n = 0;
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i) {
    const nattn::KernelEntry& e = *all.e[i];
    if (!sm90_entry_for(e, p, dim) || !e.backward) continue;
    // The pairs with 96-token column boxes have no RPB paths (sm90/kernels.cuh declines it):
    // named with an RPB, the backward stays on the default as for a forward-only pair.
    if (p.rpb && wide_column_box(p.na_dim, e)) continue;
    if (tile_requested(p) && is_requested_tile(p, e)) return &e;
    if (forced && *forced && is_forced_tile(e, p.na_dim, forced)) return &e;
    // The strip and square pairs' backward (backward_dq_strips.cuh, backward_dkv_strips.cuh;
    // backward_dq_squares.cuh and the tensor-core dK/dV pass) runs when named or by their
    // own rules (strips_by_default, squares_by_default, above).
    if (nattn::sm90::is_strip_pair(p.na_dim, e.qbox, e.kbox) || nattn::sm90::is_square_pair(p.na_dim, e.qbox, e.kbox))
      continue;
    if (e.unverified) continue;  // (kernel_table.SM90_UNVERIFIED_TILES: named only, above)
    if (n < 8) pairs[n++] = &e;
  }
  if (n == 0) {
    *why = "no compiled sm90 backward for this dtype, NA dim and head dim";
    return nullptr;
  }
  // (1-D: no count, whatever the sequence's length; head dim 256's wide passes walk the
  // 64-token box on both sides, which the count does not model: the first pair there)
  if (n == 1 || dim > kTcMaxHeadDim) return pairs[0];
  const double first_steps = backward_steps(p, *pairs[0], dim);
  const nattn::KernelEntry* best = pairs[0];
  double best_steps = first_steps;
  for (int i = 1; i < n; ++i) {
    const double steps = backward_steps(p, *pairs[i], dim);
    if (steps < best_steps) best = pairs[i], best_steps = steps;
  }
  return best_steps <= kSm90BackwardTileGain[p.na_dim - 1] * first_steps ? best : pairs[0];
}

// Split-KV by default (a call that leaves kv_splits at 0): a forward whose 128-query boxes
// fill at most half the GPU, with a window of at least kSplitMinWindow keys, runs the Hopper
// family with kDefaultSplits CTAs per box. Measured on the H200 (PERF.md seventh and eighth
// sessions, GPU time): 1-D 4096 tokens, window 2048, B=1, H=2 (64 CTAs) 0.031 vs 0.039 ms
// unsplit; 3-D 8x16x16, window 7x7x7, B=1, H=4 (64 CTAs) 0.041 vs 0.063 ms on the
// tensor-core family; kv=4 was slower than kv=2 on both, and with B=4 (256 CTAs) splitting
// lost 1.7x (kDefaultSplits: sm90_dispatch.h). A split call that the family declines runs unsplit.
constexpr int64_t kSplitMinWindow = 128;
bool split_by_default(const nattn::Params& p, int device) {
  if (window_keys(p) < kSplitMinWindow || p.dim != p.dim_v || p.dim > kTcMaxHeadDim) return false;
  const int64_t ctas = (p.tokens + 127) / 128 * p.heads * p.batch;
  const int sms = device_sms(device);
  return sms > 0 && ctas * kDefaultSplits <= sms;
}

// 1-D at dilation above 2 (twenty-eighth session, PERF.md call 2, with 128-key boxes in
// pieces; from dilation 5 even 64-key boxes go in pieces), tc vs sm90, GPU ms fwd / f+b:
// 32768 tokens D128 w512 d8 0.761 / 2.56 vs 0.724 / 2.19, D64 w1024 d3 0.718 / 2.45 vs
// 0.359 / 1.10 (0.294 forward on the 64-key pair, call 4); 16384 tokens D64 w257 d5 0.218 /
// 0.781 vs 0.272 / 0.874. Windows whose every key box goes in pieces (dilation 5 and up at
// head dims <= 64) run sm90 from this many keys per unit of dilation; at dilation 3-4 the
// 64-key pair avoids pieces and the rules without dilation apply (thirty-fifth session,
// dispatch_sweep.py: 155581 tokens B1 H4 D64 w212 dilation 4, sm90 0.359 / 0.851 vs tc 0.409
// / 1.093 ms, forward / backward alone).
constexpr int64_t kSm90MinWindow1dPerDilation = 64;
// Thirtieth session (PERF.md call 5; 16384 tokens B2 H8, forward, GPU ms, sm90 vs tc): below
// 128 keys in 1-D the 64-query pair wins where its union fits one 128-key box (D64 w33 0.061
// vs 0.070, w65 0.061 vs 0.089; with an RPB 0.068 vs 0.074 and 0.069 vs 0.096) and loses or
// ties beyond (w97 0.115 vs 0.110, with an RPB 0.139 vs 0.118); at head dim 128 sm90 wins
// from 65 keys (w65 0.131 vs 0.172, w127 0.143 vs 0.247) and at head dim 32 tc (w127 0.077
// vs 0.100).
// (At head dim 128: kSm90MinWindow1dHead128.)
constexpr int64_t kSm90OneBoxKeys1d = 128;

// Below kSm90MinWindow in 1-D (any RPB) at head dims <= 64: the rule above.
bool sm90_small_1d(const nattn::Params& p, int64_t head_dim) {
  if (head_dim <= kSm90SmallHeadDim) return false;
  const nattn::KernelEntry* e = default_sm90(p, int(head_dim));
  return e && walked_keys(p, *e) <= kSm90OneBoxKeys1d;
}

// Keys a pair's boxes walk per query, times the query rows they cover, over the window's
// keys (kSm90MaxWalkRatio); no pair: infinity.
double walk_ratio(const nattn::Params& p, const nattn::KernelEntry* e) {
  if (!e) return 1e30;
  return walked_keys(p, *e) * query_box_padding(p, *e) / double(window_keys(p));
}

// The forward's, with its default pair.
double sm90_walk_ratio(const nattn::Params& p, int head_dim) { return walk_ratio(p, default_sm90(p, head_dim)); }

// The backward's, with its pair (the dQ pass's boxes; the dK/dV pass walks as many queries
// per key on the same boxes, the roles swapped): kSm90MaxBackwardWalkRatio3d.
double sm90_backward_walk_ratio(const nattn::Params& p, int head_dim) {
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i)
    if (all.e[i]->backward && sm90_entry_for(*all.e[i], p, head_dim)) return walk_ratio(p, all.e[i]);
  return 1e30;
}

// No stride or causal axis, and (unless `dilated` may be) no dilation: the windows
// kSm90MinWindowBackward2dPlain and its neighbours were measured on.
bool plain_window(const nattn::Params& p, bool dilated = false) {
  for (int a = 0; a < p.na_dim; ++a)
    if ((p.dilation[a] != 1 && !dilated) || p.stride[a] != 1 || p.causal[a]) return false;
  return true;
}

// A 2-D forward with an RPB below tc_rpb_max_window that runs sm90 anyway (the measurements
// above kSm90MaxWalkRatioRpb2d): at head dims 33-64 by the walk ratio, at 32 where every
// window spans its whole dilation group (the kernel covers the longest group, group 0, along
// each axis) and no axis is strided or causal.
bool sm90_rpb_small_window_2d(const nattn::Params& p, int64_t head_dim) {
  if (p.na_dim != 2 || head_dim > 64) return false;
  if (head_dim > kSm90SmallHeadDim) return sm90_walk_ratio(p, int(head_dim)) <= kSm90MaxWalkRatioRpb2d;
  if (!plain_window(p, true)) return false;
  for (int a = 0; a < 2; ++a)
    if (p.kernel[a] < group_len(p.spatial[a], 0, p.dilation[a])) return false;
  return true;
}

// The backward's minimum window at head dims 33-64 on the windows these rules were measured
// on (no stride or causal axis): 2-D from kSm90MinWindowBackward2dPlain keys without
// dilation, kSm90MinWindowBackward2dDilated with; 1-D from kSm90MinWindowBackward1dPlain
// without. 0: none (the general minimum decides).
int64_t sm90_min_window_backward_plain(const nattn::Params& p, int64_t head_dim) {
  if (head_dim <= kSm90SmallHeadDim || !plain_window(p, true)) return 0;
  const bool dilated = !plain_window(p);
  if (p.na_dim == 2) return dilated ? kSm90MinWindowBackward2dDilated : kSm90MinWindowBackward2dPlain;
  return p.na_dim == 1 && !dilated ? kSm90MinWindowBackward1dPlain : 0;
}

// Whether the backward of this problem runs a pair with 96-token column boxes.
bool backward_runs_wide_box(const nattn::Params& p, int head_dim) {
  const char* why = nullptr;
  const nattn::KernelEntry* e = find_sm90_backward(p, head_dim, &why);
  return e && wide_column_box(p.na_dim, *e);
}

// Head dims 65-128 (kSm90WideHeadDim): the rules measured there.
bool sm90_preferred_wide(const nattn::Params& p, int64_t window, int head_dim, bool backward) {
  const int nd = p.na_dim;
  if (backward && nd == 3 && !p.rpb) return sm90_backward_walk_ratio(p, head_dim) <= kSm90MaxBackwardWalkRatio3d[2];
  if (backward) return window >= (p.rpb ? kSm90MinWindowBackwardRpbHead128 : kSm90MinWindowBackwardHead128)[nd - 1];
  if (nd == 1) return window >= (p.rpb ? kSm90MinWindow1dHead128Rpb : kSm90MinWindow1dHead128);
  if (p.rpb) return window > tc_rpb_max_window(nd, head_dim) && window >= kSm90MinWindow[nd - 1];
  if (window < kSm90MinWindow[nd - 1]) return sm90_walk_ratio(p, head_dim) <= kSm90MaxWalkRatioHead128[nd - 2];
  return true;
}

bool sm90_preferred(const nattn::Params& p, bool backward) {
  if (strips_by_default() && strip_pair_for(p, p.dim > p.dim_v ? p.dim : p.dim_v)) return true;
  if (squares_by_default() && square_pair_for(p, p.dim > p.dim_v ? p.dim : p.dim_v)) return true;
  const int64_t window = window_keys(p);
  if (p.dim > kTcMaxHeadDim || p.dim_v > kTcMaxHeadDim) return true;
  const int64_t head_dim = p.dim > p.dim_v ? p.dim : p.dim_v;
  if (head_dim > kSm90WideHeadDim) return sm90_preferred_wide(p, window, int(head_dim), backward);
  const bool pieces_only = p.na_dim == 1 && nattn::sm90::box_pieces(64, p.dilation[0]) > 1;
  if (pieces_only && window < kSm90MinWindow1dPerDilation * p.dilation[0]) return false;
  if (!backward && p.na_dim == 1 && window < kSm90MinWindow[0]) return sm90_small_1d(p, head_dim);
  if (!backward && p.rpb && window <= tc_rpb_max_window(p.na_dim, head_dim)) return sm90_rpb_small_window_2d(p, head_dim);
  if (backward && p.rpb && window < kSm90MinWindowBackwardRpb[p.na_dim - 1]) return false;
  if (backward && p.na_dim == 3 && !p.rpb)
    return sm90_backward_walk_ratio(p, int(head_dim)) <= kSm90MaxBackwardWalkRatio3d[head_dim > kSm90SmallHeadDim];
  const bool by_walk = p.na_dim == 3 || (p.na_dim == 2 && window < kSm90MinWindow[1]);
  if (!backward && by_walk && !p.rpb)
    return sm90_walk_ratio(p, int(head_dim)) <= kSm90MaxWalkRatio[p.na_dim - 2][head_dim > kSm90SmallHeadDim];
  if (backward && p.na_dim == 2 && head_dim <= kSm90BackwardSmallHeadDim[1] && window >= kSm90MinWindowBackwardWideBox &&
      backward_runs_wide_box(p, int(head_dim)))
    return true;
  if (backward) {
    const int64_t plain = sm90_min_window_backward_plain(p, head_dim);
    if (plain && window >= plain) return true;
  }
  if (backward) return window >= sm90_min_window_backward(p.na_dim, head_dim);
  return window >= kSm90MinWindow[p.na_dim - 1];
}

// Why the Hopper family would decline a forward with this tile pair before any driver
// call (head dims, the tensor maps' shapes), or nullptr.
const char* sm90_pair_declines(const nattn::Params& p, const nattn::KernelEntry& e) {
  if (p.dim != e.head_dim || p.dim_v != e.head_dim) return "head dims must both equal the instance's";
  int kbox[3] = {e.kbox[0], e.kbox[1], e.kbox[2]};  // the key maps' box (prepare_forward's)
  if (nattn::sm90::is_strip_pair(p.na_dim, e.qbox, e.kbox)) {
    if (const char* why = nattn::sm90::strip_declines(p, e.qbox, e.kbox)) return why;
    nattn::sm90::strip_key_map_box(p.na_dim, kbox);
  }
  if (nattn::sm90::is_square_pair(p.na_dim, e.qbox, e.kbox)) {
    if (const char* why = nattn::sm90::square_declines(p)) return why;
    nattn::sm90::square_key_map_box(kbox);
  }
  if (!sm90_pair_fits(p, e)) return "an RPB table above 4096 entries per head needs a 128-query tile pair";
  nattn::sm90::MapSpec m;
  const char* why = nattn::sm90::map_spec(p, p.q_s, p.heads, e.head_dim, e.qbox, m);
  if (!why) why = nattn::sm90::map_spec(p, p.k_s, p.heads_kv, e.head_dim, kbox, m);
  if (!why) why = nattn::sm90::map_spec(p, p.v_s, p.heads_kv, e.head_dim, kbox, m);
  return why;
}

}  }  // namespace nattn::host

using namespace nattn::host;

// The smallest window (keys) from which an NA forward of this dimension runs the Hopper
// family when it can (Python's dispatch orders backends with it).
NATTN_API int64_t nattn_sm90_min_window(int64_t na_dim) {
  return na_dim >= 1 && na_dim <= 3 ? kSm90MinWindow[na_dim - 1] : -1;
}

// The same for a head dim (D == D_v): head dims above 128 at any window. (At head dims
// <= 64 smaller 2-D windows run it too where its boxes fit them, and 3-D windows only
// there: kSm90MaxWalkRatio.)
NATTN_API int64_t nattn_sm90_min_window_head(int64_t na_dim, int64_t head_dim) {
  if (na_dim >= 1 && na_dim <= 3 && head_dim > kTcMaxHeadDim) return 1;
  return nattn_sm90_min_window(na_dim);
}

// The same for the backward.
NATTN_API int64_t nattn_sm90_min_window_backward(int64_t na_dim) {
  return na_dim >= 1 && na_dim <= 3 ? kSm90MinWindowBackward[na_dim - 1] : -1;
}

// The backward's for a head dim (D == D_v) without an RPB: 2-D at head dims <= 32 and 3-D at
// <= 64 start later (kSm90MinWindowBackwardSmallHead: 500 / 400 keys), head dim 128 earlier
// (kSm90MinWindowBackwardHead128). In 3-D the backward pair's walk ratio decides
// (kSm90MaxBackwardWalkRatio3d): a typical window, not a bound there.
NATTN_API int64_t nattn_sm90_min_window_backward_head(int64_t na_dim, int64_t head_dim) {
  if (na_dim >= 1 && na_dim <= 3 && head_dim > kTcMaxHeadDim) return 1;
  return na_dim >= 1 && na_dim <= 3 ? sm90_min_window_backward(int(na_dim), head_dim) : -1;
}

// Whether this build has the Hopper family's backward for a dtype code, NA dim and head dim
// (Python's dispatch sends training calls to cuda only then).
NATTN_API int64_t nattn_sm90_has_backward(int64_t dtype, int64_t na_dim, int64_t head_dim) {
  const Sm90Entries all = sm90_entries();
  for (int i = 0; i < all.n; ++i) {
    const nattn::KernelEntry& e = *all.e[i];
    if (e.dtype == dtype && e.na_dim == na_dim && e.head_dim == head_dim && e.backward) return 1;
  }
  return 0;
}
