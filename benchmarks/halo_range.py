"""One halo rank's local NA forward on one GPU, with and without its query range: the region
of the sharded axis its queries' windows need (nattn.distributed.halo.region), computed whole
(every region query, as before the query range) and with only the rank's queries
(the cuda backend's query_range; the Hopper forward launches the boxes holding them). GPU time
of CUDA-graph replays (the bench's median_ms), bf16, ms. The shard split is even over
``--ranks``; every rank's region is timed.

    python benchmarks/halo_range.py                       # HunyuanVideo layer, shards along T and W
    python benchmarks/halo_range.py --ranks 4 --axes 2
"""

import argparse

import torch

from nattn.backends import get as get_backend
from nattn.bench.timing import median_ms
from nattn.distributed.halo import region
from nattn.params import NAParams


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spatial", type=int, nargs="+", default=[30, 48, 80])
    ap.add_argument("--kernel", type=int, nargs="+", default=[18, 24, 24])
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--axes", type=int, nargs="+", default=[0, 2], help="sharded axes to try, one at a time")
    args = ap.parse_args()
    nd = len(args.spatial)
    params = NAParams(tuple(args.kernel), (1,) * nd, (1,) * nd, (False,) * nd, args.dim ** -0.5)
    impl = get_backend("cuda")
    print("| sharded axis | rank | region / shard | whole region ms | query range ms | speedup |")
    print("|---|---|---|---|---|---|")
    for axis in args.axes:
        n = args.spatial[axis]
        for r in range(args.ranks):
            start, stop = n * r // args.ranks, n * (r + 1) // args.ranks
            lo, hi = region(start, stop, n, args.kernel[axis], 1, 1, False)
            shape = list(args.spatial)
            shape[axis] = hi - lo
            q, k, v = (torch.randn(1, *shape, args.heads, args.dim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            rng = tuple((start - lo, stop - lo) if a == axis else (0, shape[a]) for a in range(nd))
            with torch.no_grad():
                whole = median_ms(lambda a, b, c: impl.na_forward(a, b, c, None, params), [(q, k, v)], q.device,
                                  graphs=True)
                ranged = median_ms(lambda a, b, c: impl.na_forward(a, b, c, None, params, query_range=rng),
                                   [(q, k, v)], q.device, graphs=True)
            print(f"| {axis} | {r} | {hi - lo} / {stop - start} | {whole:.2f} | {ranged:.2f} | {whole / ranged:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
