"""Measured dispatch: time every backend that can run a problem once, then keep the fastest.

The heuristics (``heuristics.py``) order backends from measurements on one GPU; another GPU,
dtype or shape can move the crossovers. With autotuning on, the first automatic call of a
problem signature runs the forward of every backend that accepts it (after one warm-up call,
which also absorbs compilation), and that signature then always goes to the fastest. Off by
default: ``nattn.backends.autotune.enable()`` or ``NATTN_AUTOTUNE=1`` turns it on, and
``NATTN_AUTOTUNE_CACHE=path.json`` keeps the results across processes (keyed by device name).

Never tunes inside ``torch.compile`` or while a CUDA graph is being captured (the heuristic
order decides there), and never times the reference backend when another backend can run the
problem (it is the slow fallback by design).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from typing import Callable, Dict, List, Optional

import torch

_state = {
    "enabled": os.environ.get("NATTN_AUTOTUNE", "") not in ("", "0"),
    "path": os.environ.get("NATTN_AUTOTUNE_CACHE") or None,
    "results": None,  # key -> {"backend": name, "ms": {name: ms}}; loaded lazily
    "errors": {},  # "key backend" -> why that backend failed while being timed
}
REPEATS = 3
# The timer forward times are read with (seconds, monotonic). A module attribute so that tests
# can inject a fake clock instead of relying on sleeps.
_clock: Callable[[], float] = time.perf_counter


def enable(flag: bool = True, cache_path: Optional[str] = None) -> None:
    """Turn measured dispatch on (or off); ``cache_path`` keeps results in a JSON file."""
    _state["enabled"] = bool(flag)
    if cache_path is not None:
        _state["path"] = cache_path
        _state["results"] = None  # reload from the new file


def enabled() -> bool:
    return _state["enabled"]


def clear() -> None:
    """Forget every measured choice (in memory; the cache file is left as it is)."""
    _state["results"] = {}


def results() -> Dict[str, dict]:
    """The measured choices: signature -> ``{"backend": name, "ms": {backend: forward ms}}``."""
    if _state["results"] is None:
        _state["results"] = _load(_state["path"])
    return _state["results"]


def errors() -> Dict[str, str]:
    """Backends that raised while being timed (they are not chosen for that signature)."""
    return _state["errors"]


def _load(path: Optional[str]) -> Dict[str, dict]:
    if not path or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # a corrupt cache is re-measured, never fatal
        return {}


def _save() -> None:
    path = _state["path"]
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(_state["results"], f, indent=1, sort_keys=True)
    os.replace(tmp, path)  # atomic: concurrent processes never read half a file


@functools.lru_cache(maxsize=None)
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _device_name(t: torch.Tensor) -> str:
    return _cuda_name(t.device.index or 0) if t.device.type == "cuda" else t.device.type


def signature(q, k, v, rpb, params) -> str:
    """What the fastest backend can depend on: device, dtype, shapes, window arguments, grads."""
    grads = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, rpb))
    return json.dumps([
        _device_name(q), str(q.dtype), list(q.shape), list(k.shape), list(v.shape),
        None if rpb is None else list(rpb.shape), list(params.kernel_size), list(params.stride),
        list(params.dilation), [bool(c) for c in params.is_causal], grads,
    ])


def active(q) -> bool:
    """Whether this call may be tuned (on, eager, and not capturing a CUDA graph)."""
    if not _state["enabled"] or torch.compiler.is_compiling():
        return False
    return not (q.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def _forward_ms(run: Callable[[], object], cuda: bool) -> float:
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        run()  # warm-up: compilation, caches
        sync()
        best = math.inf
        for _ in range(REPEATS):
            t0 = _clock()
            run()
            sync()
            best = min(best, _clock() - t0)
    return best * 1e3


def measured(q, k, v, rpb, params) -> Optional[str]:
    """The backend measured fastest for this signature, or None when it has not been timed."""
    hit = results().get(signature(q, k, v, rpb, params))
    return hit.get("backend") if isinstance(hit, dict) else None


def choose(candidates: List[str], backends, q, k, v, rpb, params) -> str:
    """Measure ``candidates`` (names whose checks passed) on this problem; the fastest wins."""
    if "reference" in candidates and len(candidates) > 1:
        candidates = [c for c in candidates if c != "reference"]
    if len(candidates) == 1:
        return candidates[0]
    key = signature(q, k, v, rpb, params)
    table = results()
    cuda = q.device.type == "cuda"
    ms = {}
    for name in candidates:
        backend = backends[name]
        try:
            ms[name] = _forward_ms(lambda: backend.na_forward(q, k, v, rpb, params), cuda)
        except Exception as e:  # a backend that fails here is not chosen, and says why
            ms[name] = math.inf
            _state["errors"][f"{key} {name}"] = f"{type(e).__name__}: {e}"[:500]
    if all(math.isinf(t) for t in ms.values()):
        return candidates[0]  # nothing measured: the usual order, whose errors the call will raise
    best = min(candidates, key=lambda n: ms[n])
    table[key] = {"backend": best, "ms": {n: (None if math.isinf(t) else round(t, 4)) for n, t in ms.items()}}
    _save()
    return best
