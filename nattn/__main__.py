"""``python -m nattn``: run a small 2-D NA problem on every backend that fits this machine.

Each backend's output is checked against the reference computed in float64; the table
shows backend, shape, median time and max error. The build configuration of the
compiled kernel library (if any) is printed first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import nattn
from nattn.backends import AUTO_ORDER, BACKENDS, choose_na_backend
from nattn.params import normalize


def _build_summary() -> str:
    from nattn.build_info import build_config, describe

    gpu = None
    if torch.cuda.is_available():
        gpu = "{}.{}".format(*torch.cuda.get_device_capability())
    return "\n".join(describe(build_config(), gpu))


def _time(fn, device, repeats: int) -> float:
    fn()  # warm-up (compilation, caches)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nattn", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=2, default=(32, 32), help="feature map X Y")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--kernel", type=int, default=7)
    parser.add_argument("--dilation", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"nattn {nattn.__version__}, torch {torch.__version__}, device {device}")
    print(_build_summary())
    shape = (2, *args.size, args.heads, args.dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    na = dict(kernel_size=args.kernel, dilation=args.dilation)
    truth = nattn.na2d(q.double(), k.double(), v.double(), backend="reference", **na)
    params = normalize(q, k, v, 2, args.kernel, dilation=args.dilation)
    best = choose_na_backend(q, k, v, None, params)
    tol = 1e-3 if dtype == torch.float32 else 3e-2

    print(f"\nproblem: na2d q/k/v {list(shape)} {args.dtype}, kernel {args.kernel}, dilation {args.dilation}")
    print(f"{'backend':<12} {'chosen':<7} {'time (ms)':>10} {'max |err|':>11}  status")
    failed = False
    for name in AUTO_ORDER:
        reasons = BACKENDS[name].na_not_supported_reasons(q, k, v, None, params, True)
        if reasons:
            print(f"{name:<12} {'':<7} {'-':>10} {'-':>11}  skipped: {'; '.join(reasons)}")
            continue
        run = lambda: nattn.na2d(q, k, v, backend=name, **na)  # noqa: E731
        out = run()
        err = (out.double() - truth).abs().max().item()
        ok = bool(torch.isfinite(out).all()) and err < tol
        failed |= not ok
        ms = _time(run, device, args.repeats) * 1e3
        mark = "*" if name == best else ""
        print(f"{name:<12} {mark:<7} {ms:>10.3f} {err:>11.2e}  {'ok' if ok else 'MISMATCH'}")
    print("\n* = backend chosen automatically; error vs the float64 reference.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
