"""How many of a Hopper forward's key-box steps a consumer warpgroup could skip: the two
warpgroups of a 128-query CTA each own half of its query box, and a key box that holds no
key of a half's window union is work that half does for nothing. The kernels split the box
along axis 0; the backward passes skip those steps (`seen_steps`, csrc/include/nattn/sm90/tiles.cuh:
along axis 0 they form a prefix or suffix of the walk), the forward computes them. This counts,
on the CPU, what each split could skip (another axis would need a skip test inside the loops,
which made the 2-D dK/dV pass spill). Windows are nattn.windows'
(stride, dilation and causal are left at their defaults: 1, 1, off).

    python benchmarks/warpgroup_skip.py                                 # HunyuanVideo, its forward pair
    python benchmarks/warpgroup_skip.py --spatial 30 48 80 --kernel 18 24 24 --query 2 8 8 --key 1 8 8
"""

import argparse
import itertools

import torch

from nattn.windows import axis_window


def unions(length: int, kernel: int):
    """Per query coordinate, its window's first and last key along one axis."""
    keys, _, _ = axis_window(length, kernel, 1, 1, False)
    return keys.min(dim=1).values.tolist(), keys.max(dim=1).values.tolist()


def skipped_fraction(spatial, kernel, query, key, split_axis: int) -> float:
    """Warpgroup steps (query box, key box of the CTA's walk, warpgroup) whose key box holds
    no key of the warpgroup's own union, with the query box halved along `split_axis`."""
    lo_hi = [unions(n, k) for n, k in zip(spatial, kernel)]
    dims = range(len(spatial))

    def span(a, first, last):  # keys seen by queries first..last along axis a
        return lo_hi[a][0][first], lo_hi[a][1][last]

    total = skipped = 0
    for q0 in itertools.product(*[range(0, n, b) for n, b in zip(spatial, query)]):
        q1 = [min(q0[a] + query[a], spatial[a]) - 1 for a in dims]
        cta = [span(a, q0[a], q1[a]) for a in dims]
        boxes = [range(cta[a][0], cta[a][1] + 1, key[a]) for a in dims]
        halves = []
        for h in range(2):
            first, last = list(q0), list(q1)
            first[split_axis] = q0[split_axis] + h * (query[split_axis] // 2)
            last[split_axis] = min(first[split_axis] + query[split_axis] // 2, spatial[split_axis]) - 1
            halves.append(None if first[split_axis] > last[split_axis]
                          else [span(a, first[a], last[a]) for a in dims])
        for origin in itertools.product(*boxes):
            for u in halves:
                total += 1
                skipped += u is None or any(origin[a] + key[a] - 1 < u[a][0] or origin[a] > u[a][1] for a in dims)
    return skipped / total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spatial", type=int, nargs="+", default=[30, 48, 80])
    ap.add_argument("--kernel", type=int, nargs="+", default=[18, 24, 24])
    ap.add_argument("--query", type=int, nargs="+", default=[2, 8, 8], help="the query box (128 tokens)")
    ap.add_argument("--key", type=int, nargs="+", default=[2, 8, 8], help="the key box")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    for axis in range(len(a.spatial)):
        if a.query[axis] % 2 == 0:
            frac = skipped_fraction(a.spatial, a.kernel, a.query, a.key, axis)
            print(f"halves along axis {axis}{' (the kernels)' if axis == 0 else ''}: {frac:.1%} of the steps skippable")


if __name__ == "__main__":
    main()
