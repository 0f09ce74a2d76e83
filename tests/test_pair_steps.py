"""benchmarks/pair_steps.py: the per-axis product of step counts equals a direct count over
every CTA box and warpgroup half (N-D windows enumerated query by query), on small random
problems with stride, dilation and causal axes; and the counts the library's backward pair
choice was measured against (PERF.md, thirty-sixth session)."""

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


def direct_ratio(spatial, kernel, stride, dilation, causal, qbox, kbox, backward):
    """The same walk counted CTA by CTA: each query's N-D window (per-axis windows, their
    valid keys, in group coordinates), a half's union as the bounds of its queries' keys."""
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
                steps += math.prod((hi[a] - start[a]) // kbox[a] - (lo[a] - start[a]) // kbox[a] + 1
                                   for a in range(nd))
    rows = math.prod(qbox) // 2 if backward else math.prod(qbox)
    return steps * rows * math.prod(kbox) / (math.prod(spatial) * math.prod(kernel))


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
    for backward in (True, False):
        got = pair_steps.walk_ratio(spatial, kernel, qbox, kbox, stride, dilation, causal, backward)
        want = direct_ratio(spatial, kernel, stride, dilation, causal, qbox, kbox, backward)
        assert got == pytest.approx(want), (seed, spatial, kernel, stride, dilation, causal, qbox, kbox, backward)


def test_counts_behind_the_backward_pair_choice():
    """HunyuanVideo-sized: the 4x4x8 / 2x4x8 pair walks 0.93x the steps of 2x8x8 / 1x8x8 (the
    library takes it below 0.95x); FLUX-sized: 16x8 / 8x8 0.96x of 8x16 / 4x16; 13x13 on
    128x128 keeps the first pair (1.03x)."""
    ratio = lambda s, k, a, b: (pair_steps.walk_ratio(s, k, *a) / pair_steps.walk_ratio(s, k, *b))  # noqa: E731
    assert ratio((30, 48, 80), (18, 24, 24), ((4, 4, 8), (2, 4, 8)), ((2, 8, 8), (1, 8, 8))) == pytest.approx(0.932, abs=1e-3)
    assert ratio((256, 256), (80, 80), ((16, 8), (8, 8)), ((8, 16), (4, 16))) == pytest.approx(0.960, abs=1e-3)
    assert ratio((128, 128), (13, 13), ((16, 8), (8, 8)), ((8, 16), (4, 16))) > 0.95


def test_cli_prints_the_table_pairs(capsys):
    pair_steps.main(["--spatial", "16", "32", "32", "--kernel", "5", "7", "7"])
    out = capsys.readouterr().out
    assert "2x8x8/1x8x8" in out and "4x4x8/2x4x8" in out and "1.000x the first" in out
