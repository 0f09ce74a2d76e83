"""A/B of one switch on a timm NA model's eager training step (or inference forward, --mode
infer), in one process, alternating rounds (bf16 autocast, channels-last, SGD; CUDA). Each
row: wall ms a step (the median of three windows, `nattn.bench.models.step_ms`) and the
step's GPU time (its kernels under torch's profiler, `kernel_ms`), which a slow or busy host
does not move.

    python benchmarks/model_step_ab.py --switch threads      # autograd's device thread on / off
    python benchmarks/model_step_ab.py --switch packed       # the modules' packed qkv call on / off
    python benchmarks/model_step_ab.py --switch fast-norm    # timm's fast norm (bf16 LayerNorm) on / off
    python benchmarks/model_step_ab.py --switch block-norm   # the blocks' norms at the autocast dtype / float32
    python benchmarks/model_step_ab.py --switch group-casts  # grouped parameter casts / autocast's own
    python benchmarks/model_step_ab.py --switch norm-kernel --mode infer  # libnattn's LayerNorm / torch's
    python benchmarks/model_step_ab.py --switch drop-draw    # one stochastic-depth draw a step / one a block
    python benchmarks/model_step_ab.py --switch packed-calls # the cuda backend's packed-qkv calls / the views'
    python benchmarks/model_step_ab.py --switch fused-add --mode infer  # residual add fused into norm2 / not
    python benchmarks/model_step_ab.py --switch packed --model dinat_tiny -b 128 --rounds 3
    python benchmarks/model_step_ab.py --switch group-casts --compile  # both sides under torch.compile
    python benchmarks/model_step_ab.py --switch packed --device cpu --model nat_mini -b 1 --size 64 --iters 1
                                                             # a smoke run of the script

threads: ``torch.autograd.set_multithreading_enabled`` around the step (off: the backward
runs on the calling thread instead of autograd's CUDA device thread); packed:
``nattn.functional.na_packed_qkv`` as is, or declining (the q/k/v path); fast-norm: the
model built after ``timm.layers.set_fast_norm(True)`` (a second model with the same weights);
block-norm: the default model (the blocks' norm1 / norm2 at the autocast dtype) against one
built with ``fp32_block_norms=True`` (same weights); group-casts: the model's ``group_casts``
attribute (the blocks' parameters cast in a few grouped ops per forward, or one op each);
norm-kernel: ``NATTN_LAYER_NORM_KERNEL`` unset or 0 (the norms on libnattn's forward kernel where
no gradient is recorded, or torch's kernel; a training step records gradients, so only
``--mode infer`` differs); drop-draw: the model's ``one_drop_path_draw`` attribute (the
blocks' stochastic-depth masks from one draw a forward, or one draw per block; training only);
packed-calls: ``nattn.backends.cuda.PACKED_CALLS`` (the cuda backend's calls on a packed qkv
by template and offsets, or through the q / k / v views; ``NATTN_PACKED_CALLS=0``); fused-add:
``NATTN_FUSED_ADD_NORM`` unset or 0 (each block's residual add fused into its norm2's kernel
where the norms run libnattn's, or torch's add; inference only).
"""

import argparse
import contextlib
import os

import torch

import nattn  # noqa: F401  (registers the timm models)
import nattn.nn.neighborhood_attention as na_module
from nattn.backends import cuda as cuda_backend
from nattn.bench.models import create_model, kernel_ms, step_ms, steps

SWITCHES = ("threads", "packed", "fast-norm", "block-norm", "group-casts", "norm-kernel", "drop-draw",
            "packed-calls", "fused-add")


def build(name, device, fast_norm=False, state=None, **kwargs):
    torch.manual_seed(0)
    model = create_model(name, fast_norm, **kwargs)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device).to(memory_format=torch.channels_last).train()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", choices=SWITCHES, required=True)
    ap.add_argument("--model", default="nat_tiny")
    ap.add_argument("-b", "--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10, help="steps per timing window")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--mode", choices=("train", "infer"), default="train",
                    help="infer: a forward under torch.no_grad in eval mode")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true",
                    help="each side under torch.compile (one compile per side, the first step untimed)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    x = torch.randn(args.batch, 3, args.size, args.size, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch,), device=dev)
    base = build(args.model, dev)
    # the "off" side of block-norm, the "on" side of fast-norm: a second model with base's weights
    other = (build(args.model, dev, fast_norm=True, state=base.state_dict()) if args.switch == "fast-norm"
             else build(args.model, dev, state=base.state_dict(), fp32_block_norms=True)
             if args.switch == "block-norm" else None)
    packed = na_module.na_packed_qkv
    packed_calls = cuda_backend.PACKED_CALLS
    compiled = {}  # per model: its torch.compile wrapper (a side's switch recompiles once, then hits)

    def configured(on):
        """(train step, context) of one side of the switch."""
        model = other if (args.switch == "fast-norm" and on) or (args.switch == "block-norm" and not on) else base
        na_module.na_packed_qkv = packed if (args.switch != "packed" or on) else (lambda *a, **k: None)
        ctx = (torch.autograd.set_multithreading_enabled(on) if args.switch == "threads"
               else contextlib.nullcontext())
        model.train(args.mode == "train")
        if args.switch == "group-casts":
            model.group_casts = on
        if args.switch == "drop-draw":
            model.one_drop_path_draw = on
        if args.switch == "packed-calls":
            cuda_backend.PACKED_CALLS = on
        if args.switch == "norm-kernel":
            os.environ["NATTN_LAYER_NORM_KERNEL"] = "1" if on else "0"
        if args.switch == "fused-add":
            os.environ["NATTN_FUSED_ADD_NORM"] = "1" if on else "0"
        if args.compile:
            model = compiled.setdefault(id(model), torch.compile(model))
        return steps(model, x, y, dev)[args.mode == "infer"], ctx

    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"{args.model}, batch {args.batch}, {where}, torch {torch.__version__}: "
          f"--switch {args.switch}, {args.mode}{', compiled' if args.compile else ''}")
    try:
        for r in range(args.rounds):
            for on in (True, False):
                train, ctx = configured(on)
                with ctx:
                    ms = step_ms(train, dev, args.iters, repeats=3, warmup_s=1.0 if dev.type == "cuda" else 0.0)
                    gpu = kernel_ms(train, dev)
                gpu_text = "-" if gpu is None else f"{gpu:6.2f} ms"
                print(f"  round {r + 1} {args.switch}={'on' if on else 'off':<3} {ms:7.2f} ms a step "
                      f"({args.batch / ms * 1e3:6.1f} img/s), GPU time {gpu_text}", flush=True)
    finally:
        na_module.na_packed_qkv = packed
        cuda_backend.PACKED_CALLS = packed_calls


if __name__ == "__main__":
    main()
