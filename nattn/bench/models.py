"""``python -m nattn.bench --suite models``: timm models end to end, nattn's NA models beside
timm's Swin-T and ConvNeXt-T of the same FLOPs, training and inference images per second,
eager and under ``torch.compile``, in one process.

A training step is forward, cross-entropy, backward and an SGD step; inference is a forward
under ``torch.no_grad``. On CUDA: bf16 autocast and channels-last inputs (what a user trains
with); on the CPU: fp32. Times are CUDA-event (or wall-clock on the CPU) means over ``--iters``
steps after three warm-up steps (which absorb compilation); on CUDA, the median of five such
windows after at least a second of warm-up steps. On CUDA the table also gives each rate at
the step's GPU time (its kernels under torch's profiler): a host-bound step's wall time
follows the host's speed, its GPU time does not.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import torch

from .timing import window_ms

# The NA families at Tiny size (video: clips of `frames` frames), then the peers (timm's own).
DEFAULT_MODELS = ("nat_tiny", "dinat_tiny", "dinat_s_tiny", "nat_isotropic_small", "dinat_video_tiny",
                  "swin_tiny_patch4_window7_224", "convnext_tiny")
# compiled: torch.compile(model); cudagraphs: torch.compile(model, mode="reduce-overhead")
# (CUDA graphs replay each compiled graph: no per-kernel launch cost on the host)
MODES = ("eager", "compiled", "cudagraphs")


def steps(model, x, y, device, graphs: bool = False, momentum: float = 0.0):
    """``(train, infer)``: one SGD training step (with ``momentum``) and one inference forward
    of ``model`` on ``x`` / labels ``y`` (bf16 autocast on CUDA). ``graphs``: the model is
    compiled with CUDA graphs, and each step tells torch that a new iteration begins."""
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=momentum)
    begin = torch.compiler.cudagraph_mark_step_begin if graphs else (lambda: None)

    def train():
        begin()
        with amp:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        begin()
        with torch.no_grad(), amp:
            model(x)

    return train, infer


def step_ms(fn, device, iters: int, repeats: int = 1, warmup_s: float = 0.0) -> float:
    """Milliseconds per call of ``fn``: the median over ``repeats`` windows of ``iters`` calls
    (each window's mean, `timing.window_ms`), after three warm-up calls and then more until
    ``warmup_s`` seconds have passed (an idle GPU's clocks take a while to ramp up; one short
    window read 30% apart between runs of the same model)."""
    t = time.perf_counter()
    done = 0
    while done < 3 or time.perf_counter() - t < warmup_s:
        fn()
        done += 1
        if device.type == "cuda" and done >= 3:
            torch.cuda.synchronize()
    windows = sorted(window_ms(fn, device, iters) for _ in range(max(1, repeats)))
    return windows[len(windows) // 2]


def kernel_ms(fn, device) -> Optional[float]:
    """GPU time of one call of ``fn`` (after one unprofiled call): the sum of its kernels'
    and copies' durations under torch's profiler, which a slow or busy host does not change
    (a host-bound step's wall time does); None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    return sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
               for e in events) / 1e3


# On CUDA each (model, mode) is timed as the median of this many windows of ``--iters`` steps,
# after at least this many seconds of warm-up steps.
CUDA_REPEATS = 5
CUDA_WARMUP_S = 1.0


def create_model(name: str, fast_norm: bool = False, **kwargs) -> torch.nn.Module:
    """``timm.create_model(name, num_classes=1000, **kwargs)``, with timm's fast-norm switch on
    for its construction when ``fast_norm`` (its norms that are timm's LayerNorms then run at
    the autocast dtype); the switch is off again afterwards."""
    import timm
    from timm.layers import set_fast_norm

    import nattn.models  # noqa: F401  (registers nattn's models with timm)

    set_fast_norm(fast_norm)
    try:
        return timm.create_model(name, num_classes=1000, **kwargs)
    finally:
        set_fast_norm(False)


def measure(name: str, mode: str, batch: int, size: int, iters: int, device: torch.device,
            frames: int = 16, fast_norm: bool = False) -> Dict[str, float]:
    """Images (video models: clips of ``frames`` frames) per second of one model in one mode:
    ``{"train": ..., "infer": ...}``, and on CUDA the same at the step's GPU time
    (``"train_gpu"``, ``"infer_gpu"``: batch / kernel_ms, what the step would reach if the
    host kept up). ``fast_norm``: the model is built under timm's fast-norm switch (its
    norms, where they are timm's LayerNorms, run at the autocast dtype)."""
    torch.manual_seed(0)
    model = create_model(name, fast_norm).to(device)
    video = "video" in name
    x = torch.randn(batch, 3, *((frames,) if video else ()), size, size, device=device)
    if device.type == "cuda":
        fmt = torch.channels_last_3d if video else torch.channels_last
        model = model.to(memory_format=fmt)
        x = x.to(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device=device)
    if mode == "eager":
        run = model
    else:
        run = torch.compile(model, mode="reduce-overhead" if mode == "cudagraphs" else None)
    train, infer = steps(run, x, y, device, graphs=mode == "cudagraphs")
    out = {}
    model.eval()
    cuda = device.type == "cuda"
    repeats, warmup_s = (CUDA_REPEATS, CUDA_WARMUP_S) if cuda else (1, 0.0)
    out["infer"] = batch / step_ms(infer, device, iters, repeats, warmup_s) * 1e3
    gpu = kernel_ms(infer, device)
    if gpu:
        out["infer_gpu"] = batch / gpu * 1e3
    model.train()
    out["train"] = batch / step_ms(train, device, iters, repeats, warmup_s) * 1e3
    gpu = kernel_ms(train, device)
    if gpu:
        out["train_gpu"] = batch / gpu * 1e3
    return out


def _rate(x: float) -> str:
    """Images per second for the table: whole numbers, three digits below 100 (a slow CPU
    run of a video model can be well under one clip per second)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def run_models(models: List[str], modes: List[str], batch: int, size: int, iters: int,
               device: torch.device, plot_path: Optional[str] = None, frames: int = 16,
               echo: Optional[Callable[[str], None]] = None, fast_norm: bool = False) -> str:
    """Measures every (model, mode) and returns the markdown table (and writes the chart);
    ``echo`` gets each row as soon as it is measured (a run cut short keeps what it had)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [f"# {name}, torch {torch.__version__}, batch {batch}, {size}x{size}, "
             f"{'bf16 autocast, channels-last' if device.type == 'cuda' else 'fp32'}"
             f"{', timm fast norm' if fast_norm else ''}; images/s "
             f"(video models: clips of {frames} frames per second)",
             "", "| model | mode | train img/s | inference img/s | at GPU time: train / inference |",
             "|---|---|---|---|---|"]
    results = []
    for model in models:
        for mode in modes:
            try:
                r = measure(model, mode, batch, size, iters, device, frames, fast_norm)
                gpu = (f"{_rate(r['train_gpu'])} / {_rate(r['infer_gpu'])}" if "train_gpu" in r and "infer_gpu" in r
                       else "-")
                lines.append(f"| {model} | {mode} | {_rate(r['train'])} | {_rate(r['infer'])} | {gpu} |")
                results.append((model, mode, r))
            except Exception as e:  # a model that fails is a row with the reason, not a crash
                lines.append(f"| {model} | {mode} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | |")
            if echo is not None:
                echo(lines[-1])
            if device.type == "cuda":
                torch.cuda.empty_cache()
            torch._dynamo.reset()
    if plot_path:
        lines += ["", _plot(results, plot_path)]
    return "\n".join(lines)


def _plot(results, path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot needs matplotlib (pip install 'nattn[bench]'); no chart written"
    if not results:
        return "nothing measured; no chart written"
    models = list(dict.fromkeys(m for m, _, _ in results))
    bars = [(mode, what) for mode in MODES for what in ("train", "infer")]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(models)), 4.5))
    width = 0.8 / len(bars)
    for j, (mode, what) in enumerate(bars):
        xs = [i + j * width for i, m in enumerate(models) for mm, md, _ in results if mm == m and md == mode]
        ys = [r[what] for m in models for mm, md, r in results if mm == m and md == mode]
        if xs:
            ax.bar(xs, ys, width, label=f"{what}, {mode}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))])
    ax.set_xticklabels(models, rotation=20, ha="right")
    ax.set_ylabel("images / s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return f"chart written to {path}"
