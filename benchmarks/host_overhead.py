"""Host (CPU) time of one nattn call on the GPU, apart from the kernels: a problem so small
that the GPU is idle most of the time, so the wall time per call is what Python, dispatch,
autograd and the launches cost. Also prints the top functions of a cProfile run.

    python benchmarks/host_overhead.py [--backend cuda] [--profile]
    python benchmarks/host_overhead.py --null     # nattn's Python alone, on any machine
    python benchmarks/host_overhead.py --null-library  # the cuda backend's Python (and its packed ops), on any machine
    python benchmarks/host_overhead.py --compiled # the same calls inside torch.compile'd functions
    python benchmarks/host_overhead.py --baseline # also torch's own SDPA on the same tensors
    python benchmarks/host_overhead.py --chain 16 --baseline  # per call inside one graph of 16
    python benchmarks/host_overhead.py --single-thread        # backward on the calling thread
    python benchmarks/host_overhead.py --torch-profile        # CUDA runtime calls a call makes
    python benchmarks/host_overhead.py --backend-calls        # the backend's calls alone
    python benchmarks/host_overhead.py --autograd-control     # torch's cost per backward node

``--null`` registers a backend whose kernels do nothing (it returns empty tensors) and runs on
the CPU: what is left is nattn's own Python (argument checks, dispatch, packing) plus torch's
autograd bookkeeping.

``--null-library`` times the cuda backend's own Python on the CPU (its allocations, the
problem struct's packing, the ctypes call) against a stand-in libnattn whose entry points
return at once (compiled here with ``cc``): the part of a call between nattn's dispatch and
libnattn's C code, on any machine.

``--baseline`` also times ``torch.nn.functional.scaled_dot_product_attention`` on the same
tensors (heads moved to dim 1, no copies), forward and forward + backward: what one autograd
attention call costs on this host with torch's own op, the platform's part of the numbers
above (a CUDA backward hands its work to autograd's device thread once per ``backward()``).

``--torch-profile`` runs the forward + backward under ``torch.profiler`` (CPU activities with
CUDA's runtime API calls) and prints what one call holds: each aten op and runtime call
(kernel launches, memsets, device queries) with its count and host time a call. cProfile
(``--profile``) sees libnattn's C side as one ctypes call; this splits its CUDA part.

``--backend-calls`` times the backend's ``na_forward`` / ``na_backward`` called directly on
the calling thread (no nattn dispatch, no autograd): the part of a call that libnattn and
the backend's Python take (``NATTN_FAMILY`` / ``NATTN_SM90_STRIPS`` pick what runs).
``--autograd-control`` times chains of a trivial Python ``autograd.Function`` and of an aten
op, forward + backward per node, on autograd's device thread and on the calling thread: what
this host's torch charges any node, the yardstick for nattn's.

``--chain N`` times N calls that feed each other (the output is the next call's query) and one
``backward()`` of the last: the cost per call as a model's layers see it, where the handoff to
autograd's device thread and back (~50-200 us a ``backward()`` on the H200 machine) is paid
once per step, not once per call.
"""

import argparse
import cProfile
import pstats
import time

import torch

import nattn


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def per_call(fn, n=300, rounds=3):
    """Microseconds per call, the best of ``rounds`` runs of ``n`` calls (a background burst,
    e.g. inductor's compile workers starting after the first compile, inflates one round)."""
    for _ in range(20):
        fn()
    _sync()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        _sync()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def null_backend():
    """A backend named "null" whose kernels do nothing: every call returns empty tensors
    (not registered; ``register_null_backend`` does that)."""
    from nattn.backends.reference import ReferenceBackend

    class Null(ReferenceBackend):
        name = "null"

        def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
            return []

        def na_forward(self, q, k, v, rpb, params):
            return q.new_empty(*q.shape[:-1], v.shape[-1]), q.new_empty(q.shape[:-1], dtype=torch.float32)

        def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params):
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), (
                None if rpb is None else torch.zeros_like(rpb))

    return Null()


def register_null_backend():
    from nattn.backends import register_backend

    register_backend(null_backend())


_NOOP_C = """
#include <stdint.h>
int nattn_forward(const int64_t* f, int64_t n, double s, void* st, char* e, int64_t el) { return 0; }
int nattn_backward(const int64_t* f, int64_t n, double s, void* st, char* e, int64_t el) { return 0; }
"""


