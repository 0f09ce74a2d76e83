"""Measured dispatch: time every backend and kernel configuration that can run a problem
once, then keep the fastest.

The heuristics (``heuristics.py``) order backends from measurements on one GPU; another GPU,
dtype or shape can move the crossovers, and a backend's own default configuration (the cuda
backend's Hopper tile pair) is a model of the measurements too. With autotuning on, the first
automatic call of a problem signature runs the forward of every backend that accepts it and of
every configuration those backends list (after one warm-up call each, which also absorbs
compilation); a candidate whose output disagrees with the first one's (the heuristic default)
is not chosen. When the call needs gradients, the winner's backward configurations (the
Hopper backward's deterministic dQ pass or its KV-parallel dQ; the latter never when
``torch.use_deterministic_algorithms(True)``) are timed the same way. That signature then
always runs the winner, as a configured backend name (``"cuda:q8x8_k7x16+dq=atomic"``,
kernel_config.py).

Off by default; on per call (``tune=True`` on the functional API and the modules), per block
(``with nattn.autotune():``) or per process (``NATTN_AUTOTUNE=1`` or ``enable()``).
``NATTN_AUTOTUNE_CACHE=path.json`` keeps the results across processes (keyed by device name and
library build; merged with other processes' entries under a lock and written atomically; an
unreadable file is ignored with a warning and rewritten). Never tunes inside ``torch.compile``
or while a CUDA graph is being captured (the heuristic order decides there), and never times
the reference backend when another backend can run the problem (it is the slow fallback by
design).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import logging
import math
import os
import sys
import time
import warnings
from typing import Callable, Dict, Iterator, List, Optional

import torch

from .. import _tf32
from . import kernel_config
from .heuristics import needs_grads

_log = logging.getLogger("nattn.autotune")
# `with nattn.autotune(...)` (None: the process-wide setting decides).
_scoped: contextvars.ContextVar = contextvars.ContextVar("nattn_autotune", default=None)
# Searches with at least this many candidates say so on stderr (NATTN_AUTOTUNE_QUIET=1: never).
PROGRESS_FROM = 4

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


@contextlib.contextmanager
def tuning(flag: bool = True) -> Iterator[None]:
    """Measured dispatch on (or off) for the NA calls inside the block (``nattn.autotune``)."""
    token = _scoped.set(bool(flag))
    try:
        yield
    finally:
        _scoped.reset(token)


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


def _read(path: str) -> Optional[Dict[str, dict]]:
    """The cache file's entries; None when it cannot be read as one JSON object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _load(path: Optional[str]) -> Dict[str, dict]:
    if not path or not os.path.exists(path):
        return {}
    data = _read(path)
    if data is None:  # a corrupt cache is re-measured (and rewritten), never fatal
        warnings.warn(f"nattn.autotune: ignoring the unreadable cache file {path} (not a JSON object); "
                      f"its problems are measured again and the file is rewritten", RuntimeWarning, stacklevel=2)
        return {}
    return data


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive lock on ``path + ".lock"`` (POSIX advisory lock; without fcntl, none)."""
    try:
        import fcntl
    except ImportError:  # Windows: the atomic replace alone (another process's entry may be lost)
        yield
        return
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _save() -> None:
    """Writes this process's results into the cache file, merged with the entries other
    processes wrote since it was loaded (ours win on the same signature), under a lock and
    through an atomic replace: concurrent tuners neither lose each other's results nor ever
    read half a file."""
    path = _state["path"]
    if not path:
        return
    with _locked(path):
        merged = _read(path) or {}  # None for a missing or unreadable file
        merged.update(_state["results"])
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(merged, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


@functools.lru_cache(maxsize=None)
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _device_name(t: torch.Tensor) -> str:
    return _cuda_name(t.device.index or 0) if t.device.type == "cuda" else t.device.type


def _library_id() -> Optional[list]:
    """libnattn's identity (path, size, modification time): a rebuild is re-measured."""
    from .._cuda import library
    lib = library.load()
    if lib is None:
        return None
    try:
        st = os.stat(lib.path)
        return [lib.path, st.st_size, st.st_mtime_ns]
    except OSError:
        return [lib.path]


def deterministic(flag: Optional[bool] = None) -> bool:
    """A call's determinism: its own ``deterministic=`` word, else torch's global switch."""
    return torch.are_deterministic_algorithms_enabled() if flag is None else bool(flag)


def signature(q, k, v, rpb, params, det: Optional[bool] = None) -> str:
    """What the fastest backend can depend on: device, library build, dtype, shapes and
    strides, window arguments, grads, determinism, and for float32 whether torch allows TF32
    (libnattn's tensor-core TF32 kernels run then; the key of other calls is as before)."""
    tf32 = ["tf32"] if q.dtype == torch.float32 and _tf32.allowed() else []
    return json.dumps([
        _device_name(q), _library_id() if q.device.type == "cuda" else None, str(q.dtype),
        list(q.shape), list(k.shape), list(v.shape), [list(t.stride()) for t in (q, k, v)],
        None if rpb is None else list(rpb.shape), list(params.kernel_size), list(params.stride),
        list(params.dilation), [bool(c) for c in params.is_causal], needs_grads(q, k, v, rpb),
        deterministic(det), *tf32,
    ])


