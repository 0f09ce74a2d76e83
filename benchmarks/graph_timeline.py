"""Where one call's GPU time goes inside a CUDA graph: each kernel's mean duration and the
span from the first kernel's start to the last one's end, per backend configuration.

    python benchmarks/graph_timeline.py -i 4096 -w 2048 -n 2 -d 128 --backend cuda:kv=1 --backend cuda:kv=2
    python benchmarks/graph_timeline.py -i 32768 -w 2048 -n 8 -d 128 --backprop

The forward only (no grad) unless --backprop (forward + backward, `torch.autograd.grad` with a
fixed output gradient, as `python -m nattn.bench --backprop` times it: every kernel, copy and
fill the call runs is listed), bf16, batch 1 unless -b; `-w` per axis like `-i`. The span
minus the kernels' sum is the time between them (graph node launch latency).
"""

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import nattn

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def timeline(args, backend, calls=20, replays=5):
    shape = (args.b, *args.i, args.n, args.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=args.backprop)
               for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    window = args.w * len(args.i) if len(args.w) == 1 else args.w
    fn = FUNCS[len(args.i)]

    def call():
        if args.backprop:
            return torch.autograd.grad(fn(q, k, v, tuple(window), backend=backend), (q, k, v), grad)
        with torch.no_grad():
            return fn(q, k, v, tuple(window), backend=backend)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    per_call_us = start.elapsed_time(end) * 1e3 / (replays * calls)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and e.time_range.elapsed_us() > 0), key=lambda e: e.time_range.start)
    by_name = defaultdict(list)
    for e in kernels:
        by_name[e.name].append(e.time_range.elapsed_us())
    span = (kernels[-1].time_range.end - kernels[0].time_range.start) / calls if kernels else 0.0
    busy = sum(e.time_range.elapsed_us() for e in kernels) / calls
    print(f"{backend}: {per_call_us:.1f} us per call (graph replays); profiled span {span:.1f} us, "
          f"kernels {busy:.1f} us, between them {span - busy:.1f} us")
    for name, d in sorted(by_name.items(), key=lambda x: -sum(x[1])):
        print(f"    {len(d) / calls:4.1f} x {sum(d) / len(d):7.2f} us  {name[:100]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-i", type=int, nargs="+", required=True, help="spatial extent per axis")
    ap.add_argument("-w", type=int, nargs="+", required=True, help="window per axis (one value: every axis)")
    ap.add_argument("-n", type=int, default=2, help="heads")
    ap.add_argument("-d", type=int, default=128, help="head dim")
    ap.add_argument("-b", type=int, default=1, help="batch")
    ap.add_argument("--backend", action="append", default=None, help="backend configuration (repeatable)")
    ap.add_argument("--backprop", action="store_true", help="forward + backward (default: the forward alone)")
    args = ap.parse_args()
    for backend in args.backend or ["cuda"]:
        timeline(args, backend)


if __name__ == "__main__":
    main()
