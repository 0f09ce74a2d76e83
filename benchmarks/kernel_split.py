"""Per-kernel GPU time of one cuda-backend forward+backward on the anchor problems (bf16):
which of libnattn's passes (forward, dQ, dK/dV) the time goes to, from torch.profiler.

    python benchmarks/kernel_split.py [--only dinat-s1-2d,video-3d] [--iters 20] [--rpb] [--strided-grad]

--only takes anchor names and ad-hoc shapes written SPATIAL-kKERNEL-bB-hH-dD[-dilDIL]
(benchmarks/library_ab.py's), e.g. 64x64-k13x13-b8-h8-d32.

--rpb adds a relative positional bias with its gradient (NAT / DiNAT layers have one).
--strided-grad passes the output gradient as a view whose heads are 8 channels apart (not
packed): the Hopper backward's delta preprocessing then takes its strided kernel.
"""

import argparse
import re

import torch
from torch.profiler import ProfilerActivity, profile

import nattn
from cuda_anchors import ANCHORS, FUNCS, LARGE

AD_HOC = re.compile(r"(\d+(?:x\d+)*)-k(\d+(?:x\d+)*)-b(\d+)-h(\d+)-d(\d+)(?:-dil(\d+(?:x\d+)*))?")


def ad_hoc(name):
    """An anchor tuple from an ad-hoc shape's name."""
    m = AD_HOC.fullmatch(name)
    if m is None:
        raise SystemExit(f"--only: {name!r} is neither an anchor ({', '.join(a[0] for a in ANCHORS)}) nor a shape "
                         "written SPATIAL-kKERNEL-bB-hH-dD[-dilDIL]")
    spatial = tuple(int(x) for x in m[1].split("x"))
    kernel = tuple(int(x) for x in m[2].split("x"))
    dil = tuple(int(x) for x in m[6].split("x")) if m[6] else (1,) * len(spatial)
    return (name, spatial, int(m[3]), int(m[4]), int(m[5]), kernel, dil)


def split(anchor, iters, with_rpb=False, strided_grad=False):
    name, spatial, b, h, d, kernel, dil = anchor
    na = FUNCS[len(spatial)]
    q, k, v = (torch.randn(b, *spatial, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(b, *spatial, h, d + 8 * strided_grad, device="cuda", dtype=torch.bfloat16)[..., :d]
    if strided_grad:
        name += " (strided dO)"
    rpb = None
    if with_rpb:
        rpb = torch.randn(h, *(2 * w - 1 for w in kernel), device="cuda", requires_grad=True)
        name += " (RPB)"

    leaves = [t for t in (q, k, v, rpb) if t is not None]

    def step():  # autograd.grad: no accumulation into .grad (an add kernel per input otherwise)
        torch.autograd.grad(na(q, k, v, kernel, dilation=dil, rpb=rpb, backend="cuda"), leaves, g)

    report(name, step, iters)


def report(name, step, iters):
    """Warms ``step`` (one forward + backward) up, then prints each kernel's GPU time per step
    over ``iters`` steps under torch.profiler, largest first (benchmarks/padded_head_dims.py
    uses it too)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if t > 0:
            rows.append((t / iters / 1000.0, e.key))
    rows.sort(reverse=True)
    total = sum(t for t, _ in rows)
    print(f"\n{name}: {total:.3f} ms of kernels per forward+backward")
    for t, key in rows[:8]:
        print(f"  {t:8.3f} ms  {100 * t / total:5.1f}%  {key[:90]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rpb", action="store_true", help="with a relative positional bias (and its gradient)")
    ap.add_argument("--strided-grad", action="store_true", help="the output gradient as a view, not packed")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    for anchor in ANCHORS:
        if (not only and anchor[0] not in LARGE) or anchor[0] in only:
            split(anchor, args.iters, args.rpb, args.strided_grad)
    for name in sorted(only - {a[0] for a in ANCHORS}):
        split(ad_hoc(name), args.iters, args.rpb, args.strided_grad)


if __name__ == "__main__":
    main()
