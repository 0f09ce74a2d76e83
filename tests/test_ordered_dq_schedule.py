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
            for order in ("raster", "both-ends"):  # ranks follow the dispatch order
                assert model.schedule(*args, descending=desc, ordered=True, order=order) >= free


def test_one_dimension_descending_walk_waits_for_nothing():
    rng = random.Random(77)
    ascending_waited = 0
    for _ in range(30):
        args = (*_problem(rng, 1), rng.randint(1, 3), rng.randint(1, 8), 2)
        free = model.schedule(*args, descending=False, ordered=False)
        assert model.schedule(*args, descending=True, ordered=True) == free
        ascending_waited += model.schedule(*args, descending=False, ordered=True) > free
    assert ascending_waited > 0  # the order does bind: ascending walks wait


def test_two_dimension_waits_shrink_with_the_border_share():
    """The 2-D waits come from the border key CTAs (wider walks): a longer last axis with the
    same window waits relatively less."""
    def cost(spatial):
        args = (spatial, (10, 10), (1, 1), (False, False), (4, 2), (2, 2), 1, 16, 2)
        return (model.schedule(*args, descending=True, ordered=True)
                / model.schedule(*args, descending=True, ordered=False))

    short, long = cost((32, 32)), cost((32, 128))
    assert short > 1.0 and long < short


def test_last_axis_positions():
    assert model.last_axis_positions(5, "raster") == [0, 1, 2, 3, 4]
    assert model.last_axis_positions(5, "both-ends") == [0, 2, 4, 3, 1]  # 0, 4, 1, 3, 2

