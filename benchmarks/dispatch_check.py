"""The family dispatch against the clock: each problem timed with the Hopper and the
tensor-core families forced (NATTN_FAMILY, read on every call), next to what libnattn's
default rules pick for it (`nattn_sm90_preferred`, asked on the same shapes), and a flag
where the rules pick the family that measured slower by more than the tolerance (bf16,
GPU time of CUDA-graph replays, ms):

    python benchmarks/dispatch_check.py PROBLEMS [bwd] [rpb] [tol=0.03]

Problems as in benchmarks/library_ab.py: tuning-suite names or `SPATIAL-kK-bB-hH-dD[-dilD]`.
With `bwd` the backward is judged too (forward + backward minus forward, each family's
own). One process: the tensors and the CUDA context are shared by both families' runs.
`bash tests/gpu/run_device.sh dispatchcheck` runs it on the device.
"""

import os
import sys

import torch

import nattn
from nattn.backends import BACKENDS
from nattn.bench.timing import family_ms
from nattn.params import normalize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from library_ab import call, problem  # noqa: E402

FAMILIES = ("sm90", "tc")


def verdict(times: dict, rule_sm90: bool, tol: float = 0.03) -> str:
    """"ok", or "MISMATCH" when the family the rules pick (sm90 when ``rule_sm90``) measured
    more than ``tol`` slower than the other; "-" when either family has no time."""
    if any(times.get(f) is None for f in FAMILIES):
        return "-"
    picked, other = ("sm90", "tc") if rule_sm90 else ("tc", "sm90")
    return "MISMATCH" if times[picked] > times[other] * (1 + tol) else "ok"


def check(name: str, bwd: bool, with_rpb: bool, tol: float) -> None:
    p = problem(name)
    q, leaves, f = call(p, bwd, with_rpb)

    def fwd():
        with torch.no_grad():
            f()

    g = torch.randn_like(q)
    params = normalize(q, q, q, p.na_dim, p.kernel, p.stride, p.dilation, p.causal, None)
    cuda = BACKENDS["cuda"]
    passes = [("fwd", fwd, False)] + ([("bwd", lambda: torch.autograd.grad(f(), leaves, g), True)] if bwd else [])
    forward = {}
    for what, fn, backward in passes:
        times = {fam: family_ms(fam, fn) for fam in FAMILIES}
        if backward:  # the backward alone: each family's forward + backward minus its forward
            times = {fam: (t - forward[fam] if t is not None and forward[fam] is not None else None)
                     for fam, t in times.items()}
        else:
            forward = times
        rule = cuda.sm90_preferred(q, q, q, params, rpb=with_rpb, backward=backward)  # k, v: q's shape
        shown = " ".join(f"{fam} {t:7.3f}" if t is not None else f"{fam} declined" for fam, t in times.items())
        picks = "?" if rule is None else ("sm90" if rule else "tc")
        judged = verdict(times, bool(rule), tol) if rule is not None else "-"
        print(f"{name:34s} {what} {shown}  rules: {picks:4s} {judged}", flush=True)


def main(argv) -> None:
    if not argv:
        sys.exit(__doc__)
    flags = set(argv[1:])
    tol = next((float(x.split("=", 1)[1]) for x in flags if x.startswith("tol=")), 0.03)
    unknown = {x for x in flags if not x.startswith("tol=")} - {"bwd", "rpb"}
    if unknown:
        sys.exit(f"unknown flags {sorted(unknown)}; accepted: bwd, rpb, tol=FRACTION")
    print(f"nattn {nattn.__version__}; {torch.cuda.get_device_name()}; tolerance {tol:.0%}")
    for name in argv[0].split(","):
        try:
            check(name, "bwd" in flags, "rpb" in flags, tol)
        except ValueError as e:  # a problem nattn rejects (e.g. a kernel of 1): said, the rest still run
            print(f"{name:34s} rejected: {e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
