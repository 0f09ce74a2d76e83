"""benchmarks/ordered_dq_schedule.py: its model of the ordered KV-parallel dQ's waits, on small
random problems (CPU). The ranks it replays must come in order per box (its own assertion: a
gap would be a CTA waiting forever), the order can only add time, and in 1-D a descending walk
adds none (a lower-rank CTA reaches every shared box first)."""

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import ordered_dq_schedule as model  # noqa: E402


def _problem(rng, na):
    spatial = [rng.randint(6, 60 if na == 1 else 20) for _ in range(na)]
    kernel = [rng.randint(2, s) for s in spatial]
    stride = [rng.randint(1, k) for k in kernel]
    causal = [rng.random() < 0.3 for _ in range(na)]
    kbox = [rng.choice([2, 4, 8]) for _ in range(na)]
    qbox = [rng.choice([1, 2, 4]) for _ in range(na)]
    return spatial, kernel, stride, causal, kbox, qbox


def test_the_order_only_adds_time_and_ranks_come_in_order():
    rng = random.Random(4242)
    for _ in range(40):
        na = rng.randint(1, 3)
        args = (*_problem(rng, na), rng.randint(1, 3), rng.randint(1, 8), rng.randint(1, 3))
        free = model.schedule(*args, descending=False, ordered=False)
        for desc in (False, True):
            assert model.schedule(*args, descending=desc, ordered=True) >= free


def test_one_dimension_descending_walk_waits_for_nothing():
    rng = random.Random(77)
    ascending_waited = 0
    for _ in range(30):
        args = (*_problem(rng, 1), rng.randint(1, 3), rng.randint(1, 8), 2)
        free = model.schedule(*args, descending=False, ordered=False)
        assert model.schedule(*args, descending=True, ordered=True) == free
        ascending_waited += model.schedule(*args, descending=False, ordered=True) > free
    assert ascending_waited > 0  # the order does bind: ascending walks wait
