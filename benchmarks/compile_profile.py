"""Where a timm NA model's step goes, eager beside torch.compile: step time, the top CUDA
kernels of one step (torch.profiler), nattn op calls and the copies around them, and
dynamo's graph breaks. bf16 autocast, channels-last, SGD step, on CUDA.

    python benchmarks/compile_profile.py                       # nat_tiny, batch 64
    python benchmarks/compile_profile.py --model dinat_s_tiny -b 128 --mode infer
"""

import argparse
import time

import timm
import torch
from torch.profiler import ProfilerActivity, profile

import nattn  # noqa: F401  (registers the timm models)
from nattn.bench.models import step_ms, steps


def make_step(model, x, y, mode):
    train, infer = steps(model, x, y, torch.device("cuda"))
    return train if mode == "train" else infer


def timed(fn, iters):
    return step_ms(fn, torch.device("cuda"), iters)


def top_kernels(fn, n):
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        cuda_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        rows.append((cuda_us, e.count, e.key))
    kernels = sorted((r for r in rows if r[0] > 0), reverse=True)
    total = sum(r[0] for r in kernels if not r[2].startswith(("aten::", "nattn::", "cuda", "Torch", "autograd",
                                                                 "Optimizer", "CompiledFunction")))
    print(f"  device time of listed kernels: {total / 1e3:.2f} ms")
    for us, count, key in kernels[:n]:
        print(f"  {us / 1e3:9.3f} ms  {count:5d}x  {key[:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nat_tiny")
    ap.add_argument("-b", "--batch", type=int, default=64)
    ap.add_argument("--mode", choices=("train", "infer"), default="train")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--top", type=int, default=18)
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
    top_kernels(eager, a.top)

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
    top_kernels(compiled, a.top)


if __name__ == "__main__":
    main()
