"""Forward times of libnattn's kernel families side by side on the anchor problems (bf16,
ms, triton do_bench medians): sm90 (Hopper, the default on compute capability 9.0), tc
(NATTN_FAMILY=tc), nattn's flex backend and dense SDPA, with the useful TFLOP/s of the
sm90 row and its distance to the floor (the larger of the FLOP floor, dense SDPA's
measured throughput applied to the NA work, and the memory floor at the measured copy
rate). Each sm90 output is checked against the tc family's on the full problem.

    python benchmarks/sm90_forward.py [--only a,b] [--no-flex] [--no-tc] [--crossover]
"""

import argparse
import math
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import nattn
from nattn.bench import ANCHORS, Problem

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
# Window sizes between the small vision windows and the large ones: where sm90 overtakes tc.
CROSSOVER = tuple(
    [Problem(f"2d-128-k{k}", (128, 128), 4, 8, 64, (k, k)) for k in (9, 13, 17, 21, 25, 33)]
    + [Problem(f"3d-k{'x'.join(map(str, k))}", (16, 32, 32), 2, 8, 64, k) for k in ((5, 7, 7), (7, 9, 9), (9, 11, 11))]
    + [Problem(f"1d-32k-w{w}", (32768,), 1, 8, 128, (w,)) for w in (128, 256, 512, 1024)]
    + [Problem(f"2d-56-k{k}-d32", (56, 56), 32, 4, 32, (k, k)) for k in (7, 13, 21)])


def timed(fn, large):
    try:
        return do_bench(fn, warmup=5 if large else 25, rep=30 if large else 100, return_mode="median")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return float("nan")


def with_family(family, fn):
    old = os.environ.pop("NATTN_FAMILY", None)
    if family:
        os.environ["NATTN_FAMILY"] = family
    try:
        return fn()
    finally:
        os.environ.pop("NATTN_FAMILY", None)
        if old is not None:
            os.environ["NATTN_FAMILY"] = old


def copy_rate():
    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), return_mode="median")
    return 2 * x.numel() * 2 / ms / 1e9  # TB/s, read + write


def dense_rate():
    q = torch.randn(1, 24, 8192, 128, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: F.scaled_dot_product_attention(q, q, q), return_mode="median")
    return 4 * 24 * 8192 * 8192 * 128 / ms / 1e9  # TFLOP/s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-tc", action="store_true")
    ap.add_argument("--crossover", action="store_true", help="the window-size sweep instead of the anchors")
    ap.add_argument("--tiles", default="", help="comma-separated NATTN_SM90_TILE pairs to time as extra sm90 columns")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    tbps, dense_tflops = copy_rate(), dense_rate()
    print(f"copy {tbps:.2f} TB/s, dense SDPA {dense_tflops:.0f} TFLOP/s")
    rows = []
    for p in CROSSOVER if a.crossover else ANCHORS:
        if only and p.name not in only:
            continue
        large = p.tokens * p.window > 1e8
        q, k, v = (torch.randn(p.batch, *p.spatial, p.heads, p.dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        na = FUNCS[p.na_dim]

        def call(backend):
            return lambda: na(q, k, v, p.kernel, dilation=p.dilation, stride=p.stride, backend=backend)

        row = {"name": p.name}
        with torch.no_grad():
            out = with_family("sm90", call("cuda"))
            row["sm90"] = with_family("sm90", lambda: timed(call("cuda"), large))
            for tile in filter(None, a.tiles.split(",")):
                if tile.count("x") != 2 * (p.na_dim - 1):
                    continue  # a pair of another NA dim
                os.environ["NATTN_SM90_TILE"] = tile
                try:
                    row[tile] = with_family("sm90", lambda: timed(call("cuda"), large))
                except RuntimeError:
                    row[tile] = float("nan")
                finally:
                    os.environ.pop("NATTN_SM90_TILE", None)
            if not a.no_tc:
                ref = with_family("tc", call("cuda"))
                row["err vs tc"] = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                row["tc"] = with_family("tc", lambda: timed(call("cuda"), large))
            if not a.no_flex:
                row["flex"] = timed(call("flex"), large)
        flops = p.na_flops()
        floor = max(flops / dense_tflops / 1e9, sum(p.io_elements()) * 2 / tbps / 1e9)
        row["TFLOP/s"] = flops / row["sm90"] / 1e9
        row["x floor"] = row["sm90"] / floor
        rows.append(row)
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    cols = ["name", "sm90", *filter(None, a.tiles.split(",")), "tc", "flex", "TFLOP/s", "x floor", "err vs tc"]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols) + " |")


if __name__ == "__main__":
    main()
