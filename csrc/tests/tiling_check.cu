// Host-side check of the tensor-core family's walk (common/tiling.cuh), no GPU needed:
// for random problems and box shapes, replays what every warp does (its box, its rows'
// tokens and windows, the union's packed 16-token chunks, the lanes' copy and column
// cursors, the per-element mask) and
// checks that each real token is served by exactly one warp row, that the keys a query row
// keeps are exactly its docs/semantics.md window (the queries a key row keeps: exactly its
// inverse neighbourhood), each once, and that the line offsets, token indices and RPB
// indices the kernels use match direct formulas. Prints "ok <checks>" or the first mismatch.
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "nattn/common/tiling.cuh"

using namespace nattn;
using namespace nattn::tiling;

#define NATTN_CHECK_SEED 0x9e3779b97f4a7c15ull
#include "host_rng.h"

static long long checks = 0;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    ++checks;                                              \
    if (!(cond)) {                                         \
      printf("mismatch at %s:%d: ", __FILE__, __LINE__);   \
      printf(__VA_ARGS__);                                 \
      printf("\n");                                        \
      exit(1);                                             \
    }                                                      \
  } while (0)

constexpr int kChunk = 16;  // tc::CW
constexpr int kRows = 16;   // tc::QW

// Brute force, one axis, token coordinates: is key j in the window of query i?
static bool axis_has(const Params& p, int a, int i, int j) {
  const int d = p.dilation[a];
  if (i % d != j % d) return false;
  const int L = group_len(p.spatial[a], i % d, d);
  const AxisRange w = query_window(i / d, L, p.kernel[a], p.stride[a], p.causal[a] != 0);
  return j / d >= w.start && j / d < w.start + w.count;
}

static void coords(const Params& p, long long t, int* c) {
  for (int a = p.na_dim - 1; a >= 0; --a) { c[a] = int(t % p.spatial[a]); t /= p.spatial[a]; }
}

// The packed walk's token f of a union, by divisions (what UnionIndex finds by multiply-highs).
template <int NA>
static void check_coords(const AxisRange* u, int f, const int* c) {
  for (int a = NA - 1; a >= 0; --a) {
    CHECK(c[a] == u[a].start + f % u[a].count, "union index axis %d at %d, want %d", a, c[a], u[a].start + f % u[a].count);
    f /= u[a].count;
  }
}

// The kernels' staging: per chunk, lane l finds chunk token l % 16 (past the union: its last
// token, a valid address) and its offset in one of two tensors of different strides (lanes
// 0-15 the first, 16-31 the second: K and V) and its token index (the LSE/delta rows of the
// inverse walk).
template <int NA>
static void check_staging(const Params& p, const AxisRange* u, const int* g, const int64_t* s) {
  const int size = union_size<NA>(u), chunks = (size + kChunk - 1) / kChunk;
  const UnionIndex<NA> ui(u);
  int64_t s2[5] = {0, 0, 0, 0, 0}, s3[5] = {0, 0, 0, 0, 0};
  for (int a = 0; a < NA; ++a) s2[1 + a] = s[1 + a] * 3 + 7 * (a + 1);  // a strided view
  for (int a = 0; a < NA; ++a) s3[1 + a] = s[1 + a] * 24;  // a [N, H, D] tensor: rows of 24
  CHECK(has_token_rows(p, s) && has_token_rows(p, s3), "token-major tensors must have token rows");
  CHECK(NA == 1 || !has_token_rows(p, s2), "a strided view must not have token rows");
  // rows of 2^31 elements or more: the walks' 32-bit row-stride multiply would overflow
  int64_t s4[5] = {0, 0, 0, 0, 0};
  for (int a = 0; a < NA; ++a) s4[1 + a] = s[1 + a] * (int64_t(1) << 31);
  CHECK(!has_token_rows(p, s4), "a row stride of 2^31 must not give token rows");
  for (int lane = 0; lane < 32; ++lane) {
    const GroupStrides<NA> st[2] = {GroupStrides<NA>(p, s, g, s2, lane >= kChunk), GroupStrides<NA>(p, s, g)};
    const GroupStrides<NA> direct(p, lane >= kChunk ? s2 : s, g);
    for (int ci = 0; ci < chunks; ++ci) {
      const int f = ci * kChunk + lane % kChunk, fc = nattn_min(f, size - 1);
      int c[3];
      ui.coords(fc, c);
      for (int a = 0; a < NA; ++a)  // even past the union's end: its addresses stay valid
        CHECK(unsigned(c[a] - u[a].start) < unsigned(u[a].count), "staged token left the union at %d", f);
      check_coords<NA>(u, fc, c);
      CHECK(st[0].at(c) == direct.at(c), "staging offset wrong at %d (lane %d)", f, lane);
      CHECK(st[1].at(c) == token_index<NA>(p, c, g), "staging token index wrong at %d", f);
      // the token-rows path: the index in 32 bits, times the row stride of a tensor with rows
      const int t = TokenIndex<NA>(p, g).at(p, c);
      CHECK(t == token_index<NA>(p, c, g), "TokenIndex %d at %d, want %lld", t, f, (long long)token_index<NA>(p, c, g));
      for (const int64_t* x : {s, (const int64_t*)s2, (const int64_t*)s3})
        if (has_token_rows(p, x)) CHECK(int64_t(t) * x[NA] == GroupStrides<NA>(p, x, g).at(c), "token-row offset at %d", f);
    }
  }
}

