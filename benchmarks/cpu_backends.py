"""NA on the CPU: the tiled backend against the reference (and dense SDPA on the same
tensors, for scale), forward and forward + backward, ms per call (best of ``--reps``).

    python benchmarks/cpu_backends.py [--dtype float32|bfloat16] [--reps 5] [--only NAME,...]
    python benchmarks/cpu_backends.py --unfused [--only NAME,...]   # na*d_qk + softmax + na*d_av
    python benchmarks/cpu_backends.py --only 2d-k13 --boxes 4x4,4x8,8x8   # tiled with given query boxes
    python benchmarks/cpu_backends.py --models nat_mini,dinat_mini [--batch 2] [--train]

Problems: a DiNAT-like 2-D layer (56x56, 7x7, 4 heads, D32), the same at 28x28 with dilation
4, a 2-D 13x13 window (64x64, D64), a 3-D 5x7x7 window (8x16x16, D64), a 1-D window of 255
(4096 tokens, D64), a GQA / RPB 2-D layer, and NAT-Mini's four stages (batch 2, RPB). Dense
SDPA computes every N x N score (it is not NA): it shows what the CPU's matrix products
reach. The last column counts the minor page faults of a tiled forward + backward call
(fresh memory's first touches). ``--models`` times whole timm models
instead (inference, or with ``--train`` a training step; 224x224, float32), their NA layers on
each backend.
"""

import argparse
import importlib
import math
import time

try:
    import resource
except ImportError:  # not on Windows: no fault counts
    resource = None

import torch

import nattn

PROBLEMS = {
    "dinat-2d-k7": dict(spatial=(56, 56), kernel=7, heads=4, dim=32),
    "dinat-2d-k7-dil4": dict(spatial=(28, 28), kernel=7, heads=8, dim=32, dilation=4),
    "2d-k13": dict(spatial=(64, 64), kernel=13, heads=4, dim=64),
    "3d-k5x7x7": dict(spatial=(8, 16, 16), kernel=(5, 7, 7), heads=4, dim=64),
    "1d-w255": dict(spatial=(4096,), kernel=255, heads=4, dim=64),
    "2d-k7-gqa-rpb": dict(spatial=(32, 32), kernel=7, heads=8, heads_kv=2, dim=32, rpb=True),
    # NAT-Mini's four stages at batch 2 (7x7 windows with RPB)
    "nat-mini-56": dict(spatial=(56, 56), kernel=7, heads=2, dim=32, rpb=True, batch=2),
    "nat-mini-28": dict(spatial=(28, 28), kernel=7, heads=4, dim=32, rpb=True, batch=2),
    "nat-mini-14": dict(spatial=(14, 14), kernel=7, heads=8, dim=32, rpb=True, batch=2),
    "nat-mini-7": dict(spatial=(7, 7), kernel=7, heads=16, dim=32, rpb=True, batch=2),
}
QK = {1: nattn.na1d_qk, 2: nattn.na2d_qk, 3: nattn.na3d_qk}
AV = {1: nattn.na1d_av, 2: nattn.na2d_av, 3: nattn.na3d_av}
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def best_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def faults() -> int:
    """Minor page faults of this process so far (first touches of fresh memory)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


def inputs(spec, dtype):
    spatial, heads, dim = spec["spatial"], spec["heads"], spec["dim"]
    heads_kv, b = spec.get("heads_kv", heads), spec.get("batch", 1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, *spatial, heads, dim, generator=g).to(dtype).requires_grad_(True)
    k, v = (torch.randn(b, *spatial, heads_kv, dim, generator=g).to(dtype).requires_grad_(True) for _ in range(2))
    kernel = spec["kernel"]
    ks = kernel if isinstance(kernel, tuple) else (kernel,) * len(spatial)
    rpb = (torch.randn(heads, *[2 * x - 1 for x in ks], generator=g).requires_grad_(True)
           if spec.get("rpb") else None)
    grad = torch.randn(*q.shape[:-1], dim, generator=g).to(dtype)
    return q, k, v, rpb, grad, ks


def run(name, spec, dtype, reps):
    spatial, heads, dim = spec["spatial"], spec["heads"], spec["dim"]
    heads_kv = spec.get("heads_kv", heads)
    kernel = spec["kernel"]
    q, k, v, rpb, grad, ks = inputs(spec, dtype)
    fn = FUNCS[len(spatial)]
    row = [name]
    for backend in ("reference", "tiled"):
        def call():
            return fn(q, k, v, kernel, dilation=spec.get("dilation", 1), rpb=rpb, backend=backend)

        with torch.no_grad():
            fwd = best_ms(call, reps)
        before = faults()
        both = best_ms(lambda: call().backward(grad), reps)
        row += [fwd, both]
    row.append((faults() - before) / (reps + 1))  # the tiled f+b calls' (warm-up included)
    qf, kf, vf = (t.detach().flatten(1, -3).transpose(1, 2) for t in (q, k, v))
    with torch.no_grad():
        dense = best_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
            qf, kf, vf, enable_gqa=heads_kv != heads), reps)
    tokens = q.shape[0] * math.prod(spatial)
    gflop = 4 * tokens * heads * math.prod(ks) * dim / 1e9
    return row + [dense, gflop]


def run_unfused(name, spec, dtype, reps):
    """``na*d_qk`` + softmax + ``na*d_av``, forward and forward + backward: the tiled boxes
    (CPU tensors' path) against the window gathers (``nattn.qk_av.USE_TILED = False``)."""
    q, k, v, rpb, grad, ks = inputs(spec, dtype)
    n, scale = len(spec["spatial"]), spec["dim"] ** -0.5
    args = dict(kernel_size=spec["kernel"], dilation=spec.get("dilation", 1))

    def call():
        attn = QK[n](q * scale, k, rpb=rpb, **args).softmax(-1)
        return AV[n](attn, v, **args)

    row = [name]
    for tiled in (False, True):
        nattn.qk_av.USE_TILED = tiled
        with torch.no_grad():
            fwd = best_ms(call, reps)
        row += [fwd, best_ms(lambda: call().backward(grad), reps)]
    nattn.qk_av.USE_TILED = True
    return row


def models(names, batch, reps, train=False):
    import timm

    importlib.import_module("nattn.models")  # registers the NA models with timm

    what = "training step (forward, backward, SGD)" if train else "inference"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, batch {batch}, 224x224; "
          f"{what} ms per batch (best of {reps})")
    print("| model | reference | tiled | speedup |")
    print("|---|---|---|---|")
    x = torch.randn(batch, 3, 224, 224)
    y = torch.randint(0, 1000, (batch,))
    for name in names:
        torch.manual_seed(0)
        model = timm.create_model(name).train(train)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            if not train:
                with torch.no_grad():
                    return model(x)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        row = []
        for backend in ("reference", "tiled"):
            for m in model.modules():
                if hasattr(m, "backend"):
                    m.backend = backend
            row.append(best_ms(step, reps))
        print(f"| {name} | {row[0]:.0f} | {row[1]:.0f} | {row[0] / row[1]:.1f}x |", flush=True)


