"""benchmarks/dispatch_sweep.py: its random problems are valid NA calls (every window argument
and RPB table accepted by the argument checks), repeatable by seed and of bounded size; the
verdict flags only a default slower than the fastest family by more than the tolerance."""

import importlib.util
import math
import os
import random

import pytest
import torch

from nattn.params import normalize

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "dispatch_sweep.py")
_spec = importlib.util.spec_from_file_location("dispatch_sweep", _PATH)
dispatch_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dispatch_sweep)


def test_problems_are_valid_calls():
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    seen = set()
    for i in range(300):
        p = dispatch_sweep.random_problem(rng, i)
        shape = (p.batch, *p.spatial)
        q = torch.empty(*shape, p.heads, p.dim, device="meta")
        kv = torch.empty(*shape, p.heads_kv, p.dim, device="meta")
        rpb = torch.empty(p.heads, *(2 * k - 1 for k in p.kernel), device="meta") if p.rpb else None
        params = normalize(q, kv, kv, p.na_dim, p.kernel, p.stride, p.dilation, p.causal, None, rpb=rpb)
        assert params.kernel_size == p.kernel, (seed, p.name)
        assert p.heads % p.heads_kv == 0 and p.dim in dispatch_sweep.HEAD_DIMS, (seed, p.name)
        assert all(s >= k * d for s, k, d in zip(p.spatial, p.kernel, p.dilation)), (seed, p.name)
        rows = p.batch * math.prod(p.spatial) * p.heads
        assert rows <= 64e6, (seed, p.name, rows)  # a few GB a tensor at most
        seen.add(p.na_dim)
    assert seen == {1, 2, 3}
    again = random.Random(seed)
    assert dispatch_sweep.random_problem(again, 0) == dispatch_sweep.random_problem(random.Random(seed), 0)


@pytest.mark.parametrize("seed", range(3))
def test_verdict(seed):
    rng = random.Random(seed)
    fast, tol = rng.uniform(0.01, 10.0), rng.uniform(0.01, 0.2)
    slow = fast * (1 + tol) * rng.uniform(1.01, 2.0)
    near = fast * (1 + tol * rng.uniform(0.0, 0.99))
    verdict = dispatch_sweep.verdict
    assert verdict(slow, {"sm90": fast, "tc": slow}, tol) == "SLOWER"
    assert verdict(near, {"sm90": fast, "tc": None}, tol) == "ok"
    assert verdict(fast, {"sm90": slow, "tc": fast}, tol) == "ok"
    assert verdict(None, {"sm90": fast}, tol) == "-"
    assert verdict(fast, {"sm90": None, "tc": None}, tol) == "-"


def test_rounds_alternate_the_order_and_keep_each_best(monkeypatch):
    calls = []
    draws = iter([3.0, 2.0, None, 1.0, 5.0, 4.0])  # round 0: default, sm90, tc; round 1: tc, sm90, default

    def fake_timed(family, fn):
        calls.append(family)
        return next(draws)

    monkeypatch.setattr(dispatch_sweep, "_timed", fake_timed)
    times = dispatch_sweep._rounds(lambda: None, 2)
    assert calls == [None, "sm90", "tc", "tc", "sm90", None]
    assert times == {None: 3.0, "sm90": 2.0, "tc": 1.0}


def test_only_picks_the_same_rows_as_the_whole_sweep():
    seed = random.randrange(2**31)
    whole = list(dispatch_sweep.problems(12, seed))
    picked = list(dispatch_sweep.problems(12, seed, only={3, 7, 40}))
    assert picked == [whole[3], whole[7]]
    assert picked[0].name.startswith("03:") and picked[1].name.startswith("07:")


def test_summarize_reads_printed_rows():
    lines = [
        "nattn 0.1.0; NVIDIA H200; seed 7; tolerance 10%; GPU ms (bf16, CUDA-graph replays)",
        "00:128x128-k7x7-b2-h8/8-d128            fwd default    0.200  sm90    0.100  tc    0.400  SLOWER",
        "00:128x128-k7x7-b2-h8/8-d128            bwd default    0.500  sm90    0.500  tc    0.600  ok",
        "01:16x32x32-k3x3x3-b2-h8/8-d128         fwd default    0.300  sm90       -  tc    0.300  ok",
        "01:16x32x32-k3x3x3-b2-h8/8-d128         bwd default   failed  sm90    0.900  tc    0.800  -",
        "unrelated line",
    ]
    rows = dispatch_sweep.read_rows(lines)
    assert rows[(7, "01:16x32x32-k3x3x3-b2-h8/8-d128", "fwd")] == (0.3, None, 0.3)
    assert rows[(7, "01:16x32x32-k3x3x3-b2-h8/8-d128", "bwd")] == (None, 0.9, 0.8)
    out = dispatch_sweep.summarize(rows, 0.10)
    assert out == ["seed 7 bwd: default / best 1.000 (geometric mean of 1), 0 more than 10% behind",
                   f"seed 7 fwd: default / best {2 ** 0.5:.3f} (geometric mean of 2), 1 more than 10% behind"]
