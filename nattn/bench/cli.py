"""Command-line arguments of ``python -m nattn.bench`` and the custom problem they describe."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import List, Optional

import torch

from .problems import SUITES, Problem
from .rows import LAYOUTS

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nattn.bench",
        description="Time nattn against torch's dense SDPA and flex_attention, next to the FLOP and "
                    "memory floors of this machine. Every NA row is first checked against the reference "
                    "on a smaller copy of the problem.",
    )
    src = p.add_argument_group("problems (a suite, or one custom problem from -i ...)")
    src.add_argument("--suite", choices=sorted(SUITES) + ["models"], help="anchors: nine NA problems from DiNAT "
                     "layers to Flux/Hunyuan-size windows and their strided variants (names: docs/performance.md); "
                     "tuning: the anchors plus ten more shapes (small batch, B=1 video, odd head counts, GQA); "
                     "smoke: tiny CPU problems; models: timm NA models beside Swin-T and ConvNeXt-T, train and "
                     "inference images/s, eager and compiled (--models, --size, --modes, -b)")
    src.add_argument("--only", metavar="NAMES", help="comma-separated problem names of the suite to run")
    src.add_argument("-i", "--input-size", type=int, nargs="+", metavar="N", help="spatial size, 1-3 ints")
    src.add_argument("-b", "--batch", type=int, default=None,
                     help="batch (default 1; --suite models: 128 on CUDA, 2 on the CPU)")
    src.add_argument("-n", "--heads", type=int, default=4)
    src.add_argument("--heads-kv", type=int, default=0, help="key/value heads for GQA (default: --heads)")
    src.add_argument("-d", "--dim", type=int, default=64)
    src.add_argument("--dim-v", type=int, default=0, help="value head dim (default: --dim)")
    src.add_argument("-w", "--window", type=int, nargs="+", metavar="K", help="kernel size, 1 or one per axis")
    src.add_argument("-s", "--stride", type=int, nargs="+", default=[1], metavar="S")
    src.add_argument("--dilation", type=int, nargs="+", default=[1], metavar="D")
    src.add_argument("--causal", type=int, nargs="*", metavar="0|1",
                     help="causal on every axis (no value) or per axis (0/1 each)")
    src.add_argument("--add-kv", type=int, default=0, metavar="N", help="extra keys/values for every query")
    src.add_argument("--rpb", action="store_true", help="with a relative positional bias")
    src.add_argument("--dropout", type=float, default=0.0, metavar="P",
                     help="attention dropout probability in [0, 1) for every problem (suites too); the NA "
                     "rows are checked against the reference with the same random draw")
    mdl = p.add_argument_group("--suite models")
    mdl.add_argument("--models", metavar="NAMES", help="comma-separated timm model names (default: nat_tiny, "
                     "dinat_tiny, dinat_s_tiny, nat_isotropic_small, dinat_video_tiny, swin_tiny_patch4_window7_224, "
                     "convnext_tiny)")
    mdl.add_argument("--size", type=int, default=224, help="image side")
    mdl.add_argument("--modes", default="eager,compiled", help="eager, compiled (torch.compile) and/or cudagraphs (torch.compile with "
                          "mode='reduce-overhead'), comma-separated")
    mdl.add_argument("--iters", type=int, default=10, help="timed steps per model and mode")
    mdl.add_argument("--frames", type=int, default=16, help="clip length of the video models")
    mdl.add_argument("--fast-norm", action="store_true",
                     help="build every model under timm.layers.set_fast_norm(True): norms that are timm's "
                          "LayerNorms (nattn's models, ConvNeXt) run at the autocast dtype")
    run = p.add_argument_group("what to run")
    run.add_argument("--dtype", choices=sorted(DTYPES), help="default: bf16 on CUDA, fp32 on CPU")
    run.add_argument("--backprop", action="store_true", help="also time forward+backward")
    run.add_argument("--tf32", action="store_true",
                     help="float32 problems: turn on PyTorch's TF32 switch "
                          "(torch.set_float32_matmul_precision('high')) for every row; nattn then runs "
                          "float32 on tensor cores (SM80+) and the check allows TF32's rounding")
    run.add_argument("--backend", action="append", default=[], metavar="NAME",
                     help="also time nattn with this backend (repeatable); nattn's automatic choice always runs")
    run.add_argument("--layout", choices=LAYOUTS, default=LAYOUTS[0],
                     help="memory layout of nattn's q/k/v: heads-last [B, *spatial, H, D] tensors, or "
                          "heads-first [B, H, *spatial, D] tensors viewed heads-last (SDPA-style code)")
    run.add_argument("--no-peers", action="store_true", help="skip the dense SDPA and flex rows")
    run.add_argument("--cuda-graphs", action="store_true",
                     help="time CUDA-graph replays of each call: the GPU's time without Python's launch "
                          "cost (small problems otherwise measure the host)")
    run.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    run.add_argument("--dry-run", action="store_true",
                     help="list the kernel configurations of each family for the problems (tile pairs of "
                          "the Hopper family, the default, the ones it declines) and exit; no GPU needed")
    run.add_argument("--optimize", action="store_true",
                     help="time every Hopper tile pair that takes the problems (a compute capability 9.0 "
                          "GPU) and print the best beside the default")
    run.add_argument("--config", metavar="NAME",
                     help="run the Hopper family's tile pair NAME (as listed by --dry-run) wherever it applies")
    run.add_argument("--time-budget", type=float, default=0.0, metavar="S",
                     help="stop starting new problems after S seconds (0: no limit)")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="PATH")
    out.add_argument("--csv", metavar="PATH")
    out.add_argument("--plot", metavar="PNG", help="bar chart of times against the floor (needs matplotlib)")
    out.add_argument("--markdown", action="store_true", help="also print a Markdown summary table")
    out.add_argument("--no-progress", action="store_true")
    return p


def _axis_values(values: List[int], n: int, name: str, parser) -> tuple:
    if len(values) == 1:
        return tuple(values) * n
    if len(values) != n:
        parser.error(f"{name} takes 1 or {n} values (one per axis of --input-size), got {values}")
    return tuple(values)


def custom_problem(args, parser) -> Problem:
    if not args.input_size or not 1 <= len(args.input_size) <= 3:
        parser.error("-i/--input-size takes 1 to 3 ints")
    if not args.window:
        parser.error("-w/--window is required with -i/--input-size")
    n = len(args.input_size)
    if args.causal is None:
        causal = (False,) * n
    elif len(args.causal) == 0:
        causal = (True,) * n
    else:
        if any(c not in (0, 1) for c in args.causal):
            parser.error(f"--causal takes 0/1 per axis, got {args.causal}")
        causal = tuple(bool(c) for c in _axis_values(args.causal, n, "--causal", parser))
    for name in ("batch", "heads", "dim"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.heads_kv and args.heads % args.heads_kv:
        parser.error(f"--heads ({args.heads}) must be divisible by --heads-kv ({args.heads_kv})")
    if args.add_kv < 0:
        parser.error(f"--add-kv must be >= 0, got {args.add_kv}")
    kernel = _axis_values(args.window, n, "--window", parser)
    stride = _axis_values(args.stride, n, "--stride", parser)
    dilation = _axis_values(args.dilation, n, "--dilation", parser)
    for a, (L, k, s, d) in enumerate(zip(args.input_size, kernel, stride, dilation)):
        if k < 2 or d < 1 or not 1 <= s <= k or k * d > L:
            parser.error(f"axis {a}: need window >= 2, dilation >= 1, 1 <= stride <= window and "
                         f"window * dilation <= size, got size {L}, window {k}, stride {s}, dilation {d}")
    if args.rpb and (any(k % 2 == 0 for k in kernel) or any(s != 1 for s in stride) or any(causal)):
        parser.error("--rpb needs odd windows, stride 1 and no causal axis")
    return Problem("custom", tuple(args.input_size), args.batch or 1, args.heads, args.dim, kernel,
                   dilation=dilation, stride=stride, causal=causal, heads_kv=args.heads_kv,
                   dim_v=args.dim_v, extra=args.add_kv, rpb=args.rpb)


def parse(argv: Optional[List[str]] = None):
    """Returns ``(args, problems)``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.suite and args.input_size:
        parser.error("give either --suite or -i/--input-size, not both")
    if args.suite == "models":
        from .models import MODES
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or any(m not in MODES for m in modes):
            parser.error(f"--modes takes {', '.join(MODES)} (comma-separated), got {args.modes!r}")
        if args.size < 32 or args.iters < 1 or args.frames < 1 or (args.batch is not None and args.batch < 1):
            parser.error("--size must be >= 32, --iters, --frames and -b >= 1")
        args.modes = modes
        return args, []
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.only and not args.suite:
        parser.error("--only selects problems of a --suite")
    if args.suite:
        problems = list(SUITES[args.suite])
        if args.only:
            wanted = [n.strip() for n in args.only.split(",") if n.strip()]
            unknown = [n for n in wanted if n not in {p.name for p in problems}]
            if unknown:
                parser.error(f"--only: {unknown} not in suite {args.suite}: {[p.name for p in problems]}")
            problems = [p for p in problems if p.name in wanted]
    elif args.input_size:
        problems = [custom_problem(args, parser)]
    else:
        parser.error("nothing to run: give --suite anchors|smoke or a problem with -i/--input-size and -w")
    if args.dropout:
        problems = [replace(p, dropout=args.dropout) for p in problems]
    from nattn.backends import BACKENDS, get

    for name in args.backend:
        try:
            get(name)  # a registered name, or one with a kernel configuration ("cuda:kv=4")
        except (KeyError, ValueError) as e:
            parser.error(f"--backend {name!r}: {e if isinstance(e, ValueError) else 'not registered'}; "
                         f"registered: {sorted(BACKENDS)}")
    if args.device not in (None, "cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda, got {args.device!r}")
    return args, problems
