"""The Hopper family's work per tile pair, counted on the CPU: how many (query box, key box)
steps a problem's CTAs walk with each (query box, key box) pair, as a walk ratio (query-key
pairs computed over the ones the windows hold). Counts what the kernels walk, exactly at
the borders, per dilation group, with stride and causal axes:

- backward (the dQ pass: 128-query boxes halved along axis 0, one half per consumer
  warpgroup, walking 64-key boxes; a half computes only the boxes its own windows reach
  along axis 0, `seen_steps`; `--own-walk`: each half walks its own union from where it
  starts, as the split CTAs of head dims up to 64 do, `narrow_to_half`): the measure
  libnattn picks a backward pair by (`backward_steps` in src/sm90_dispatch.cu: with
  --own-walk in 2-D at head dims up to 64, without it elsewhere); and the dK/dV pass's
  walk, counted apart (`--passes`): 128-key boxes halved along axis 0 walking the 64-query
  boxes of their inverse neighbourhood. The two differ where boxes are deep along axis 0 or grids small:
  8x2x8 / 2x4x8 on video-3d walks 0.70x the first pair's dQ steps but 0.90x its dK/dV steps
  (4x4x8 / 2x4x8: 0.83x both), and its dK/dV pass ran slower; 16x8 / 8x8 at 25x25 on 64x64
  0.91x and 1.16x (PERF.md, thirty-seventh session);
- forward (both warpgroups compute every box of the CTA's walk): for comparing forward pairs.

    python benchmarks/pair_steps.py --spatial 30 48 80 --kernel 18 24 24
    python benchmarks/pair_steps.py --spatial 256 256 --kernel 80 80 --pairs 8x16/4x16 16x8/8x8 4x32/4x16
    python benchmarks/pair_steps.py --spatial 16 32 32 --kernel 5 7 7 --pairs 4x4x8/2x4x8 8x2x8/2x4x8 --passes

Without --pairs: the kernel table's backward pairs of the NA dim. Candidate pairs need not
be built (that is what this is for: count before compiling an instance).
"""

import argparse
import bisect
import math
import os
import sys
from typing import List, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nattn._cuda.kernel_table import SM90_BACKWARD_TILES  # noqa: E402
from nattn.windows import axis_window  # noqa: E402


def group_bounds(length: int, kernel: int, stride: int, causal: bool) -> Tuple[List[int], List[int]]:
    """Per query of one dilation group (group coordinates), its window's first and last key."""
    keys, valid, _ = axis_window(length, kernel, stride, 1, causal)
    first = keys.masked_fill(~valid, length).min(dim=1).values.tolist()
    last = keys.masked_fill(~valid, -1).max(dim=1).values.tolist()
    return first, last


def group_inverse(length: int, kernel: int, stride: int, causal: bool):
    """group_bounds, and per key its first and last inverse query (the queries whose windows
    hold it: window ends rise with the query, so bisection finds them)."""
    first, last = group_bounds(length, kernel, stride, causal)
    inv_lo = [bisect.bisect_left(last, j) for j in range(length)]
    inv_hi = [bisect.bisect_right(first, j) - 1 for j in range(length)]
    return first, last, inv_lo, inv_hi


def axis_steps(length: int, kernel: int, stride: int, dilation: int, causal: bool, qb: int, kb: int,
               halves: bool, own: bool = False) -> int:
    """Key boxes of extent kb walked along one axis, summed over its query boxes of extent qb
    (every dilation group); with ``halves`` per half of each query box, counting only the
    boxes of the box's walk that the half's windows reach (``own``: the half walks its own
    union from its start, as the split CTAs at head dims up to 64 do)."""
    total = 0
    for g in range(dilation):
        n = (length - g + dilation - 1) // dilation
        first, last = group_bounds(n, kernel, stride, causal)
        parts = 2 if halves else 1
        for q0 in range(0, n, qb):
            for h in range(parts):
                a, b = q0 + h * qb // parts, min(q0 + (h + 1) * qb // parts, n) - 1
                if a > b:  # a half past the group's end (whole boxes always hold a query)
                    continue
                start = first[a] if own else first[q0]  # where the walk starts
                total += (last[b] - start) // kb - (first[a] - start) // kb + 1
    return total


def axis_dkv_steps(length: int, kernel: int, stride: int, dilation: int, causal: bool, kb: int, qb: int,
                   halves: bool, own: bool = False) -> int:
    """The dK/dV pass along one axis: query boxes of extent qb walked from each key box of
    extent kb (every dilation group), starting at the key box's inverse neighbourhood; with
    ``halves`` per half of the key box, counting only the query boxes whose queries see the
    half's keys (``own``: from the half's own inverse union, as axis_steps)."""
    total = 0
    for g in range(dilation):
        n = (length - g + dilation - 1) // dilation
        _, _, inv_lo, inv_hi = group_inverse(n, kernel, stride, causal)
        parts = 2 if halves else 1
        for j0 in range(0, n, kb):
            for h in range(parts):
                a, b = j0 + h * kb // parts, min(j0 + (h + 1) * kb // parts, n) - 1
                if a <= b and inv_hi[b] >= inv_lo[a]:
                    start = inv_lo[a] if own else inv_lo[j0]  # where the walk starts
                    total += (inv_hi[b] - start) // qb - (inv_lo[a] - start) // qb + 1
    return total


