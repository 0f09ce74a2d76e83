"""``python -m nattn``: run a small 2-D NA problem on every backend that fits this machine.

Each backend's output is checked against the reference computed in float64; the table
shows backend, median time and max error. A line on the compiled CUDA kernel library
(built or not, and what it holds) comes first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import torch

import nattn
from nattn.backends import AUTO_ORDER, BACKENDS, choose_na_backend
from nattn.params import normalize

# torch's flex_attention warns once per process when it runs without torch.compile. nattn
# compiles flex on CUDA only; on CPU the flex backend runs eagerly by design (and only when
# asked, as here), so that warning's advice is not for the user of this job.
_FLEX_EAGER_WARNING = "flex_attention called without torch.compile"
# torch's compiler stack counts devices when flex first runs; on a machine without a usable
# GPU driver that count warns about NVML, which says nothing about this job's results.
_NO_NVML_WARNING = "Can't initialize NVML"


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

    print(f"\nna2d: q, k, v {list(shape)} {args.dtype}, kernel_size {args.kernel}, "
          f"dilation {args.dilation}")
    w0 = max(len("backend"), *(len(n) + 2 for n in AUTO_ORDER))
    row = f"{{:<{w0}}}  {{:>9}}  {{:>9}}  {{}}"
    print("\n" + row.format("backend", "time (ms)", "max |err|", "result"))
    failed, eager_flex = [], False
    for name in AUTO_ORDER:  # one line per backend as soon as it has run
        label = name + (" *" if name == best else "")
        reasons = BACKENDS[name].na_not_supported_reasons(q, k, v, None, params, True)
        if reasons:
            print(row.format(label, "-", "-", "skipped: " + "; ".join(reasons)))
            continue
        run = lambda: nattn.na2d(q, k, v, backend=name, **na)  # noqa: E731
        with warnings.catch_warnings():
            if name == "flex" and device.type == "cpu":
                eager_flex = True
                warnings.filterwarnings("ignore", message=_FLEX_EAGER_WARNING, category=UserWarning)
                warnings.filterwarnings("ignore", message=_NO_NVML_WARNING, category=UserWarning)
            out = run()
            ms = _time(run, device, args.repeats) * 1e3
        err = (out.double() - truth).abs().max().item()
        ok = bool(torch.isfinite(out).all()) and err < tol
        if not ok:
            failed.append(name)
        result = "ok" if ok else f"MISMATCH (tolerance {tol:g})"
        print(row.format(label, f"{ms:.2f}", f"{err:.1e}", result), flush=True)
    print("\n* chosen automatically for this problem. max |err|: against the float64 reference.")
    if eager_flex:
        print("flex on CPU runs torch's eager (unfused) flex_attention; automatic dispatch "
              "uses flex on CUDA only.")
    if failed:
        print(f"FAILED: max |err| above {tol:g} for {', '.join(failed)}.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
