"""Forward (and forward + backward) times of named bench problems with the loaded libnattn, for
A/B comparisons of two builds: run it once per library (NATTN_LIBRARY picks one), alternating,
in the same device call (bf16, ms, triton do_bench medians):

    NATTN_LIBRARY=old.so python benchmarks/library_ab.py old flux-2d-w80,mid-2d-k13 [bwd] [graphs] [rpb] [fp16]
    NATTN_LIBRARY=new.so python benchmarks/library_ab.py new flux-2d-w80,mid-2d-k13 [bwd] [graphs] [rpb] [fp16]

`graphs`: the GPU's time (CUDA-graph replays, the bench's `median_ms`) instead of wall time;
small problems' forward + backward are host-bound (their wall times swung 20-50% between
rounds on the H200 machine) and need it. `rpb`: every call with a relative positional bias
(float32 [H, 2k-1, ...], with its gradient under `bwd`), as NAT / DiNAT layers run. `fp16`:
float16 inputs instead of bfloat16 (some tile pairs' backward differs by dtype).

Problems are the names of `python -m nattn.bench --suite tuning` (the anchors and more) or ad-hoc
shapes written `SPATIAL-kKERNEL-bB-hH-dD[-dilDIL]`, e.g. `16x32x32-k3x5x5-b2-h8-d64`. A
problem the library declines (NATTN_FAMILY / NATTN_SM90_TILE force a family or tile pair) prints
the reason and the run goes on. `bash tests/gpu/run_device.sh ab` and `... crossover` run it.
"""

import re
import sys

import torch
from triton.testing import do_bench

import nattn
from nattn.bench.problems import TUNING, Problem
from nattn.bench.timing import median_ms

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
AD_HOC = re.compile(r"(\d+(?:x\d+)*)-k(\d+(?:x\d+)*)-b(\d+)-h(\d+)-d(\d+)(?:-dil(\d+(?:x\d+)*))?")


def problem(name: str) -> Problem:
    """A tuning-suite problem by name, or an ad-hoc one from its shape."""
    p = next((x for x in TUNING if x.name == name), None)
    if p is not None:
        return p
    m = AD_HOC.fullmatch(name)
    if m is None:
        sys.exit(f"unknown problem {name!r}; known: {[x.name for x in TUNING]} or SPATIAL-kKERNEL-bB-hH-dD[-dilDIL]")
    dims = lambda s: tuple(int(x) for x in s.split("x"))  # noqa: E731
    spatial = dims(m[1])
    dilation = dims(m[6]) if m[6] else (1,) * len(spatial)
    return Problem(name, spatial, int(m[3]), int(m[4]), int(m[5]), dims(m[2]), dilation=dilation)


def call(p: Problem, bwd: bool, with_rpb: bool, dtype: torch.dtype = torch.bfloat16):
    """Random 16-bit inputs for ``p`` on the GPU (an RPB table when ``with_rpb``; leaves that need
    gradients under ``bwd``): ``(q, leaves, f)``, ``f()`` one cuda-backend call on them."""
    q, k, v = (torch.randn(p.batch, *p.spatial, p.heads, p.dim, device="cuda", dtype=dtype,
                           requires_grad=bwd) for _ in range(3))
    rpb = None
    if with_rpb:
        rpb = torch.randn(p.heads, *(2 * w - 1 for w in p.kernel), device="cuda", requires_grad=bwd)
    leaves = tuple(t for t in (q, k, v, rpb) if t is not None)

    def f():
        return FUNCS[p.na_dim](q, k, v, p.kernel, dilation=p.dilation, stride=p.stride, is_causal=p.causal,
                               rpb=rpb, backend="cuda")
    return q, leaves, f


def main(tag: str, names: str, bwd: bool, graphs: bool = False, with_rpb: bool = False,
         dtype: torch.dtype = torch.bfloat16) -> None:
    device = torch.device("cuda")
    # (the device lends H100s and H200s under one kind: a number means little without its card)
    print(f"{tag:6s} on {torch.cuda.get_device_name(device)}", flush=True)
    for name in names.split(","):
        p = problem(name)
        q, leaves, f = call(p, bwd, with_rpb, dtype)

        def fwd():
            with torch.no_grad():
                f()

        try:
            if graphs:
                ms = median_ms(fwd, [()], device, graphs=True)
            else:
                with torch.no_grad():
                    ms = do_bench(f, warmup=50, rep=300)
            line = f"{tag:6s} {name:26s} fwd {ms:8.3f}"
            if bwd:
                g = torch.randn_like(q)
                if graphs:
                    ms = median_ms(lambda: torch.autograd.grad(f(), leaves, g), [()], device, graphs=True)
                else:
                    ms = do_bench(lambda: f().backward(g), warmup=30, rep=300)
                line += f"  f+b {ms:8.3f}"
        except (RuntimeError, ValueError) as e:  # a forced family or tile pair that declines the problem
            line = f"{tag:6s} {name:26s} declined: {str(e).splitlines()[0][:160]}"
        print(line, flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    flags = set(sys.argv[3:])
    known = {"bwd", "graphs", "rpb", "fp16"}
    if flags - known:
        sys.exit(f"unknown flags {sorted(flags - known)}; accepted: {', '.join(sorted(known))}")
    main(sys.argv[1], sys.argv[2], "bwd" in flags, "graphs" in flags, "rpb" in flags,
         torch.float16 if "fp16" in flags else torch.bfloat16)
