"""Context-parallel NA (nattn.distributed: na_ulysses, head-parallel, and na_halo, key/value
halos) on several GPUs of one host against one GPU, per layer: HunyuanVideo-sized 3-D
(30x48x80, 24 heads, D128, window 18x24x24, bf16) sharded along one axis. ms per call (CUDA
events, medians of 5 after 2 warm-ups), forward and forward + backward, with the speedup over
one GPU and the peak memory per GPU.

    python benchmarks/distributed_na.py [--gpus 2] [--spatial 30,48,80] [--kernel 18,24,24]
        [--schemes ulysses,ulysses:3,halo,halo-overlap] [--axis 0] [--profile]

A scheme `ulysses:C` runs na_ulysses with chunks=C (each rank's heads in C rounds, every
round's all-to-all issued before the first local NA, so communication overlaps compute);
`halo-overlap` runs na_halo with overlap=True (the interior queries while the halo travels).

--profile also prints rank 0's torch.profiler table of three forwards per scheme (kernels,
collectives and copies, grouped by input shape): where the time beyond the local NA goes.
"""

import argparse
import os
import socket
import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import nattn
from nattn.distributed import na_halo, na_ulysses, shard


def timed(fn, reps=5, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier() if dist.is_initialized() else None
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def problem(args):
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, *args.spatial, args.heads, args.dim)
    return [torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3)]


def one_gpu(args):
    q, k, v = (t.requires_grad_(True) for t in problem(args))
    na = lambda: nattn.na3d(q, k, v, args.kernel)  # noqa: E731
    torch.cuda.reset_peak_memory_stats()
    fwd = timed(lambda: na().detach())
    g = torch.randn_like(q)
    both = timed(lambda: na().backward(g))
    return fwd, both, torch.cuda.max_memory_allocated() / 2**30


def worker(rank, world, port, args, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    q, k, v = (shard(t, args.axis).contiguous().requires_grad_(True) for t in problem(args))
    name, _, chunks = args.scheme.partition(":")
    scheme = {"ulysses": na_ulysses, "halo": na_halo, "halo-overlap": na_halo}[name]
    kw = dict(chunks=int(chunks)) if chunks else dict(overlap=True) if name == "halo-overlap" else {}
    na = lambda: scheme(q, k, v, args.kernel, na_dim=3, axis=args.axis, **kw)  # noqa: E731
    torch.cuda.reset_peak_memory_stats()
    fwd = timed(lambda: na().detach())
    g = torch.randn_like(q)
    both = timed(lambda: na().backward(g))
    results[rank] = (fwd, both, torch.cuda.max_memory_allocated() / 2**30)
    if args.profile:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.no_grad(), torch.profiler.profile(activities=acts, record_shapes=True) as prof:
            for _ in range(3):
                na()
            torch.cuda.synchronize()
        if rank == 0:
            print(prof.key_averages(group_by_input_shape=True).table(
                sort_by="cuda_time_total", row_limit=16, max_name_column_width=40, max_shapes_column_width=110))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--spatial", default="30,48,80")
    ap.add_argument("--kernel", default="18,24,24")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--schemes", default="ulysses,ulysses:3,halo,halo-overlap",
                    help="ulysses, ulysses:CHUNKS, halo, halo-overlap")
    ap.add_argument("--axis", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="rank 0's profile of three forwards per scheme")
    a = ap.parse_args()
    a.spatial = tuple(int(x) for x in a.spatial.split(","))
    a.kernel = tuple(int(x) for x in a.kernel.split(","))
    f1, b1, m1 = one_gpu(a)
    print(f"1 GPU: forward {f1:.2f} ms, forward+backward {b1:.2f} ms, peak {m1:.2f} GiB", flush=True)
    for scheme in a.schemes.split(","):
        a.scheme = scheme
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        results = mp.Manager().dict()
        mp.spawn(worker, args=(a.gpus, port, a, results), nprocs=a.gpus, join=True)
        fn = max(r[0] for r in results.values())
        bn = max(r[1] for r in results.values())
        mn = max(r[2] for r in results.values())
        print(f"{a.gpus} GPUs ({scheme}, axis {a.axis}): forward {fn:.2f} ms ({f1 / fn:.2f}x), forward+backward "
              f"{bn:.2f} ms ({b1 / bn:.2f}x), peak {mn:.2f} GiB per GPU ({mn / m1:.2f} of one GPU's)", flush=True)


if __name__ == "__main__":
    main()
