"""What one eager training step of a timm model asks of the host: its wall time, its GPU
kernels, its autograd nodes and the CUDA runtime calls it makes (launches, memsets,
allocations), side by side for several models (bf16 autocast, channels-last, SGD with
momentum; one step under torch's profiler after three unprofiled ones):

    python benchmarks/step_launches.py --models nat_tiny,swin_tiny_patch4_window7_224
    python benchmarks/step_launches.py --models nat_mini --device cpu -b 1 --size 64   # a smoke run

A host-bound eager step's wall time is the host's work on these: each launch costs the host
a few microseconds, each autograd node more. On the CPU the runtime-call columns are empty
and the step's top-level aten ops are counted instead.

``--host`` also tells whether the step waits on the host: the host's milliseconds a step
when the steps are only launched (no synchronization: the CPU runs ahead of the GPU unless it
is the slower side), and the step's wall time with the backward on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``) instead of autograd's device thread,
which charges every backward node more host time on some machines.

    python benchmarks/step_launches.py --models nat_tiny,swin_tiny_patch4_window7_224 --host
"""

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

import nattn  # noqa: F401  (registers the timm models)
from nattn.bench.models import create_model, steps
from nattn.bench.timing import launch_only_ms, window_ms

RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemsetAsync", "cudaMemcpyAsync",
                 "cudaMallocAsync", "cudaFreeAsync")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile_step(step, device) -> dict:
    """Counts of one step: GPU kernels, autograd nodes, top-level aten ops and each runtime call
    (with its mean host microseconds under the profiler, which inflates them)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync(device)
    counts = collections.Counter()
    host_us = collections.Counter()
    for e in prof.events():
        name = e.name
        if e.device_type.name == "CUDA":
            counts["kernels"] += 1
        elif name.startswith("autograd::engine::evaluate_function"):
            counts["autograd nodes"] += 1
        elif name in RUNTIME_CALLS:
            counts[name] += 1
            host_us[name] += e.cpu_time_total
        elif name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            counts["top-level aten ops"] += 1
    return {"counts": counts, "host_us": host_us}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="nat_tiny,swin_tiny_patch4_window7_224",
                    help="comma-separated timm model names")
    ap.add_argument("-b", "--batch", type=int, default=128)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--iters", type=int, default=5, help="timed steps after the profiled one")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--host", action="store_true",
                    help="also the host's ms a step when only launching, and the wall time with the "
                         "backward on the calling thread")
    args = ap.parse_args()
    device = torch.device(args.device)
    for name in args.models.split(","):
        model = create_model(name).to(device).to(memory_format=torch.channels_last).train()
        x = torch.randn(args.batch, 3, args.size, args.size, device=device).to(memory_format=torch.channels_last)
        y = torch.randint(0, model.num_classes, (args.batch,), device=device)
        step = steps(model, x, y, device, momentum=0.9)[0]
        for _ in range(3):
            step()
        found = profile_step(step, device)
        ms = window_ms(step, device, args.iters)
        counts, host_us = found["counts"], found["host_us"]
        print(f"{name}: wall {ms:.1f} ms a step, {counts['kernels']} GPU kernels, "
              f"{counts['autograd nodes']} autograd nodes, {counts['top-level aten ops']} top-level aten ops")
        for call in RUNTIME_CALLS:
            if counts[call]:
                print(f"    {call} x{counts[call]}, {host_us[call] / counts[call]:.1f} us each (profiled)")
        if args.host:
            launch = launch_only_ms(step, device, args.iters)
            with torch.autograd.set_multithreading_enabled(False):
                step()
                calling = window_ms(step, device, args.iters)
            print(f"    host {launch:.1f} ms a step launched without waiting (wall {ms:.1f}: "
                  f"{'host-bound' if launch >= 0.9 * ms else 'the GPU is the slower side'}); "
                  f"backward on the calling thread: wall {calling:.1f} ms a step")
        del model, step


if __name__ == "__main__":
    main()
