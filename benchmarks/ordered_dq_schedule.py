"""A model of the waits an ordered KV-parallel dQ would add (no GPU; nothing here is measured):
the dK/dV pass's key CTAs each walk their query boxes on the global grid (cta_tile_inverse
with GRID; csrc/include/nattn/sm90/ordered_dq.cuh) and add their dQ part of each box in rank
order, a key CTA's rank being its place in blockIdx.x order among the CTAs that add into the
box (ordered_slot). The model:

- 132 SMs, one CTA each, dispatched in blockIdx order (x = key box, fastest; then the head);
- every step (one query box) takes one unit of compute; its dQ add follows the step and waits
  for the box's previous rank to have added (a counter per box) and for the CTA's previous
  add (one writer); compute may run at most ``--staging`` adds ahead of the writer (the dQ
  staging buffers);
- a CTA ends with its last add.

It prints the makespan with the order against without it (every add at once), for the walk
ascending (today's BoxWalk: axis 0 slowest, from the first box) and descending (the last box
first, which puts a lower-rank CTA ahead of a higher one on the boxes they share).
``--order both-ends`` dispatches the last axis's key boxes from both ends inwards (ranks follow).

In 2-D the waits come from the borders: a border key CTA walks more query boxes per row
(clamped windows make it see every border query), so the next rank reaches a shared box
first and waits, and the delay runs down the rank chain. FLUX-sized (256x256, window 80)
costs 1.23x, the same window on 512x512 1.10x, on 256x1024 1.02x.

    python benchmarks/ordered_dq_schedule.py --spatial 32768 --kernel 2048 --kbox 128 --qbox 64
    python benchmarks/ordered_dq_schedule.py --spatial 256 256 --kernel 80 80 --kbox 16 8 --qbox 8 8 --heads 2
"""

import argparse
import heapq
import itertools
import os
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pair_steps import group_inverse  # noqa: E402


def axis_plan(length, kernel, stride, causal, kb, qb):
    """Per key box along the axis: its grid walk (query boxes); per query box the first and
    last key boxes touching it (a CTA's rank is a raster over its per-axis offsets)."""
    first, last, inv_first, inv_last = group_inverse(length, kernel, stride, causal)
    walks = []
    for j0 in range(0, length, kb):
        j1 = min(j0 + kb, length) - 1
        walks.append(list(range(inv_first[j0] // qb, inv_last[j1] // qb + 1)))
    touch = []
    for q0 in range(0, length, qb):
        q1 = min(q0 + qb, length) - 1
        touch.append((first[q0] // kb, last[q1] // kb))
    return walks, touch


def last_axis_positions(n: int, order: str):
    """Dispatch position of each key box along the last axis: ``raster`` (0, 1, ..) or
    ``both-ends`` (0, n-1, 1, n-2, ..: the border columns, whose walks are widest, first)."""
    if order == "raster":
        return list(range(n))
    seq, lo, hi = [], 0, n - 1
    while lo <= hi:
        seq.append(lo)
        if hi != lo:
            seq.append(hi)
        lo, hi = lo + 1, hi - 1
    pos = [0] * n
    for i, j in enumerate(seq):
        pos[j] = i
    return pos


def schedule(spatial: Sequence[int], kernel, stride, causal, kbox, qbox, heads: int, sms: int, staging: int,
             descending: bool, ordered: bool, order: str = "raster") -> float:
    plans = [axis_plan(*args) for args in zip(spatial, kernel, stride, causal, kbox, qbox)]
    nk = [len(w) for w, _ in plans]
    last = last_axis_positions(nk[-1], order)
    # blockIdx order: axis 0 slowest, the last axis in ``order``; a CTA's rank in a box is its
    # place in this order among the CTAs that add into the box (raster: ordered_slot's ranks)
    ctas = sorted(itertools.product(*[range(n) for n in nk]), key=lambda c: (*c[:-1], last[c[-1]]))
    slots = [0.0] * sms
    heapq.heapify(slots)
    end = 0.0
    for _ in range(heads):
        done = {}  # box -> (rank of its last add, its time)
        for cta in ctas:
            start = heapq.heappop(slots)
            walk = list(itertools.product(*[plans[a][0][cta[a]] for a in range(len(spatial))]))
            if descending:
                walk.reverse()
            computed, adds = start, []
            for s, box in enumerate(walk):
                computed = max(computed, adds[s - staging] if s >= staging else start) + 1.0
                at = max(computed, adds[-1] if adds else start)
                if ordered:
                    rank = 0
                    for a in range(len(spatial)):
                        lo, hi = plans[a][1][box[a]]
                        if a == len(spatial) - 1:  # the CTA's place among the interval's columns
                            offset = sum(last[j] < last[cta[a]] for j in range(lo, hi + 1))
                        else:
                            offset = cta[a] - lo
                        rank = rank * (hi - lo + 1) + offset
                    prev = done.get(box)
                    if rank > 0:
                        # the previous rank added already: lower blockIdx, dispatched earlier
                        assert prev is not None and prev[0] == rank - 1, (box, rank, prev)
                        at = max(at, prev[1])
                    done[box] = (rank, at)
                adds.append(at)
            finish = adds[-1] if adds else start
            end = max(end, finish)
            heapq.heappush(slots, finish)
    return end


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spatial", type=int, nargs="+", required=True)
    ap.add_argument("--kernel", type=int, nargs="+", required=True)
    ap.add_argument("--stride", type=int, nargs="+")
    ap.add_argument("--causal", type=int, nargs="+", help="0/1 per axis")
    ap.add_argument("--kbox", type=int, nargs="+", required=True, help="the key CTA's box (the pair's 128-token box)")
    ap.add_argument("--qbox", type=int, nargs="+", required=True, help="the walked query box (the 64-token box)")
    ap.add_argument("--heads", type=int, default=1, help="heads x batch simulated (their CTAs share the SMs)")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--staging", type=int, default=2, help="adds the compute may run ahead of the writer")
    ap.add_argument("--order", default="raster", choices=["raster", "both-ends"],
                    help="the key CTAs' dispatch order along the last axis")
    a = ap.parse_args(argv)
    n = len(a.spatial)
    stride = a.stride or [1] * n
    causal = [bool(c) for c in (a.causal or [0] * n)]
    args = (a.spatial, a.kernel, stride, causal, a.kbox, a.qbox, a.heads, a.sms, a.staging)
    free = schedule(*args, descending=False, ordered=False)
    for desc in (False, True):
        t = schedule(*args, descending=desc, ordered=True, order=a.order)
        print(f"walk {'descending' if desc else 'ascending '}: ordered adds take {t / free:.3f}x the unordered "
              f"makespan ({t:.0f} vs {free:.0f} step units)")


if __name__ == "__main__":
    main()
