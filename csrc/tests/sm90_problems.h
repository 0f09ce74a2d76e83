// The Hopper host checks' random problems: 1-3 axes, every kernel size up to 40 (1-D) or 9,
// dilation 1-4, any stride, causal axes, every query (no query range); and the strip pairs'
// (2-D / 3-D, stride 1, windows up to 7 x 9 / 7 x 7 x 9, RPB sizes set) and the square pair's
// (2-D, stride 1, windows up to 13 x 13, RPB sizes set); queries_seeing for the dK/dV
// passes' checks. Include after host_rng.h (rnd) and nattn/sm90/tiles.cuh (Params, CtaTile).
#pragma once

template <int NA>
static nattn::Params random_problem() {
  nattn::Params p = {};
  p.na_dim = NA;
  p.tokens = 1;
  for (int a = 0; a < 3; ++a) p.spatial[a] = p.kernel[a] = p.stride[a] = p.dilation[a] = 1;
  for (int a = 0; a < NA; ++a) {
    p.kernel[a] = rnd(1, NA == 1 ? 40 : 9);
    p.dilation[a] = rnd(1, 4);
    p.spatial[a] = p.kernel[a] * p.dilation[a] + rnd(0, NA == 1 ? 400 : NA == 2 ? 40 : 12);
    p.stride[a] = rnd(1, p.kernel[a]);
    p.causal[a] = rnd(0, 3) == 0;
    p.tokens *= p.spatial[a];
  }
  for (int a = 0; a < 3; ++a) {  // every query (the forward's query range: the whole axis)
    p.q_lo[a] = 0;
    p.q_hi[a] = p.spatial[a];
  }
  return p;
}

// Within the strip pairs' limits (forward_strips.cuh): stride 1, windows up to 7 (9 on the last
// axis), dilation 1-4, grids ending in partial boxes, causal axes.
template <int NA>
static nattn::Params strip_problem() {
  nattn::Params p = {};
  p.na_dim = NA;
  p.tokens = 1;
  for (int a = 0; a < 3; ++a) p.spatial[a] = p.kernel[a] = p.stride[a] = p.dilation[a] = p.rpb_size[a] = 1;
  for (int a = 0; a < NA; ++a) {
    p.kernel[a] = rnd(1, a == NA - 1 ? 9 : 7);
    p.dilation[a] = rnd(0, 2) ? 1 : rnd(2, 4);
    p.spatial[a] = p.kernel[a] * p.dilation[a] + rnd(0, rnd(0, 1) ? 6 : NA == 2 ? 40 : 20);
    p.causal[a] = rnd(0, 3) == 0;
    p.rpb_size[a] = 2 * p.kernel[a] - 1;
    p.tokens *= p.spatial[a];
  }
  for (int a = 0; a < 3; ++a) {
    p.q_lo[a] = 0;
    p.q_hi[a] = p.spatial[a];
  }
  return p;
}

// Within the square pair's limits (forward_squares.cuh): 2-D, stride 1, windows up to 13 x 13
// (half of them 10 to 13), dilation 1-4, grids ending in partial boxes, causal axes.
static nattn::Params square_problem() {
  nattn::Params p = {};
  p.na_dim = 2;
  p.tokens = 1;
  for (int a = 0; a < 3; ++a) p.spatial[a] = p.kernel[a] = p.stride[a] = p.dilation[a] = p.rpb_size[a] = 1;
  for (int a = 0; a < 2; ++a) {
    p.kernel[a] = rnd(0, 1) ? rnd(10, 13) : rnd(1, 13);
    p.dilation[a] = rnd(0, 2) ? 1 : rnd(2, 4);
    p.spatial[a] = p.kernel[a] * p.dilation[a] + rnd(0, rnd(0, 1) ? 6 : 40);
    p.causal[a] = rnd(0, 3) == 0;
    p.rpb_size[a] = 2 * p.kernel[a] - 1;
    p.tokens *= p.spatial[a];
  }
  for (int a = 0; a < 3; ++a) {
    p.q_lo[a] = 0;
    p.q_hi[a] = p.spatial[a];
  }
  return p;
}

// Brute force: the queries of the call's range along axis a of the CTA's dilation group whose
// stride-1 windows hold key k (group coordinates), for the dK/dV passes' checks.
static int queries_seeing(const nattn::Params& p, const nattn::sm90::CtaTile& tile, int a, int k) {
  int n = 0;
  for (int qa = 0; qa < tile.len[a]; ++qa) {
    const nattn::AxisRange w = nattn::query_window(qa, tile.len[a], p.kernel[a], 1, p.causal[a] != 0);
    const int real = tile.g[a] + p.dilation[a] * qa;
    n += k >= w.start && k < w.start + w.count && real >= p.q_lo[a] && real < p.q_hi[a];
  }
  return n;
}
