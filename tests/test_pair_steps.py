"""benchmarks/pair_steps.py: the per-axis product of step counts equals a direct count over
every CTA box and warpgroup half (N-D windows enumerated query by query; the dK/dV pass's
inverse neighbourhoods by scanning every query's window), on small random problems with
stride, dilation and causal axes; and the counts the library's backward pair choice was
measured against (PERF.md, thirty-sixth and thirty-seventh sessions)."""

import importlib.util
import itertools
import math
import os
import random

import pytest

from nattn.windows import axis_window

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "pair_steps.py")
_spec = importlib.util.spec_from_file_location("pair_steps", _PATH)
pair_steps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pair_steps)


def direct_ratio(spatial, kernel, stride, dilation, causal, qbox, kbox, backward, own=False):
    """The same walk counted CTA by CTA: each query's N-D window (per-axis windows, their
    valid keys, in group coordinates), a half's union as the bounds of its queries' keys
    (``own``: along axis 0 walked from the half's first query's window, as the split CTAs)."""
    nd = len(spatial)
    axes = [axis_window(spatial[a], kernel[a], stride[a], dilation[a], causal[a]) for a in range(nd)]

    def keys_of(a, i):  # group coordinates of query i's valid keys along axis a
        key, valid, _ = axes[a]
        return [int(k) // dilation[a] for k, ok in zip(key[i].tolist(), valid[i].tolist()) if ok]

    steps = 0
    for group in itertools.product(*[range(d) for d in dilation]):
        lens = [(spatial[a] - group[a] + dilation[a] - 1) // dilation[a] for a in range(nd)]
        for origin in itertools.product(*[range(0, lens[a], qbox[a]) for a in range(nd)]):
            start = [min(keys_of(a, origin[a] * dilation[a] + group[a])) for a in range(nd)]
            parts = 2 if backward else 1
            for h in range(parts):
                first = list(origin)
                last = [min(origin[a] + qbox[a], lens[a]) - 1 for a in range(nd)]
                first[0] = origin[0] + h * qbox[0] // parts
                last[0] = min(first[0] + qbox[0] // parts, lens[0]) - 1
                if first[0] > last[0]:
                    continue
                lo, hi = [10**9] * nd, [-1] * nd
                for q in itertools.product(*[range(first[a], last[a] + 1) for a in range(nd)]):
                    for a in range(nd):
                        ks = keys_of(a, q[a] * dilation[a] + group[a])
                        lo[a], hi[a] = min(lo[a], min(ks)), max(hi[a], max(ks))
                walk = list(start)
                if own:
                    walk[0] = min(keys_of(0, first[0] * dilation[0] + group[0]))
                steps += math.prod((hi[a] - walk[a]) // kbox[a] - (lo[a] - walk[a]) // kbox[a] + 1
                                   for a in range(nd))
    rows = math.prod(qbox) // 2 if backward else math.prod(qbox)
    return steps * rows * math.prod(kbox) / (math.prod(spatial) * math.prod(kernel))


def direct_dkv_ratio(spatial, kernel, stride, dilation, causal, qbox, kbox, own=False):
    """The dK/dV pass counted CTA by CTA: per key box (the pair's 128-token box) and
    warpgroup half along axis 0, the queries that see any of its keys found by scanning every
    query's window (a query sees a box of keys iff along each axis its window meets the
    box's extent), walked in query boxes of kbox from the queries that see the box's first key
    (``own``: along axis 0 the half's first key)."""
    nd = len(spatial)
    axes = [axis_window(spatial[a], kernel[a], stride[a], dilation[a], causal[a]) for a in range(nd)]

    def sees(a, g, n, lo, hi):  # group-coordinate queries of group g along axis a whose window meets [lo, hi]
        key, valid, _ = axes[a]
        out = []
        for i in range(n):
            ks = [int(k) // dilation[a] for k, ok in zip(key[i * dilation[a] + g].tolist(),
                                                        valid[i * dilation[a] + g].tolist()) if ok]
            if any(lo <= k <= hi for k in ks):
                out.append(i)
        return out

    steps = 0
    for group in itertools.product(*[range(d) for d in dilation]):
        lens = [(spatial[a] - group[a] + dilation[a] - 1) // dilation[a] for a in range(nd)]
        for origin in itertools.product(*[range(0, lens[a], qbox[a]) for a in range(nd)]):
            start = [min(sees(a, group[a], lens[a], origin[a], origin[a])) for a in range(nd)]
            for h in range(2):
                first = list(origin)
                last = [min(origin[a] + qbox[a], lens[a]) - 1 for a in range(nd)]
                first[0] = origin[0] + h * qbox[0] // 2
                last[0] = min(first[0] + qbox[0] // 2, lens[0]) - 1
                if first[0] > last[0]:
                    continue
                seen = [sees(a, group[a], lens[a], first[a], last[a]) for a in range(nd)]
                if all(seen):
                    walk = list(start)
                    if own:
                        walk[0] = min(sees(0, group[0], lens[0], first[0], first[0]))
                    steps += math.prod((max(seen[a]) - walk[a]) // kbox[a] - (min(seen[a]) - walk[a]) // kbox[a] + 1
                                       for a in range(nd))
    return steps * (math.prod(qbox) // 2) * math.prod(kbox) / (math.prod(spatial) * math.prod(kernel))


@pytest.mark.parametrize("nd", [2, 3] * 6)
def test_per_axis_product_matches_a_direct_count(nd):
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    kernel = [rng.randint(1, 5) for _ in range(nd)]
    dilation = [rng.choice([1, 1, 2, 3]) for _ in range(nd)]
    spatial = [k * d + rng.randint(0, 9) for k, d in zip(kernel, dilation)]
    stride = [rng.randint(1, k) for k in kernel]
    causal = [rng.random() < 0.3 for _ in range(nd)]
    qbox = [rng.choice([2, 4]) for _ in range(nd)]
    kbox = [rng.choice([1, 2, 4]) for _ in range(nd)]
    # own: each half of the box walks from its own start (the split CTAs' own walks)
    for backward, own in ((True, False), (True, True), (False, False)):
        got = pair_steps.walk_ratio(spatial, kernel, qbox, kbox, stride, dilation, causal, backward, own)
        want = direct_ratio(spatial, kernel, stride, dilation, causal, qbox, kbox, backward, own=own)
        assert got == pytest.approx(want), (seed, spatial, kernel, stride, dilation, causal, qbox, kbox, backward, own)
    for own in (False, True):
        got = pair_steps.dkv_walk_ratio(spatial, kernel, qbox, kbox, stride, dilation, causal, own)
        want = direct_dkv_ratio(spatial, kernel, stride, dilation, causal, qbox, kbox, own=own)
        assert got == pytest.approx(want), ("dK/dV", seed, spatial, kernel, stride, dilation, causal, qbox, kbox, own)


def test_counts_behind_the_backward_pair_choice():
    """HunyuanVideo-sized: the 4x4x8 / 2x4x8 pair walks 0.93x the steps of 2x8x8 / 1x8x8 (the
    library takes it below 0.95x); FLUX-sized: 16x8 / 8x8 0.96x of 8x16 / 4x16; 13x13 on
    128x128 keeps the first pair (1.03x)."""
    ratio = lambda s, k, a, b: (pair_steps.walk_ratio(s, k, *a) / pair_steps.walk_ratio(s, k, *b))  # noqa: E731
    assert ratio((30, 48, 80), (18, 24, 24), ((4, 4, 8), (2, 4, 8)), ((2, 8, 8), (1, 8, 8))) == pytest.approx(0.932, abs=1e-3)
    assert ratio((256, 256), (80, 80), ((16, 8), (8, 8)), ((8, 16), (4, 16))) == pytest.approx(0.960, abs=1e-3)
    assert ratio((128, 128), (13, 13), ((16, 8), (8, 8)), ((8, 16), (4, 16))) > 0.95


def test_dkv_counts_of_the_measured_pairs():
    """The dK/dV pass's count where it parts from the dQ pass's (PERF.md, thirty-seventh
    session): 8x2x8 / 2x4x8 on video-3d 0.70x the first pair's dQ steps but 0.90x its dK/dV
    steps (its dK/dV pass ran slower than 4x4x8 / 2x4x8's, 0.83x both); 16x8 / 8x8 at 25x25
    on 64x64 0.91x and 1.16x (its backward ran 3-4% slower than 8x16 / 4x16's)."""
    def both(s, k, pair, first):
        return (pair_steps.walk_ratio(s, k, *pair) / pair_steps.walk_ratio(s, k, *first),
                pair_steps.dkv_walk_ratio(s, k, *pair) / pair_steps.dkv_walk_ratio(s, k, *first))
    first3 = ((2, 8, 8), (1, 8, 8))
    assert both((16, 32, 32), (5, 7, 7), ((8, 2, 8), (2, 4, 8)), first3) == pytest.approx((0.700, 0.900), abs=1e-3)
    assert both((16, 32, 32), (5, 7, 7), ((4, 4, 8), (2, 4, 8)), first3) == pytest.approx((0.825, 0.825), abs=1e-3)
    assert both((64, 64), (25, 25), ((16, 8), (8, 8)), ((8, 16), (4, 16))) == pytest.approx((0.914, 1.157), abs=1e-3)


def test_cli_prints_the_table_pairs(capsys):
    pair_steps.main(["--spatial", "16", "32", "32", "--kernel", "5", "7", "7"])
    out = capsys.readouterr().out
    assert "2x8x8/1x8x8" in out and "4x4x8/2x4x8" in out and "1.000x the first" in out
    pair_steps.main(["--spatial", "64", "64", "--kernel", "25", "25", "--passes"])
    assert "dK/dV pass   2.074   1.157x the first" in capsys.readouterr().out


def test_split_halves_walk_from_their_own_start():
    """With NATTN_SM90_SPLIT_OWN_WALK each half of a backward box (a CTA of its own at head
    dims up to 64) walks its own union from its start (narrow_to_half in
    nattn/sm90/tiles.cuh): with 7-row boxes a 16-row half
    of a 32x4 box walks a 13x13 window's 28 rows in four boxes (448 keys a query inside the
    grid) where from the box's start the second half straddled five; where the box extent
    divides the half's (8x8 boxes, 8-row halves) the counts agree."""
    s, k = (128, 128), (13, 13)
    tall = ((32, 4), (7, 16))
    assert pair_steps.walk_ratio(s, k, *tall, own_walk=True) == pytest.approx(2.651, abs=1e-3)
    assert pair_steps.walk_ratio(s, k, *tall) == pytest.approx(2.899, abs=1e-3)
    assert pair_steps.walk_ratio((512, 512), k, *tall, own_walk=True) < 448 / 169 * 1.01
    square = ((16, 8), (8, 8))
    assert pair_steps.walk_ratio(s, k, *square, own_walk=True) == pytest.approx(pair_steps.walk_ratio(s, k, *square))