def forced_boxes(args):
    """The layers table's tiled columns with each of ``--boxes`` forced as the query box."""
    from nattn.backends import tiled_plan

    model = tiled_plan.box_sizes
    dtype = getattr(torch, args.dtype)
    names = [n for n in PROBLEMS if not args.only or n in args.only.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}; tiled ms (best of {args.reps})")
    print("| problem | box | rows | keys a box | fwd | f+b | the cost model's |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        spec = PROBLEMS[name]
        spatial, n = tuple(spec["spatial"]), len(spec["spatial"])
        if spec.get("dilation", 1) != 1:
            raise SystemExit(f"--boxes: {name} is dilated (its boxes are per dilation group); pick undilated ones")
        kernel = spec["kernel"] if isinstance(spec["kernel"], tuple) else (spec["kernel"],) * n
        axes = (kernel, (1,) * n, (False,) * n)
        chosen = model(spatial, *axes)
        for text in args.boxes.split(","):
            box = tuple(int(x) for x in text.split("x"))
            if len(box) != n:
                raise SystemExit(f"--boxes {text}: {name} has {n} axes")
            keys = math.prod(tiled_plan.axis_keys(*a, b) for a, b in zip(zip(spatial, *axes), box))
            tiled_plan.box_sizes = lambda *a, box=box: box
            tiled_plan.boxes_for.cache_clear()
            tiled_plan.KEPT.clear()
            try:
                _, _, _, tf, tb, *_ = run(name, spec, dtype, args.reps)
            finally:
                tiled_plan.box_sizes = model
                tiled_plan.boxes_for.cache_clear()
            print(f"| {name} | {text} | {math.prod(box)} | {keys} | {tf:.2f} | {tb:.2f} | "
                  f"{'x'.join(map(str, chosen))} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--models", default="", help="timm model names: time them instead of single layers")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--train", action="store_true", help="with --models: a training step instead of inference")
    ap.add_argument("--unfused", action="store_true",
                    help="time na*d_qk + softmax + na*d_av (tiled boxes against window gathers) instead")
    ap.add_argument("--boxes", default="",
                    help="query boxes to force on the tiled backend, e.g. 4x4,4x8 (one table per box; "
                         "the cost model's choice is tiled_plan.box_sizes)")
    args = ap.parse_args()
    if args.boxes:
        return forced_boxes(args)
    if args.models:
        return models(args.models.split(","), args.batch, args.reps, args.train)
    dtype = getattr(torch, args.dtype)
    names = [n for n in PROBLEMS if not args.only or n in args.only.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}; ms (best of {args.reps})")
    if args.unfused:
        print("| problem | gathers fwd | gathers f+b | tiled fwd | tiled f+b |")
        print("|---|---|---|---|---|")
        for name in names:
            n, gf, gb, tf, tb = run_unfused(name, PROBLEMS[name], dtype, args.reps)
            print(f"| {n} | {gf:.2f} | {gb:.2f} | {tf:.2f} | {tb:.2f} |", flush=True)
        return
    print("| problem | reference fwd | reference f+b | tiled fwd | tiled f+b | speedup fwd / f+b | "
          "tiled fwd GFLOP/s | dense SDPA fwd | tiled f+b page faults |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        n, rf, rb, tf, tb, flt, dense, gflop = run(name, PROBLEMS[name], dtype, args.reps)
        print(f"| {n} | {rf:.2f} | {rb:.2f} | {tf:.2f} | {tb:.2f} | {rf / tf:.1f}x / {rb / tb:.1f}x | "
              f"{gflop / tf * 1e3:.1f} | {dense:.2f} | {flt:.0f} |", flush=True)


if __name__ == "__main__":
    main()