def null_library_times(n=20000, packed=False):
    """(forward, backward) microseconds of the cuda backend's Python per call, CPU tensors,
    a stand-in library that returns at once (``--null-library``). ``packed``: also the
    modules' packed ops as a compiled graph calls them (``torch.ops.nattn.na_qkv_forward`` /
    ``na_qkv_backward``, no gradient recorded): (forward, backward, op forward, op backward)."""
    import ctypes
    import os
    import subprocess
    import tempfile

    from nattn._cuda import kernel_table
    from nattn.backends import BACKENDS
    from nattn.backends import cuda as cuda_backend
    from nattn.params import NAParams

    with tempfile.TemporaryDirectory() as tmp:  # loaded, the library outlives its file
        src, so = os.path.join(tmp, "noop.c"), os.path.join(tmp, "libnoop.so")
        with open(src, "w") as f:
            f.write(_NOOP_C)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, src], check=True)
        lib = ctypes.CDLL(so)
    for name in ("nattn_forward", "nattn_backward"):  # the signature library.Library gives them
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p,
                       ctypes.c_char_p, ctypes.c_int64]
        fn.restype = ctypes.c_int

    class Stand:  # what the backend's call path reads of library.Library
        forward, backward = lib.nattn_forward, lib.nattn_backward
        abi, num_fields, path = kernel_table.ABI_VERSION, kernel_table.NUM_PROBLEM_FIELDS, so

    backend = cuda_backend.CudaBackend()
    backend._lib = lambda: Stand
    raw_stream = cuda_backend._raw_stream
    cuda_backend._raw_stream = lambda index: 0
    registered = BACKENDS["cuda"]
    registered._lib = lambda: Stand  # the ops' backend (an instance attribute, deleted below)
    try:
        q, k, v = (torch.randn(1, 8, 8, 2, 32) for _ in range(3))
        params = NAParams((3, 3), (1, 1), (1, 1), (False, False), 32 ** -0.5)
        out, lse = backend.na_forward(q, k, v, None, params)
        g = torch.randn_like(out)
        fwd = per_call(lambda: backend.na_forward(q, k, v, None, params), n=n, rounds=5)
        bwd = per_call(lambda: backend.na_backward(q, k, v, None, out, lse, g, None, params), n=n, rounds=5)
        if not packed:
            return fwd, bwd
        qkv = torch.randn(1, 8, 8, 3, 2, 32)
        args = ([3, 3], [1, 1], [1, 1], [0, 0], 32 ** -0.5, "cuda")
        op_fwd, op_bwd = torch.ops.nattn.na_qkv_forward.default, torch.ops.nattn.na_qkv_backward.default
        with torch.no_grad():
            out, lse = op_fwd(qkv, None, *args)
            packed_fwd = per_call(lambda: op_fwd(qkv, None, *args), n=n, rounds=5)
            packed_bwd = per_call(lambda: op_bwd(g, None, qkv, None, out, lse, *args), n=n, rounds=5)
        return fwd, bwd, packed_fwd, packed_bwd
    finally:
        cuda_backend._raw_stream = raw_stream
        del registered._lib


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--torch-profile", action="store_true",
                    help="the runtime calls (launches, memsets, ...) and aten ops of one call, host us each")
    ap.add_argument("--null", action="store_true", help="a do-nothing backend on the CPU: nattn's Python alone")
    ap.add_argument("--null-library", action="store_true",
                    help="the cuda backend's own Python against a stand-in libnattn that does nothing (CPU)")
    ap.add_argument("--compiled", action="store_true",
                    help="call through torch.compile (the custom ops' path: what compiled models pay)")
    ap.add_argument("--baseline", action="store_true",
                    help="also time torch's scaled_dot_product_attention on the same tensors")
    ap.add_argument("--chain", type=int, default=1, metavar="N",
                    help="N calls feeding each other per backward(); times are per call")
    ap.add_argument("--single-thread", action="store_true",
                    help="backward on the calling thread (torch.autograd.set_multithreading_enabled(False)) "
                         "instead of autograd's device thread")
    ap.add_argument("--backend-calls", action="store_true",
                    help="the backend's na_forward / na_backward called directly (no dispatch, no autograd)")
    ap.add_argument("--autograd-control", action="store_true",
                    help="a trivial Python Function's and an aten op's cost per node, device thread vs calling thread")
    args = ap.parse_args()
    if args.autograd_control:
        autograd_control("cuda" if torch.cuda.is_available() else "cpu")
        return
    if args.null_library:
        fwd, bwd, op_fwd, op_bwd = null_library_times(packed=True)
        print(f"cuda backend's Python (stand-in library, CPU tensors): na_forward {fwd:.1f} us, "
              f"na_backward {bwd:.1f} us a call; the packed ops as a compiled graph calls them: "
              f"na_qkv_forward {op_fwd:.1f} us, na_qkv_backward {op_bwd:.1f} us")
        return
    if args.single_thread:
        torch.autograd.set_multithreading_enabled(False).__enter__()  # for the whole run
    device, dtype = "cuda", torch.bfloat16
    if args.null:
        register_null_backend()
        args.backend, device, dtype = "null", "cpu", torch.float32
    q, k, v = (torch.randn(1, 8, 8, 2, 32, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    if args.backend_calls:
        fwd, bwd = backend_call_times(args.backend, q.detach(), k.detach(), v.detach())
        print(f"backend {args.backend}, called directly: na_forward {fwd:.1f} us, na_backward {bwd:.1f} us a call")
        return
    g = torch.randn_like(q)

    n = max(1, args.chain)

    def chain(call, x):
        for _ in range(n):
            x = call(x)
        return x

    def fwd():
        with torch.no_grad():
            chain(lambda x: nattn.na2d(x, k, v, 3, backend=args.backend), q)

    def fwd_bwd():
        chain(lambda x: nattn.na2d(x, k, v, 3, backend=args.backend), q).backward(g)

    if args.compiled:
        inner = torch.compile(lambda q, k, v: nattn.na2d(q, k, v, 3, backend=args.backend), fullgraph=True)

        def fwd():
            with torch.no_grad():
                chain(lambda x: inner(x, k, v), q)

        def fwd_bwd():
            chain(lambda x: inner(x, k, v), q).backward(g)

    per = f"per call in chains of {n}" if n > 1 else "per call"
    print(f"backend {args.backend}{' (compiled)' if args.compiled else ''}: forward {per_call(fwd) / n:.1f} us, "
          f"forward+backward {per_call(fwd_bwd) / n:.1f} us (wall {per}, kernels negligible)")
    if args.baseline:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        heads_first = [t.flatten(1, 2).transpose(1, 2) for t in (q, k, v)]  # [B, H, N, D] views
        g_first = g.flatten(1, 2).transpose(1, 2)

        _, kf, vf = heads_first

        def sdpa_fwd():
            with torch.no_grad():
                chain(lambda x: sdpa(x, kf, vf), heads_first[0])

        def sdpa_fwd_bwd():
            chain(lambda x: sdpa(x, kf, vf), heads_first[0]).backward(g_first)

        print(f"torch sdpa (baseline): forward {per_call(sdpa_fwd) / n:.1f} us, forward+backward "
              f"{per_call(sdpa_fwd_bwd) / n:.1f} us ({per})")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fwd_bwd()
        _sync()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
    if args.torch_profile:
        print_runtime_calls(fwd_bwd, calls=n)


def backend_call_times(name: str, q, k, v):
    """(forward, backward) wall us of backend ``name``'s own calls on ``q, k, v`` (window 3,
    no autograd, nattn's dispatch skipped)."""
    from nattn.backends import BACKENDS
    from nattn.params import NAParams

    impl = BACKENDS[name]
    axes = q.dim() - 3
    params = NAParams((3,) * axes, (1,) * axes, (1,) * axes, (False,) * axes, q.shape[-1] ** -0.5)
    out, lse = impl.na_forward(q, k, v, None, params)
    g = torch.randn_like(out)
    return (per_call(lambda: impl.na_forward(q, k, v, None, params)),
            per_call(lambda: impl.na_backward(q, k, v, None, out, lse, g, None, params)))


class _Twice(torch.autograd.Function):
    """The smallest Python node: ``2 x``, backward ``2 g``."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def autograd_control(device: str, n: int = 16):
    """Per node, forward + backward wall us of chains of ``n`` Python Functions and of ``n``
    aten ops, with autograd's device thread and on the calling thread."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(1, 8, 8, 2, 32, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn_like(x)

    def chain(node):
        y = x
        for _ in range(n):
            y = node(y)
        y.backward(g)

    for threads in (True, False):
        with torch.autograd.set_multithreading_enabled(threads):
            py, aten = per_call(lambda: chain(_Twice.apply)) / n, per_call(lambda: chain(lambda y: y * 2)) / n
        where = "autograd's device thread" if threads else "the calling thread"
        print(f"backward on {where}: a Python Function node {py:.1f} us, an aten node {aten:.1f} us "
              f"(forward + backward, chains of {n})")


def print_runtime_calls(step, calls: int, steps: int = 50):
    """Host time a call of each aten op and CUDA runtime call under ``step()`` (``calls`` NA
    calls each), from torch.profiler's CPU events (the profiler's own cost inflates them)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    for _ in range(10):
        step()
    _sync()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync()
    per = steps * calls
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    print(f"{'event':<48} {'count a call':>12} {'self host us a call':>20}")
    for e in rows[:30]:
        print(f"{e.key[:48]:<48} {e.count / per:>12.2f} {e.self_cpu_time_total / per:>20.2f}")


if __name__ == "__main__":
    main()