// FixedDivisor against division, exhaustively over the divisors and numerators the walk meets.
static void check_divisor() {
  for (int n = 1; n <= 2100; ++n) {
    const FixedDivisor d(n);
    const int top = n <= 64 ? (1 << 20) : (1 << 16);
    for (int x = 0; x < top; x += (x < 4096 ? 1 : 7)) CHECK(int(d.div(unsigned(x))) == x / n, "%d / %d", x, n);
  }
}

template <int NA, bool kInverse>
static void check_problem(const Params& p, const int* box) {
  const long long N = p.tokens;
  std::vector<int> served(N, 0);
  std::vector<int> seen(N);  // per row: how often each partner token was kept
  int64_t s[5] = {0, 0, 0, 0, 0};  // token-major strides (elements) of a [N] tensor, 1 channel
  {
    int64_t m = 1;
    for (int a = NA - 1; a >= 0; --a) { s[1 + a] = m; m *= p.spatial[a]; }
  }
  int rmult[3];
  rpb_mults<NA>(p, rmult);
  const int64_t warps = num_warps<NA>(p, box);
  for (int64_t w = 0; w < warps; ++w) {
    int g[3], L[3], first[3];
    if (!warp_box<NA>(p, box, w, g, L, first)) continue;
    AxisRange u[3];
    box_union<NA, kInverse>(p, box, first, L, u);
    const int size = union_size<NA>(u), chunks = (size + kChunk - 1) / kChunk;
    check_staging<NA>(p, u, g, s);
    for (int r = 0; r < kRows; ++r) {
      int ig[3];
      if (!lane_token<NA>(box, r, first, L, ig)) continue;
      AxisRange win[3];
      for (int a = 0; a < NA; ++a)
        win[a] = kInverse ? key_inverse(ig[a], L[a], p.kernel[a], p.stride[a], p.causal[a] != 0)
                          : query_window(ig[a], L[a], p.kernel[a], p.stride[a], p.causal[a] != 0);
      const long long me = token_index<NA>(p, ig, g);
      served[me] += 1;
      CHECK(spatial_offset<NA>(p, s, ig, g) == me, "spatial_offset != token index");
      std::fill(seen.begin(), seen.end(), 0);
      const int rrow = rpb_row_part<NA, kInverse>(p, ig, rmult);
      const GroupStrides<NA> ts(p, s, g);
      // the kernels' column walk: lane class tq holds chunk columns col(q, tq), q = 0..3
      const UnionIndex<NA> ui(u);
      for (int tq = 0; tq < 4; ++tq) {
        for (int ci = 0; ci < chunks; ++ci)
          for (int q = 0; q < 4; ++q) {
            const int j = (q >> 1) * 8 + 2 * tq + (q & 1), f = ci * kChunk + j;
            int c[3];
            ui.coords(f, c);
            if (f < size) check_coords<NA>(u, f, c);
            const bool ok = f < size && in_window<NA>(win, c);
            const int col_rpb = rpb_dot<NA>(c, rmult);
            if (!ok) continue;
            const long long other = ts.at(c);
            CHECK(other >= 0 && other < N, "partner token %lld out of range", other);
            seen[other] += 1;
            // RPB index as the kernels form it, against the direct formula (key - query + k - 1)
            int qc[3], kk[3], mcrd[3], oc[3];
            coords(p, me, mcrd);
            coords(p, other, oc);
            for (int a = 0; a < NA; ++a) {
              qc[a] = (kInverse ? oc[a] : mcrd[a]) / p.dilation[a];
              kk[a] = (kInverse ? mcrd[a] : oc[a]) / p.dilation[a];
            }
            int want = 0;
            for (int a = 0; a < NA; ++a) want += (kk[a] - qc[a] + p.kernel[a] - 1) * rmult[a];
            const int got = rpb_index<kInverse>(rrow, col_rpb);
            CHECK(got == want, "rpb index %d != %d", got, want);
          }
      }
      int mc[3];
      coords(p, me, mc);
      for (long long t = 0; t < N; ++t) {
        int oc[3];
        coords(p, t, oc);
        bool want = true;
        for (int a = 0; a < NA; ++a)
          want = want && (kInverse ? axis_has(p, a, oc[a], mc[a]) : axis_has(p, a, mc[a], oc[a]));
        CHECK(seen[t] == (want ? 1 : 0), "%s token %lld: partner %lld kept %d times, want %d",
              kInverse ? "key" : "query", me, t, seen[t], want ? 1 : 0);
      }
    }
  }
  for (long long t = 0; t < N; ++t) CHECK(served[t] == 1, "token %lld served %d times", t, served[t]);
}