def dkv_walk_ratio(spatial: Sequence[int], kernel: Sequence[int], qbox: Sequence[int], kbox: Sequence[int],
                   stride=None, dilation=None, causal=None, own_walk: bool = False) -> float:
    """The dK/dV pass's computed key-query pairs over the windows': the pair's 128-token box
    (``qbox``) holds a CTA's keys, halved along axis 0 (one half per consumer warpgroup;
    ``own_walk``: each from its own start), walking 64-token boxes (``kbox``) of queries; the
    per-axis sums multiply."""
    nd = len(spatial)
    stride, dilation, causal = stride or (1,) * nd, dilation or (1,) * nd, causal or (False,) * nd
    steps = 1
    for a in range(nd):
        steps *= axis_dkv_steps(spatial[a], kernel[a], stride[a], dilation[a], causal[a], qbox[a], kbox[a], a == 0,
                                own=a == 0 and own_walk)
    return steps * (math.prod(qbox) // 2) * math.prod(kbox) / (math.prod(spatial) * math.prod(kernel))


def walk_ratio(spatial: Sequence[int], kernel: Sequence[int], qbox: Sequence[int], kbox: Sequence[int],
               stride=None, dilation=None, causal=None, backward: bool = True, own_walk: bool = False) -> float:
    """Query-key pairs a pair's steps compute over those of the windows: the per-axis sums
    multiply (the walk is a product of per-axis ranges). Backward: 64-query warpgroup steps
    (axis 0 halved; ``own_walk``: each half from its own start); forward: the CTA's query box
    against every key box of its walk."""
    nd = len(spatial)
    stride, dilation, causal = stride or (1,) * nd, dilation or (1,) * nd, causal or (False,) * nd
    steps = 1
    for a in range(nd):
        steps *= axis_steps(spatial[a], kernel[a], stride[a], dilation[a], causal[a], qbox[a], kbox[a],
                            halves=backward and a == 0, own=backward and a == 0 and own_walk)
    rows = math.prod(qbox) // 2 if backward else math.prod(qbox)
    return steps * rows * math.prod(kbox) / (math.prod(spatial) * math.prod(kernel))


def parse_pair(text: str) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    q, k = text.split("/")
    return tuple(int(x) for x in q.split("x")), tuple(int(x) for x in k.split("x"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spatial", type=int, nargs="+", required=True)
    ap.add_argument("--kernel", type=int, nargs="+", required=True)
    ap.add_argument("--stride", type=int, nargs="+")
    ap.add_argument("--dilation", type=int, nargs="+")
    ap.add_argument("--causal", type=int, nargs="+", help="0 / 1 per axis")
    ap.add_argument("--pairs", nargs="+", help="QUERYBOX/KEYBOX, e.g. 4x4x8/2x4x8 (default: the table's backward pairs)")
    ap.add_argument("--forward", action="store_true", help="count the forward's walk instead of the backward's")
    ap.add_argument("--own-walk", action="store_true",
                    help="backward: each half of a box walks its own union from its start (the split CTAs at head dims <= 64)")
    ap.add_argument("--passes", action="store_true",
                    help="backward: also the dK/dV pass's walk (the library's choice counts the dQ pass's)")
    args = ap.parse_args(argv)
    nd = len(args.spatial)
    pairs = ([parse_pair(p) for p in args.pairs] if args.pairs else [t for n, t in SM90_BACKWARD_TILES if n == nd])
    if len(args.kernel) != nd or any(len(q) != nd or len(k) != nd for q, k in pairs):
        sys.exit("--kernel and every pair need one extent per axis of --spatial")
    causal = tuple(bool(c) for c in args.causal) if args.causal else None
    ratios = [walk_ratio(args.spatial, args.kernel, q, k, args.stride, args.dilation, causal, not args.forward,
                         args.own_walk) for q, k in pairs]
    dkv = ([dkv_walk_ratio(args.spatial, args.kernel, q, k, args.stride, args.dilation, causal, args.own_walk)
            for q, k in pairs]
           if args.passes and not args.forward else None)
    for i, ((q, k), r) in enumerate(zip(pairs, ratios)):
        name = "x".join(map(str, q)) + "/" + "x".join(map(str, k))
        line = f"{name:16s} walk ratio {r:7.3f}   {r / ratios[0]:.3f}x the first"
        if dkv:
            line += f"   dK/dV pass {dkv[i]:7.3f}   {dkv[i] / dkv[0]:.3f}x the first"
        print(line)


if __name__ == "__main__":
    main()
