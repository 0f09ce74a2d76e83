// Host-side check of the unfused window ops (nattn/window/kernels.cuh) on the CPU, no GPU:
// random problems (1-3 axes, odd/even kernels, stride, dilation, causal axes, GQA), float
// data, every output element from the kernels' per-element functions against a brute-force
// version written from docs/semantics.md (each query's window per axis, scattered for the
// inverse). Prints "ok <checks>" or the first mismatch (exit code 1).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "nattn/window/kernels.cuh"

using namespace nattn::window;

#define NATTN_CHECK_SEED 0x9e3779b97f4a7c15ull
#include "host_rng.h"
static float rndf() { return float(rnd(-1000, 1000)) / 1000.f; }

// docs/semantics.md, one axis, group coordinates: the key in slot t of query ig's window,
// or -1 when a causal window does not hold that slot. Written out independently of
// slot_base: the window is k keys centred on the leader of the query's stride block,
// shifted inward at the group's borders; a causal window ends at the block's last query
// and holds no key after the query itself.
static int ref_slot(int ig, int t, int len_g, int k, int s, bool causal) {
  const int block = (ig / s) * s;
  if (causal) {
    int leader = block + s - 1;
    if (leader > len_g - 1) leader = len_g - 1;
    const int key = leader - (k - 1) + t;
    return (key < 0 || key > ig) ? -1 : key;
  }
  int leader = block + s / 2;
  if (leader > len_g - 1) leader = len_g - 1;
  int start = leader - k / 2;
  if (start + k > len_g) start = len_g - k;
  if (start < 0) start = 0;
  return start + t;
}

// f(b, i, h, w, j) for every batch, query, head and slot w whose window holds key j.
template <typename F>
static void for_each_pair(const WindowParams& p, const std::vector<int64_t>& key, F f) {
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.tokens; ++i)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t w = 0; w < p.window; ++w)
          if (key[i * p.window + w] >= 0) f(b, i, h, w, key[i * p.window + w]);
}

#define CHECK(cond, ...) do { ++checks; if (!(cond)) { printf(__VA_ARGS__); printf("\n"); return 1; } } while (0)

