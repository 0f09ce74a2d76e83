"""Host (CPU) time of one nattn call on the GPU, apart from the kernels: a problem so small
that the GPU is idle most of the time, so the wall time per call is what Python, dispatch,
autograd and the launches cost. Also prints the top functions of a cProfile run.

    python benchmarks/host_overhead.py [--backend cuda] [--profile]
"""

import argparse
import cProfile
import pstats
import time

import torch

import nattn


def per_call(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    q, k, v = (torch.randn(1, 8, 8, 2, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            nattn.na2d(q, k, v, 3, backend=args.backend)

    def fwd_bwd():
        nattn.na2d(q, k, v, 3, backend=args.backend).backward(g)

    print(f"backend {args.backend}: forward {per_call(fwd):.1f} us, forward+backward {per_call(fwd_bwd):.1f} us "
          "(wall per call, kernels negligible)")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fwd_bwd()
        torch.cuda.synchronize()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
