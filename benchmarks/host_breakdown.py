"""Where the host time of one eager NA call on CUDA goes, layer by layer (a problem so small
that the kernels are negligible): torch's own per-op floor, the output allocations, packing
the problem struct, the ctypes call into libnattn (argument checks, family choice, launch),
the backend method, the autograd Function, and the public function.

    python benchmarks/host_breakdown.py [--backend cuda] [-d 32] [--window 3]

Each row is microseconds per call, the best of three runs of 300 calls (host_overhead.py's
method). Rows are cumulative: each includes the layers above it that it calls.
"""

import argparse

import torch

import nattn
from nattn import _eager
from nattn.backends import get as get_backend
from nattn.params import NAParams

from host_overhead import per_call


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("-d", "--dim", type=int, default=32)
    ap.add_argument("--window", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (reference backend)")
    args = ap.parse_args()
    dev, dt = args.device, torch.bfloat16 if args.device == "cuda" else torch.float32
    q, k, v = (torch.randn(1, 8, 8, 2, args.dim, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    params = NAParams((args.window,) * 2, (1, 1), (1, 1), (False, False), args.dim ** -0.5)
    backend = get_backend(args.backend)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out, lse = backend.na_forward(qd, kd, vd, None, params)
    rows = []

    def row(name, fn):
        rows.append((name, per_call(fn)))
        print(f"  {name:<58} {rows[-1][1]:8.1f} us", flush=True)

    where = torch.cuda.get_device_name() if dev == "cuda" else dev
    print(f"host time per call, {where}, torch {torch.__version__}, backend {args.backend}")
    x = torch.zeros(16, device=dev)
    row("torch floor: x.add_(1) (one tiny kernel launch)", lambda: x.add_(1))
    row("torch.empty x2 (the forward's out and lse)", lambda: (
        torch.empty(qd.shape, dtype=dt, device=dev), torch.empty(qd.shape[:-1], dtype=torch.float32, device=dev)))
    if args.backend == "cuda" and dev == "cuda":
        from nattn._cuda import library
        lib = library.load()
        row("backend._pack (problem struct, cached layout)", lambda: backend._pack(params, qd, kd, vd, out, lse, None))
        fields, device = backend._pack(params, qd, kd, vd, out, lse, None)
        row("libnattn forward through ctypes (checks, choice, launch)",
            lambda: backend._call(lib, lib.forward, fields, device, params.scale))
        gd = g.detach()
        delta = torch.empty(lse.shape, dtype=torch.float32, device=dev)
        dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
        bfields, _ = backend._pack(params, qd, kd, vd, out, lse, None, gd, None, delta, dq, dk, dv, None)
        row("libnattn backward through ctypes", lambda: backend._call(lib, lib.backward, bfields, device, params.scale))
    row("backend.na_forward (allocations + pack + call)", lambda: backend.na_forward(qd, kd, vd, None, params))
    row("backend.na_backward", lambda: backend.na_backward(qd, kd, vd, None, out, lse, g.detach(), None, params))
    fn = _eager.na_function()
    with torch.no_grad():
        row("autograd Function, no grad", lambda: fn.apply(qd, kd, vd, None, params, args.backend))
    row("autograd Function forward, grad recorded", lambda: fn.apply(q, k, v, None, params, args.backend))

    def fb_function():
        o, _ = fn.apply(q, k, v, None, params, args.backend)
        o.backward(g)

    row("autograd Function forward + backward", fb_function)

    def fwd():
        with torch.no_grad():
            nattn.na2d(q, k, v, args.window, backend=args.backend)

    row("nattn.na2d, no grad", fwd)
    row("nattn.na2d forward + backward", lambda: nattn.na2d(q, k, v, args.window, backend=args.backend).backward(g))

    def torch_fb():
        (q * 2).backward(g)

    row("torch floor: (q * 2).backward(g)", torch_fb)

    class Passthrough(torch.autograd.Function):  # a Python backward node that does no work
        @staticmethod
        def forward(ctx, a, b, c):
            return a * 2

        @staticmethod
        def backward(ctx, grad):
            return grad, grad, grad

    row("torch floor: Python Function (q, k, v) -> q * 2, f+b", lambda: Passthrough.apply(q, k, v).backward(g))


if __name__ == "__main__":
    main()
