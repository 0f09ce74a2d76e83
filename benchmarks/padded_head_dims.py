"""Where the time of a problem with head dims the Hopper family has no instance for goes (D != D_v,
or 48, 72, 96, ...: libnattn runs the next instance on zero-padded copies, src/sm90_padded.h):
per kernel of one forward + backward under torch.profiler, GPU ms, bf16, the copies included.

    python benchmarks/padded_head_dims.py [--iters 10]

Set NATTN_FAMILY=tc to time the tensor-core kernels on the same problems instead.
"""

import argparse

import torch

import nattn
from kernel_split import report

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
# (batch, *spatial, heads), window, D, D_v: the rows of docs/dev/PERF.md, twenty-seventh session
PROBLEMS = [
    ((2, 128, 128, 8), (33, 33), 64, 128),
    ((2, 128, 128, 8), (33, 33), 72, 72),
    ((1, 16, 48, 48, 8), (9, 15, 15), 96, 96),
    ((2, 8192, 8), (1024,), 128, 64),
]


def split(shape, window, d, dv, iters):
    q, k = (torch.randn(*shape, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    v = torch.randn(*shape, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(*shape, dv, device="cuda", dtype=torch.bfloat16)
    fn = FUNCS[len(window)]

    def step():  # autograd.grad: no accumulation into .grad
        torch.autograd.grad(fn(q, k, v, window), (q, k, v), g)

    report(f"{shape} window {window} D {d} / D_v {dv}", step, iters)


def main(problems=PROBLEMS, doc=__doc__):
    """Prints each problem's split (benchmarks/head_dim_256.py passes its own)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    for shape, window, d, dv in problems:
        split(shape, window, d, dv, args.iters)


if __name__ == "__main__":
    main()
