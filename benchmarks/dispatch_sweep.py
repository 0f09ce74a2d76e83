"""The default family choice on random problems, against each family forced: where do libnattn's
rules (tuned on the anchors and a few more shapes) pick a family that runs slower?

    python benchmarks/dispatch_sweep.py [--count 40] [--seed 0] [--tol 0.10] [--no-bwd] [--rounds 2] [--only 15,17]
    python benchmarks/dispatch_sweep.py --summarize SWEEP_OUTPUT...   # no GPU: per seed and pass

Each problem is drawn the way users call NA (1-D / 2-D / 3-D; odd and even kernels; dilation,
stride, per-axis causality, GQA, an RPB table, head dims 32 / 64 / 128; a few million query
rows), run in bf16 with the cuda backend (`NATTN_FAMILY` unset, then each family forced:
read on every call), forward and forward + backward, as GPU time (CUDA-graph replays; each
configuration's best of `--rounds`, the order alternating). A line
per problem and pass; SLOWER where the default is more than `--tol` behind the fastest family
(the backward alone: each run's forward + backward minus its own forward); a summary at the
end. `bash tests/gpu/run_device.sh sweep` runs it on the device.
"""

from __future__ import annotations

import argparse
import math
import random
import re
from typing import Dict, List, Optional

import torch

from nattn.bench.problems import Problem
from nattn.bench.timing import family_ms

FAMILIES = ("sm90", "tc")
HEAD_DIMS = (32, 64, 128)


