"""Timing: medians of per-call device timings after warm-up, rotating input sets when the
data would otherwise sit in L2 (repeated calls on one buffer measure the cache)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Optional, Sequence

import torch


def l2_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))
    return 32 << 20  # a generous CPU last-level cache


def rotation_count(bytes_per_set: int, device: torch.device, limit: int = 8) -> int:
    """How many input sets to rotate so that one call's data is not left in cache by the last."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(limit, -(-3 * l2_bytes(device) // bytes_per_set)))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window_ms(fn: Callable, device: torch.device, iters: int) -> float:
    """Mean milliseconds of ``fn()`` over one window of ``iters`` back-to-back calls (CUDA
    events around the window on CUDA, wall clock elsewhere): for steps too long to time one
    by one, e.g. a model's training step."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t) / iters * 1e3


def launch_only_ms(fn: Callable, device: torch.device, iters: int) -> float:
    """Wall milliseconds a call of ``iters`` calls issued back to back after one synchronize,
    with none inside: the host's time a call (of a model's step, say) unless the GPU is the
    slower side and its queue fills up. Beside ``window_ms`` it tells which side a step waits on."""
    _sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    ms = (time.perf_counter() - t) / iters * 1e3
    _sync(device)
    return ms


def median_ms(fn: Callable, input_sets: Sequence, device: torch.device,
              warmup_ms: float = 30.0, target_ms: float = 300.0, min_reps: int = 3, max_reps: int = 100,
              graphs: bool = False) -> float:
    """Median milliseconds of ``fn(*input_sets[i % n])``: CUDA events per call on a GPU,
    ``perf_counter`` after a synchronize elsewhere. Warm-up runs at least 2 calls and
    ``warmup_ms``; the repetition count then aims at ``target_ms`` of timed work.

    ``graphs`` (CUDA): each input set's call is captured once into a CUDA graph and the
    replays are timed, so the number is the GPU's time without the host's launch cost (a
    small problem's kernels finish before Python has issued the next call)."""
    n = len(input_sets)
    i = 0
    start = time.perf_counter()
    calls = 0
    while calls < 2 or (time.perf_counter() - start) * 1e3 < warmup_ms:
        fn(*input_sets[i % n]); i += 1; calls += 1
        _sync(device)
    per_call = (time.perf_counter() - start) * 1e3 / calls
    reps = int(max(min_reps, min(max_reps, target_ms / max(per_call, 1e-3))))
    times = []
    if graphs and device.type == "cuda":
        replays = _captured(fn, input_sets, device)
        n, fn, input_sets = len(replays), (lambda g: g.replay()), [(g,) for g in replays]
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in events:
            a.record(); fn(*input_sets[i % n]); b.record(); i += 1
        torch.cuda.synchronize(device)
        times = [a.elapsed_time(b) for a, b in events]
    else:
        for _ in range(reps):
            t0 = time.perf_counter(); fn(*input_sets[i % n]); i += 1
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def family_ms(family: Optional[str], fn: Callable, target_ms: float = 300.0) -> Optional[float]:
    """GPU ms of ``fn()`` (CUDA-graph replays, ``median_ms``) with libnattn's family cap
    NATTN_FAMILY (read on every call) set to ``family`` (None: unset, the default rules), or
    None where the forced family declines the problem. NATTN_FAMILY is unset afterwards."""
    if family is not None:
        os.environ["NATTN_FAMILY"] = family
    try:
        return median_ms(fn, [()], torch.device("cuda"), target_ms=target_ms, graphs=True)
    except (RuntimeError, ValueError):
        return None
    finally:
        os.environ.pop("NATTN_FAMILY", None)


def _captured(fn: Callable, input_sets: Sequence, device: torch.device) -> list:
    """One CUDA graph per input set, each holding one call of ``fn`` (warmed up on a side
    stream first, as capture requires)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for inputs in input_sets:
            fn(*inputs)
    torch.cuda.current_stream(device).wait_stream(side)
    graphs = []
    for inputs in input_sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(*inputs)
        graphs.append(g)
    _sync(device)
    return graphs
