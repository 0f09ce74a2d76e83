"""End-to-end step time of nattn's timm models, one NA backend at a time: what a user of
`timm.create_model("dinat_tiny")` sees, not one kernel. bf16 autocast on CUDA.

    python benchmarks/model_throughput.py                                  # dinat_tiny, nat_tiny, video
    python benchmarks/model_throughput.py --models dinat_tiny -b 64 --backends cuda flex
    python benchmarks/model_throughput.py --device cpu --models nat_mini -b 1 --size 64 --backends reference
"""

import argparse

import timm
import torch

import nattn
from nattn.bench.models import step_ms as timed, steps
from nattn.nn.neighborhood_attention import NeighborhoodAttentionND


def set_backend(model, backend):
    for m in model.modules():
        if isinstance(m, NeighborhoodAttentionND):
            m.backend = backend


def run(name, backend, args, device):
    model = timm.create_model(name, num_classes=10).to(device)
    set_backend(model, None if backend == "auto" else backend)
    size = (3, args.frames, args.size, args.size) if "video" in name else (3, args.size, args.size)
    x = torch.randn(args.batch, *size, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    train, infer = steps(model, x, y, device)
    model.eval()
    t_inf = timed(infer, device, args.iters)
    model.train()
    t_train = timed(train, device, args.iters)
    print(f"| {name} | {backend} | {args.batch} | {t_inf:.2f} | {args.batch / t_inf * 1e3:.0f} | "
          f"{t_train:.2f} | {args.batch / t_train * 1e3:.0f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["dinat_tiny", "nat_tiny", "dinat_video_tiny"])
    ap.add_argument("--backends", nargs="+", default=["auto", "cuda", "flex"])
    ap.add_argument("-b", "--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224, help="image side (video: per frame)")
    ap.add_argument("--frames", type=int, default=16, help="video clip length")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"# {name}, torch {torch.__version__}, nattn {nattn.__version__}; ms per step (mean of {args.iters} "
          "after 3 warm-up steps), bf16 autocast on CUDA")
    print("| model | NA backend | batch | inference ms | images/s | train step ms | images/s |")
    print("|---|---|---|---|---|---|---|")
    for m in args.models:
        for backend in args.backends:
            try:
                run(m, backend, args, device)
            except Exception as e:  # a backend that cannot run a model is a row, not a crash
                print(f"| {m} | {backend} | {args.batch} | failed: {type(e).__name__}: {str(e)[:80]} | | | |")
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