def _axis_sizes(rng: random.Random, na_dim: int, kernel, dilation, rows: int):
    """Spatial extents holding each axis' window (kernel x dilation) whose product is about
    ``rows``, the axes as even as those minimums allow."""
    need = [k * d for k, d in zip(kernel, dilation)]
    side = max(max(need), round(rows ** (1.0 / na_dim)))
    sizes = [max(n, int(side * rng.uniform(0.7, 1.3))) for n in need]
    if na_dim == 3:  # video: fewer frames than rows / columns
        sizes[0] = max(need[0], sizes[0] // 3)
    return tuple(sizes)


def random_problem(rng: random.Random, index: int) -> Problem:
    """One problem of the sweep (bf16; its name spells the draw)."""
    na_dim = rng.choices((1, 2, 3), weights=(25, 45, 30))[0]
    dim = rng.choice(HEAD_DIMS)
    if na_dim == 1:
        kernel = (int(math.exp(rng.uniform(math.log(3), math.log(513)))),)
    elif na_dim == 2:
        k = rng.randint(3, 33)
        kernel = (k, k) if rng.random() < 0.7 else (k, rng.randint(3, 33))
    else:
        kernel = (rng.randint(2, 9), rng.randint(3, 17), rng.randint(3, 17))
    dilation = tuple(rng.choice((1, 1, 1, 2, 3, 4)) if rng.random() < 0.3 else 1 for _ in kernel)
    stride = tuple(rng.randint(2, k) if rng.random() < 0.15 else 1 for k in kernel)
    causal = tuple(rng.random() < (0.35 if na_dim == 1 or a == 0 else 0.05) for a in range(na_dim))
    heads = rng.choice((4, 8, 16))
    heads_kv = heads // rng.choice((1, 1, 1, 2, 4)) if rng.random() < 0.3 else heads
    rpb = all(k % 2 for k in kernel) and all(s == 1 for s in stride) and not any(causal) and rng.random() < 0.3
    rows = int(math.exp(rng.uniform(math.log(4e5), math.log(8e6))))  # query rows x heads over the batch
    tokens = max(1, rows // heads)
    batch = rng.choice((1, 2, 4))
    spatial = _axis_sizes(rng, na_dim, kernel, dilation, max(1, tokens // batch))
    x = lambda t: "x".join(str(v) for v in t)  # noqa: E731
    name = (f"{index:02d}:{x(spatial)}-k{x(kernel)}-b{batch}-h{heads}/{heads_kv}-d{dim}"
            + (f"-dil{x(dilation)}" if any(d > 1 for d in dilation) else "")
            + (f"-s{x(stride)}" if any(s > 1 for s in stride) else "")
            + (f"-c{''.join('1' if c else '0' for c in causal)}" if any(causal) else "")
            + ("-rpb" if rpb else ""))
    return Problem(name, spatial, batch, heads, dim, kernel, dilation=dilation, stride=stride, causal=causal,
                   heads_kv=heads_kv, rpb=rpb)


def verdict(default: Optional[float], forced: Dict[str, Optional[float]], tol: float) -> str:
    """"SLOWER" when the default measured more than ``tol`` behind the fastest family that took
    the problem, "ok" otherwise, "-" without a default time or any family's."""
    times = [t for t in forced.values() if t is not None]
    if default is None or not times:
        return "-"
    return "SLOWER" if default > min(times) * (1 + tol) else "ok"


def _inputs(p: Problem, bwd: bool):
    shape = (p.batch, *p.spatial)
    make = lambda h: torch.randn(*shape, h, p.dim, device="cuda", dtype=torch.bfloat16, requires_grad=bwd)  # noqa: E731
    q, k, v = make(p.heads), make(p.heads_kv), make(p.heads_kv)
    rpb = torch.randn(p.heads, *(2 * w - 1 for w in p.kernel), device="cuda", requires_grad=bwd) if p.rpb else None
    return q, k, v, rpb


def _timed(family: Optional[str], fn) -> Optional[float]:
    """GPU ms of ``fn`` with ``family`` forced (None: the default), or None where it declines."""
    return family_ms(family, fn, target_ms=100.0)


def problems(count: int, seed: int, only=None):
    """The sweep's problems, drawn in order from ``seed`` (so ``only``, a set of row numbers,
    picks the same problems as the whole sweep's rows)."""
    rng = random.Random(seed)
    for i in range(count):
        p = random_problem(rng, i)
        if only is None or i in only:
            yield p


def _best(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return b if a is None else a if b is None else min(a, b)


def _rounds(fn, rounds: int) -> Dict[Optional[str], Optional[float]]:
    """Each configuration's best time over ``rounds``, the order reversed every round: a large
    problem heats the GPU into its power limit (~7% lower clocks, PERF.md twenty-fourth
    session), so whichever configuration ran right after a slow one measured slower."""
    order = (None,) + FAMILIES
    times: Dict[Optional[str], Optional[float]] = {}
    for r in range(rounds):
        for fam in (order if r % 2 == 0 else order[::-1]):
            t = _timed(fam, fn)
            times[fam] = t if r == 0 else _best(times[fam], t)
    return times


def sweep(count: int, seed: int, tol: float, bwd: bool, rounds: int = 2, only=None) -> None:
    import nattn
    funcs = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
    flagged = []
    print(f"nattn {nattn.__version__}; {torch.cuda.get_device_name()}; seed {seed}; tolerance {tol:.0%}; "
          f"GPU ms (bf16, CUDA-graph replays)", flush=True)
    for p in problems(count, seed, only):
        q, k, v, rpb = _inputs(p, bwd)
        leaves = tuple(t for t in (q, k, v, rpb) if t is not None)

        def f():
            return funcs[p.na_dim](q, k, v, p.kernel, dilation=p.dilation, stride=p.stride, is_causal=p.causal,
                                   rpb=rpb, backend="cuda")

        def fwd():
            with torch.no_grad():
                f()

        g = torch.randn_like(q)
        passes = [("fwd", fwd)] + ([("bwd", lambda: torch.autograd.grad(f(), leaves, g))] if bwd else [])
        first: Dict[Optional[str], Optional[float]] = {}
        for what, fn in passes:
            times = _rounds(fn, rounds)
            if what == "bwd":  # the backward alone
                times = {fam: (t - first[fam] if t is not None and first[fam] is not None else None)
                         for fam, t in times.items()}
            else:
                first = times
            forced = {fam: times[fam] for fam in FAMILIES}
            judged = verdict(times[None], forced, tol)
            shown = "  ".join(f"{fam} " + (f"{t:8.3f}" if t is not None else "       -") for fam, t in forced.items())
            default = f"{times[None]:8.3f}" if times[None] is not None else "  failed"
            print(f"{p.name:58s} {what} default {default}  {shown}  {judged}", flush=True)
            if judged == "SLOWER":
                flagged.append((p.name, what, times))
        q = k = v = rpb = leaves = g = None  # this problem's tensors freed before the next one's
        torch.cuda.empty_cache()
    timed = count if only is None else len(only & set(range(count)))
    print(f"\n{len(flagged)} of {timed} problems x {2 if bwd else 1} passes with the default more than {tol:.0%} "
          "behind a forced family:")
    for name, what, times in flagged:
        best = min((t, fam) for fam, t in times.items() if fam is not None and t is not None)
        print(f"  {name} {what}: default {times[None]:.3f} vs {best[1]} {best[0]:.3f} "
              f"({times[None] / best[0]:.2f}x)")


_ROW = re.compile(r"(\d+:\S+)\s+(fwd|bwd) default\s+(\S+)\s+sm90\s+(\S+)\s+tc\s+(\S+)")
_SEED = re.compile(r"nattn .*; seed (\d+);")


def read_rows(lines) -> Dict[tuple, tuple]:
    """{(seed, problem, pass): (default, sm90, tc)} from a sweep's printed lines (None where a
    family declined or the default failed)."""
    rows, seed = {}, None
    for line in lines:
        m = _SEED.match(line)
        if m:
            seed = int(m[1])
            continue
        m = _ROW.match(line.strip())
        if m:
            rows[(seed, m[1], m[2])] = tuple(None if x in ("-", "failed") else float(x) for x in m.group(3, 4, 5))
    return rows


def summarize(rows: Dict[tuple, tuple], tol: float = 0.10) -> List[str]:
    """Per seed and pass: the geometric mean of the default's time over the fastest family's,
    and the rows more than ``tol`` behind (rows with a default time and a family's)."""
    groups: Dict[tuple, List[float]] = {}
    for (seed, _, what), (default, *forced) in rows.items():
        best = min((t for t in forced if t is not None), default=None)
        if default is not None and best:
            groups.setdefault((seed, what), []).append(default / best)
    out = []
    for (seed, what), ratios in sorted(groups.items(), key=lambda g: (g[0][0] or 0, g[0][1])):
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        behind = sum(r > 1 + tol for r in ratios)
        out.append(f"seed {seed} {what}: default / best {mean:.3f} (geometric mean of {len(ratios)}), "
                   f"{behind} more than {tol:.0%} behind")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=0.10)
    ap.add_argument("--no-bwd", action="store_true", help="forward only")
    ap.add_argument("--rounds", type=int, default=2, help="timings per configuration, the order alternating")
    ap.add_argument("--only", default=None, metavar="I,J,...",
                    help="time only these rows of the seed's sweep (the numbers its lines start with)")
    ap.add_argument("--summarize", nargs="+", metavar="FILE",
                    help="no GPU: read sweeps' printed output and summarize each seed and pass")
    args = ap.parse_args(argv)
    if args.summarize:
        rows = {}
        for path in args.summarize:
            with open(path) as f:
                rows.update(read_rows(f))
        print("\n".join(summarize(rows, args.tol)))
        return
    only = None if args.only is None else {int(x) for x in args.only.split(",") if x.strip()}
    sweep(args.count, args.seed, args.tol, not args.no_bwd, max(1, args.rounds), only)


if __name__ == "__main__":
    main()