template <int NA>
static int check_problem(long long& checks) {
  WindowParams p = {};
  p.na_dim = NA;
  p.batch = rnd(1, 2);
  p.heads_kv = rnd(1, 2);
  p.groups = rnd(1, 3);
  p.heads = p.heads_kv * p.groups;
  p.dim = 8 * rnd(1, 2);
  p.tokens = 1;
  p.window = 1;
  for (int a = 0; a < 3; ++a) {
    p.spatial[a] = p.kernel[a] = p.stride[a] = p.dilation[a] = 1;
    p.causal[a] = 0;
  }
  for (int a = 0; a < NA; ++a) {
    p.kernel[a] = rnd(1, NA == 1 ? 9 : 4);
    p.dilation[a] = rnd(1, 3);
    p.spatial[a] = p.kernel[a] * p.dilation[a] + rnd(0, NA == 3 ? 4 : 9);
    p.stride[a] = rnd(1, p.kernel[a]);
    p.causal[a] = rnd(0, 3) == 0;
    p.tokens *= p.spatial[a];
    p.window *= p.kernel[a];
  }
  const int64_t n = p.tokens, H = p.heads, Hk = p.heads_kv, D = p.dim, W = p.window;
  std::vector<float> q(p.batch * n * H * D), k(p.batch * n * Hk * D), wts(p.batch * n * H * W);
  for (float& x : q) x = rndf();
  for (float& x : k) x = rndf();
  for (float& x : wts) x = rndf();

  // the window key of every (query, slot), -1 where the window does not hold it
  std::vector<int64_t> key(n * W);
  for (int64_t i = 0; i < n; ++i) {
    int c[3] = {0, 0, 0};
    int64_t rest = i;
    for (int a = NA - 1; a >= 0; --a) { c[a] = int(rest % p.spatial[a]); rest /= p.spatial[a]; }
    for (int64_t w = 0; w < W; ++w) {
      int t[3] = {0, 0, 0};
      int64_t wr = w;
      for (int a = NA - 1; a >= 0; --a) { t[a] = int(wr % p.kernel[a]); wr /= p.kernel[a]; }
      int64_t j = 0;
      for (int a = 0; a < NA && j >= 0; ++a) {
        const int d = p.dilation[a], g = c[a] % d, len_g = (p.spatial[a] - g + d - 1) / d;
        const int kg = ref_slot(c[a] / d, t[a], len_g, p.kernel[a], p.stride[a], p.causal[a] != 0);
        j = kg < 0 ? -1 : j * p.spatial[a] + (int64_t(kg) * d + g);
      }
      key[i * W + w] = j;
    }
  }

  for (int neg = 0; neg < 2; ++neg) {  // kDot: q . k per slot
    std::vector<float> out(p.batch * n * H * W);
    p.op = kDot; p.neg_inf = neg; p.a = q.data(); p.b = k.data(); p.out = out.data();
    for (int64_t e = 0; e < num_elements(p); ++e) dot_element<float, NA>(p, e);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w) {
            const int64_t j = key[i * W + w];
            const float got = out[((b * n + i) * H + h) * W + w];
            if (j < 0) {
              CHECK(neg ? (isinf(got) && got < 0) : got == 0.f, "dot: slot %lld of query %lld should be %s, got %g",
                    (long long)w, (long long)i, neg ? "-inf" : "0", got);
              continue;
            }
            float want = 0.f;
            for (int64_t c = 0; c < D; ++c) want += q[((b * n + i) * H + h) * D + c] * k[((b * n + j) * Hk + h / p.groups) * D + c];
            CHECK(fabsf(got - want) <= 1e-4f * (1.f + fabsf(want)), "dot: query %lld slot %lld head %lld: %g vs %g",
                  (long long)i, (long long)w, (long long)h, got, want);
          }
  }
  {  // kSum: sum_w wts * k
    std::vector<float> out(p.batch * n * H * D), want(p.batch * n * H * D, 0.f);
    p.op = kSum; p.a = wts.data(); p.b = k.data(); p.out = out.data();
    for (int64_t e = 0; e < num_elements(p); ++e) sum_element<float, NA>(p, e);
    for_each_pair(p, key, [&](int64_t b, int64_t i, int64_t h, int64_t w, int64_t j) {
      for (int64_t c = 0; c < D; ++c)
        want[((b * n + i) * H + h) * D + c] += wts[((b * n + i) * H + h) * W + w] * k[((b * n + j) * Hk + h / p.groups) * D + c];
    });
    for (size_t e = 0; e < out.size(); ++e)
      CHECK(fabsf(out[e] - want[e]) <= 1e-4f * (1.f + fabsf(want[e])), "sum: element %zu: %g vs %g", e, out[e], want[e]);
  }
  {  // kInverseSum: scatter wts * q onto the window keys, summed over each KV head's group
    std::vector<float> out(p.batch * n * Hk * D), want(p.batch * n * Hk * D, 0.f);
    p.op = kInverseSum; p.a = wts.data(); p.b = q.data(); p.out = out.data();
    for (int64_t e = 0; e < num_elements(p); ++e) inverse_sum_element<float, NA>(p, e);
    for_each_pair(p, key, [&](int64_t b, int64_t i, int64_t h, int64_t w, int64_t j) {
      for (int64_t c = 0; c < D; ++c)
        want[((b * n + j) * Hk + h / p.groups) * D + c] += wts[((b * n + i) * H + h) * W + w] * q[((b * n + i) * H + h) * D + c];
    });
    for (size_t e = 0; e < out.size(); ++e)
      CHECK(fabsf(out[e] - want[e]) <= 1e-4f * (1.f + fabsf(want[e])),
            "inverse sum: element %zu: %g vs %g (spatial %d,%d,%d kernel %d,%d,%d stride %d,%d,%d dil %d,%d,%d causal %d,%d,%d)",
            e, out[e], want[e], p.spatial[0], p.spatial[1], p.spatial[2], p.kernel[0], p.kernel[1], p.kernel[2],
            p.stride[0], p.stride[1], p.stride[2], p.dilation[0], p.dilation[1], p.dilation[2],
            p.causal[0], p.causal[1], p.causal[2]);
  }
  return 0;
}

int main() {
  long long checks = 0;
  for (int it = 0; it < 150; ++it) {
    if (check_problem<1>(checks) || check_problem<2>(checks) || check_problem<3>(checks)) return 1;
  }
  printf("ok %lld\n", checks);
  return 0;
}