def active(q, tune: Optional[bool] = None) -> bool:
    """Whether this call may be tuned: asked for (``tune``, else ``with nattn.autotune()``,
    else the process-wide setting), eager, and not capturing a CUDA graph."""
    on = tune if tune is not None else _scoped.get()
    if on is None:
        on = _state["enabled"]
    if not on or torch.compiler.is_compiling():
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


def measured(q, k, v, rpb, params, det: Optional[bool] = None) -> Optional[str]:
    """The backend measured fastest for this signature, or None when it has not been timed."""
    hit = results().get(signature(q, k, v, rpb, params, det))
    return hit.get("backend") if isinstance(hit, dict) else None


def _agrees(out: torch.Tensor, ref: torch.Tensor) -> Optional[float]:
    """None when ``out`` matches the default candidate's ``ref`` (relative L2 error within the
    dtype's tolerance, nothing non-finite where ref is finite), else the error."""
    tol = {torch.float16: 5e-3, torch.bfloat16: 2e-2}.get(ref.dtype, 1e-4)
    if ref.dtype == torch.float32 and _tf32.allowed():  # TF32 products (10-bit mantissa operands)
        tol = 5e-3
    o, r = out.float(), ref.float()
    if not torch.isfinite(o[torch.isfinite(r)]).all():
        return math.inf
    err = ((o - r).nan_to_num().norm() / r.nan_to_num().norm().clamp_min(1e-30)).item()
    return None if err <= tol else err


def _expand(candidates: List[str], get, q, k, v, rpb, params) -> List[str]:
    """Every candidate name, then its backend's other configurations (default first)."""
    names = []
    for name in candidates:
        names.append(name)
        names += [kernel_config.join(name, kernel_config.parse(t))
                  for t in get(name).configurations(q, k, v, rpb, params)]
    return names


def _say(msg: str, loud: bool) -> None:
    _log.info(msg)
    if loud and os.environ.get("NATTN_AUTOTUNE_QUIET", "") in ("", "0"):
        print(f"nattn autotune: {msg}", file=sys.stderr, flush=True)


def _time_candidates(names, run_of, what, key, cuda) -> Dict[str, float]:
    """ms per name (inf: failed, or disagrees with the first name's result)."""
    ms, ref = {}, None
    loud = len(names) >= PROGRESS_FROM
    for i, name in enumerate(names):
        result = {}
        try:
            ms[name] = _forward_ms(lambda: result.__setitem__("out", run_of(name)), cuda)
            if ref is None:
                ref = result["out"]
            else:
                err = _agrees(result["out"], ref)
                if err is not None:
                    ms[name] = math.inf
                    _state["errors"][f"{key} {name}"] = (f"{what} disagrees with {names[0]}'s: relative "
                                                         f"error {err:.3g}")
        except Exception as e:  # a candidate that fails here is not chosen, and says why
            ms[name] = math.inf
            _state["errors"][f"{key} {name}"] = f"{type(e).__name__}: {e}"[:500]
        _say(f"{what} {i + 1}/{len(names)} {name}: {ms[name]:.4g} ms", loud)
    return ms


def choose(candidates: List[str], backends, q, k, v, rpb, params, det: Optional[bool] = None) -> str:
    """Measure ``candidates`` (names whose checks passed, in the heuristic order) and their
    configurations on this problem; the fastest that agrees with the first wins."""
    from . import get  # the registry's name lookup (configured names included)

    if "reference" in candidates and len(candidates) > 1:
        candidates = [c for c in candidates if c != "reference"]
    names = _expand(candidates, get, q, k, v, rpb, params)
    grads = needs_grads(q, k, v, rpb)
    if len(names) == 1 and not grads:
        return names[0]
    key = signature(q, k, v, rpb, params, det)
    table = results()
    cuda = q.device.type == "cuda"
    if len(names) >= PROGRESS_FROM:
        _say(f"timing {len(names)} candidates for {key}", True)
    ms = _time_candidates(names, lambda n: get(n).na_forward(q, k, v, rpb, params)[0], "forward", key, cuda)
    if all(math.isinf(t) for t in ms.values()):
        return candidates[0]  # nothing measured: the usual order, whose errors the call will raise
    best = min(names, key=lambda n: ms[n])
    entry = {"backend": best, "ms": {n: (None if math.isinf(t) else round(t, 4)) for n, t in ms.items()}}
    if grads and not deterministic(det):  # a deterministic call keeps the default backward
        best, entry["backward_ms"] = _choose_backward(best, get, q, k, v, rpb, params, key, cuda)
        entry["backend"] = best
    table[key] = entry
    _save()
    return best


def _choose_backward(best: str, get, q, k, v, rpb, params, key, cuda):
    """The forward winner with the fastest of its backend's backward configurations."""
    base, text = kernel_config.split(best)
    options = get(base).backward_configurations(q, k, v, rpb, params)
    if len(options) < 2:
        return best, {}
    forward = kernel_config.parse(text)
    names = [kernel_config.join(base, forward.with_dq(kernel_config.parse(o).dq_mode)) for o in options]
    with torch.no_grad():
        out, lse = get(best).na_forward(q, k, v, rpb, params)
        grad_out = torch.randn_like(out)
        grad_lse = torch.zeros_like(lse)
    ms = _time_candidates(
        names, lambda n: get(n).na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params)[0],
        "backward", key, cuda)
    if all(math.isinf(t) for t in ms.values()):
        return best, {}
    winner = min(names, key=lambda n: ms[n])
    return winner, {n: (None if math.isinf(t) else round(t, 4)) for n, t in ms.items()}
