"""Where a timm NA model's step goes, eager beside torch.compile: step time, the top CUDA
kernels of one step (torch.profiler), nattn op calls and the copies around them, and
dynamo's graph breaks. bf16 autocast, channels-last, SGD step, on CUDA. For each mode it
also prints the host's time a step when steps are only launched (no synchronization: equal
to the step time when the step waits on the host) and, for training, the step time with the
backward on the calling thread instead of autograd's device thread.

    python benchmarks/compile_profile.py                       # nat_tiny, batch 64
    python benchmarks/compile_profile.py --model dinat_s_tiny -b 128 --mode infer
    python benchmarks/compile_profile.py --model dinat_tiny -b 128 --eager-only
"""

import argparse
import re
import time

import timm
import torch
from torch.profiler import ProfilerActivity, profile

import nattn  # noqa: F401  (registers the timm models)
from nattn.bench.models import step_ms, steps
from nattn.bench.timing import launch_only_ms


def make_step(model, x, y, mode):
    train, infer = steps(model, x, y, torch.device("cuda"))
    return train if mode == "train" else infer


def timed(fn, iters):
    return step_ms(fn, torch.device("cuda"), iters)


def host_lines(fn, ms, iters, mode):
    """The step's host time when only launching, and (training) its time with the backward
    on the calling thread."""
    launched = launch_only_ms(fn, torch.device("cuda"), iters)
    line = f"  host: {launched:.2f} ms a step launched without waiting ({launched / ms:.0%} of the step)"
    if mode == "train":
        with torch.autograd.set_multithreading_enabled(False):
            fn()
            line += f"; backward on the calling thread: {timed(fn, iters):.2f} ms/step"
    print(line)


def _is_kernel(e) -> bool:
    """A GPU activity (kernel, memcpy, memset), not a CPU op with its children's device time."""
    return str(getattr(e, "device_type", "")).endswith("CUDA")


# Runtime calls that make the host wait for the GPU: one per step is the loss read or the
# timer; one per layer makes the step the sum of host and GPU time instead of the larger.
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "cudaMemcpy", "cudaMemcpyAsync")


def top_kernels(fn, n):
    """One profiled step: its wall time beside the GPU's busy time (kernels, copies), the top
    GPU activities, the top CPU ops by their own time, and the host-blocking runtime calls."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3
    events = prof.key_averages()
    kernels = sorted(((e.self_device_time_total, e.count, e.key) for e in events if _is_kernel(e)), reverse=True)
    busy = sum(k[0] for k in kernels) / 1e3
    print(f"  profiled step: {wall:.2f} ms wall, GPU busy {busy:.2f} ms ({busy / wall:.0%}; the rest the GPU"
          " waits for the host)")
    for us, count, key in kernels[:n]:
        print(f"  {us / 1e3:9.3f} ms  {count:5d}x  {key[:110]}")
    # launches per step by kind (inductor's numbered kernels pooled): what a host-bound step pays for
    kinds = {}
    for us, count, key in kernels:
        kind = re.sub(r"_\d+$", "", key.split("(")[0])[:70]
        c, t = kinds.get(kind, (0, 0.0))
        kinds[kind] = (c + count, t + us)
    print(f"  launches: {sum(k[1] for k in kernels)} GPU activities; most launched kinds:")
    for kind, (c, us) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:n]:
        print(f"  {c:6d}x  {us / 1e3:8.3f} ms  {kind}")
    cpu = sorted(((e.self_cpu_time_total, e.count, e.key) for e in events if not _is_kernel(e)), reverse=True)
    print(f"  host: top ops by their own CPU time")
    for us, count, key in cpu[:n]:
        print(f"  {us / 1e3:9.3f} ms  {count:5d}x  {key[:110]}")
    syncs = [(e.key, e.count, e.self_cpu_time_total) for e in events if e.key.startswith(_SYNC_CALLS)]
    for key, count, us in syncs:
        print(f"  host waits: {key} {count}x, {us / 1e3:.3f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nat_tiny")
    ap.add_argument("-b", "--batch", type=int, default=64)
    ap.add_argument("--mode", choices=("train", "infer"), default="train")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--eager-only", action="store_true", help="skip dynamo and torch.compile")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = timm.create_model(a.model, num_classes=1000).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device="cuda")
    model.train(a.mode == "train")
    eager = make_step(model, x, y, a.mode)
    print(f"# {a.model}, batch {a.batch}, {a.mode}, torch {torch.__version__}")
    ms = timed(eager, a.iters)
    print(f"eager: {ms:.2f} ms/step, {a.batch / ms * 1e3:.0f} img/s")
    host_lines(eager, ms, a.iters, a.mode)
    top_kernels(eager, a.top)
    if a.eager_only:
        return

    explain = torch._dynamo.explain(model)(x)
    print(f"dynamo: {explain.graph_count} graph(s), {explain.graph_break_count} break(s)")
    for reason in explain.break_reasons[:5]:
        print("  break:", str(reason.reason).strip().splitlines()[0][:160])
    torch._dynamo.reset()
    compiled_model = torch.compile(model)
    compiled = make_step(compiled_model, x, y, a.mode)
    t = time.perf_counter()
    compiled()
    torch.cuda.synchronize()
    print(f"compile (first step): {time.perf_counter() - t:.1f} s")
    ms = timed(compiled, a.iters)
    print(f"compiled: {ms:.2f} ms/step, {a.batch / ms * 1e3:.0f} img/s")
    host_lines(compiled, ms, a.iters, a.mode)
    top_kernels(compiled, a.top)


if __name__ == "__main__":
    main()
