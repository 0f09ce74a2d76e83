"""Forward + backward times of libnattn's kernel families side by side on the anchor
problems (bf16, ms, triton do_bench medians): sm90 (NATTN_FAMILY=sm90: the Hopper forward
and backward), tc (NATTN_FAMILY=tc), nattn's flex backend and dense SDPA's backward
throughput. "bwd" is the backward alone (forward + backward minus the forward), with its
useful TFLOP/s (2.5x the forward's FLOPs) and its share of dense SDPA's backward rate; the
sm90 backward's per-kernel split (delta, dQ pass, dK/dV pass) comes from the profiler.
Each sm90 gradient is checked against the tc family's on the full problem.

    python benchmarks/sm90_backward.py [--only a,b] [--no-flex] [--no-tc] [--crossover] [--atomic]

--atomic adds the KV-parallel dQ (NATTN_SM90_DQ=atomic: fp32 accumulation from the dK/dV pass)
as a column beside the default deterministic dQ pass.
"""

import argparse
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import nattn
from nattn.bench import ANCHORS
from sm90_forward import CROSSOVER, with_family

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
KERNELS = ("delta_kernel", "backward_dq_kernel", "backward_dkv_kernel", "dq_convert_kernel")


def timed(fn, large):
    try:
        return do_bench(fn, warmup=3 if large else 25, rep=20 if large else 100, return_mode="median")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return float("nan")


def dense_backward_rate():
    q, k, v = (torch.randn(1, 24, 8192, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    fwd = do_bench(lambda: F.scaled_dot_product_attention(q, k, v), return_mode="median")
    both = do_bench(lambda: F.scaled_dot_product_attention(q, k, v).backward(g), grad_to_none=[q, k, v],
                    return_mode="median")
    return 2.5 * 4 * 24 * 8192 * 8192 * 128 / (both - fwd) / 1e9  # TFLOP/s


def kernel_split(fn):
    """Milliseconds per sm90 backward kernel in one call of fn (profiler, CUDA time)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    split = dict.fromkeys(KERNELS, 0.0)
    for e in prof.key_averages():
        for name in KERNELS:
            if name in e.key:
                split[name] += e.device_time_total / 1e3
    return split


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-tc", action="store_true")
    ap.add_argument("--crossover", action="store_true", help="the window-size sweep instead of the anchors")
    ap.add_argument("--atomic", action="store_true", help="also time the KV-parallel dQ (NATTN_SM90_DQ=atomic)")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    dense = dense_backward_rate()
    print(f"dense SDPA backward {dense:.0f} TFLOP/s")
    rows = []
    for p in CROSSOVER if a.crossover else ANCHORS:
        if only and p.name not in only:
            continue
        large = p.tokens * p.window > 1e8
        q, k, v = (torch.randn(p.batch, *p.spatial, p.heads, p.dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        g = torch.randn_like(q)
        na = FUNCS[p.na_dim]

        def fwd(backend):
            def f():
                with torch.no_grad():
                    return na(q, k, v, p.kernel, dilation=p.dilation, stride=p.stride, backend=backend)
            return f

        def both(backend):
            def f():
                for t in (q, k, v):
                    t.grad = None
                na(q, k, v, p.kernel, dilation=p.dilation, stride=p.stride, backend=backend).backward(g)
            return f

        def grads(family):
            with_family(family, both("cuda"))
            return [t.grad.clone() for t in (q, k, v)]

        row = {"name": p.name}
        try:
            row["sm90 f+b"] = with_family("sm90", lambda: timed(both("cuda"), large))
            row["sm90 bwd"] = row["sm90 f+b"] - with_family("sm90", lambda: timed(fwd("cuda"), large))
            split = with_family("sm90", lambda: kernel_split(both("cuda")))
            row.update({k.replace("_kernel", "").replace("backward_", ""): v for k, v in split.items()})
            if a.atomic:
                os.environ["NATTN_SM90_DQ"] = "atomic"
                try:
                    row["atomic f+b"] = with_family("sm90", lambda: timed(both("cuda"), large))
                    split = with_family("sm90", lambda: kernel_split(both("cuda")))
                    row["atomic dkv"] = split["backward_dkv_kernel"]
                    got = grads("sm90")
                finally:
                    os.environ.pop("NATTN_SM90_DQ", None)
                ref = grads("sm90")
                row["atomic err"] = max(((x.float() - y.float()).norm() / y.float().norm()).item()
                                        for x, y in zip(got, ref))
            if not a.no_tc:
                got, ref = grads("sm90"), grads("tc")
                row["err vs tc"] = max(((x.float() - y.float()).norm() / y.float().norm()).item()
                                       for x, y in zip(got, ref))
                row["tc f+b"] = with_family("tc", lambda: timed(both("cuda"), large))
        except RuntimeError as e:
            print(p.name, "sm90:", str(e).splitlines()[0][:200])
        if not a.no_flex:
            row["flex f+b"] = timed(both("flex"), large)
        if "sm90 bwd" in row:
            row["bwd TFLOP/s"] = 2.5 * p.na_flops() / row["sm90 bwd"] / 1e9
            row["of dense"] = row["bwd TFLOP/s"] / dense
        rows.append(row)
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        del q, k, v, g
        torch.cuda.empty_cache()
    cols = ["name", "sm90 f+b", "sm90 bwd", "delta", "dq", "dkv", "tc f+b", "flex f+b", "bwd TFLOP/s", "of dense",
            "err vs tc"] + (["atomic f+b", "atomic dkv", "atomic err"] if a.atomic else [])
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols) + " |")


if __name__ == "__main__":
    main()