template <int NA>
static void random_problem() {
  Params p{};
  p.na_dim = NA;
  p.tokens = 1;
  for (int a = 0; a < NA; ++a) {
    const int k = rnd(2, NA == 1 ? 40 : (NA == 2 ? 12 : 6));
    const int d = rnd(1, 3) == 3 ? rnd(2, 3) : 1;
    p.kernel[a] = k;
    p.dilation[a] = d;
    p.spatial[a] = k * d + rnd(0, NA == 1 ? 60 : 9);
    p.stride[a] = rnd(0, 2) ? 1 : rnd(1, k);
    p.causal[a] = rnd(0, 3) == 0;
    p.rpb_size[a] = 2 * k - 1;
    p.tokens *= p.spatial[a];
  }
  for (int a = NA; a < 3; ++a) { p.spatial[a] = p.kernel[a] = p.stride[a] = p.dilation[a] = p.rpb_size[a] = 1; }
  set_token_strides(p);
  int box[3];
  const int pick = rnd(0, 2);
  if (pick == 0) {
    fixed_box<NA, kRows>(box);
  } else if (pick == 1) {
    model_box(p, kRows, kChunk);
    for (int a = 0; a < 3; ++a) box[a] = p.box[a];
  } else {  // any shape of 16 tokens (powers of two per axis)
    int left = 16;
    for (int a = 0; a < NA - 1; ++a) { box[a] = 1 << rnd(0, 2); if (box[a] > left) box[a] = left; left /= box[a]; }
    box[NA - 1] = left;
    for (int a = NA; a < 3; ++a) box[a] = 1;
  }
  for (int a = 0; a < 3; ++a)  // warp_box / lane_token split token indices with shifts
    CHECK(box[a] > 0 && (box[a] & (box[a] - 1)) == 0 && (1 << box_shift(box[a])) == box[a], "box %d", box[a]);
  check_problem<NA, false>(p, box);
  check_problem<NA, true>(p, box);
}

// The opt-in box model's picks on the anchor problems (nattn/bench/problems.py), documented
// in tiling.cuh.
static void check_model_boxes() {
  struct Case { int na, sp[3], k[3], d[3], want[3]; } cases[] = {
      {2, {56, 56, 1}, {7, 7, 1}, {1, 1, 1}, {2, 8, 1}},     {2, {128, 128, 1}, {13, 13, 1}, {1, 1, 1}, {4, 4, 1}},
      {3, {16, 32, 32}, {5, 7, 7}, {1, 1, 1}, {2, 2, 4}},   {1, {32768, 1, 1}, {2048, 1, 1}, {1, 1, 1}, {16, 1, 1}},
  };
  for (const Case& c : cases) {
    Params p{};
    p.na_dim = c.na;
    for (int a = 0; a < 3; ++a) { p.spatial[a] = c.sp[a]; p.kernel[a] = c.k[a]; p.dilation[a] = c.d[a]; }
    model_box(p, kRows, kChunk);
    CHECK(p.box[0] == c.want[0] && p.box[1] == c.want[1] && p.box[2] == c.want[2],
          "model box %dx%dx%d, want %dx%dx%d", p.box[0], p.box[1], p.box[2], c.want[0], c.want[1], c.want[2]);
  }
}

int main() {
  check_model_boxes();
  check_divisor();
  for (int i = 0; i < 60; ++i) {
    random_problem<1>();
    random_problem<2>();
    random_problem<3>();
  }
  printf("ok %lld\n", checks);
  return 0;
}
