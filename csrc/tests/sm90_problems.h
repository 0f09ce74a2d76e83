// The Hopper host checks' random problems: 1-3 axes, every kernel size up to 40 (1-D) or 9,
// dilation 1-4, any stride, causal axes, every query (no query range). Include after
// host_rng.h (rnd) and nattn/sm90/tiles.cuh (Params).
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
