"""Backend choice at run time, for calls that torch.compile traces.

The dispatch reads libnattn, the GPU's capability and the tuner's cache: Python that
dynamo cannot trace on every torch version (torch 2.11 broke the graph on it three times
per NA call). A compiled call therefore hands its custom op a *deferred* backend string
that records what the call asked for (backend, ``tune``, ``deterministic``, whether it needs
gradients); the op, opaque to dynamo, makes the same choice on its real tensors when it
runs. The backward op receives the same string and, with gradients needed, chooses the
backend the forward chose.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

PREFIX = "deferred:"
# Choices already made, by everything they depend on (a compiled model calls the same few
# signatures every step; choosing costs tens of microseconds of host time per call).
_CHOSEN: Dict[tuple, str] = {}
_MAX_CHOSEN = 4096


def spec(requested: Optional[str], tune: Optional[bool], deterministic: Optional[bool],
         grads: Optional[bool]) -> str:
    """The string a compiled call passes as its op's backend (an f-string of constants,
    which dynamo folds; backend names hold no '|')."""
    return f"{PREFIX}{requested}|{tune}|{deterministic}|{grads}"


def is_deferred(name: str) -> bool:
    return name.startswith(PREFIX)


_WORDS = {"None": None, "True": True, "False": False}


def _fields(name: str):
    requested, tune, deterministic, grads = name[len(PREFIX):].split("|")
    return (None if requested == "None" else requested, _WORDS[tune], _WORDS[deterministic], _WORDS[grads])


def resolve_na(name: str, q, k, v, rpb, params) -> str:
    """The backend name a deferred NA call runs (a plain name passes through)."""
    if not is_deferred(name):
        return name
    from . import autotune, choose_na_backend
    from .heuristics import grads_hint
    requested, tune, deterministic, grads = _fields(name)
    tuning = autotune.active(q, tune)  # the tuner keeps its own cache of measured choices
    key = None if tuning else (name, torch.are_deterministic_algorithms_enabled(), params, q.dtype, q.device,
                                None if rpb is None else (rpb.shape, rpb.dtype),
                                *(_layout(t) for t in (q, k, v)))
    hit = _CHOSEN.get(key) if key is not None else None
    if hit is not None:
        return hit
    with grads_hint(grads):
        chosen = choose_na_backend(q, k, v, rpb, params, requested, tune, deterministic)
    if key is not None:
        if len(_CHOSEN) >= _MAX_CHOSEN:
            _CHOSEN.clear()
        _CHOSEN[key] = chosen
    return chosen


def _layout(t) -> tuple:
    """What a backend's layout check reads: shape, strides, dtype, the offset's alignment."""
    return t.shape, t.stride(), t.dtype, (t.storage_offset() * t.element_size()) % 16


def forget() -> None:
    """Drop the remembered choices (a backend registered or changed since)."""
    _CHOSEN.clear()


def resolve_dense(name: str, q, k, v, is_causal) -> str:
    """The backend name a deferred dense call runs (a plain name passes through)."""
    if not is_deferred(name):
        return name
    from . import choose_dense_backend
    return choose_dense_backend(q, k, v, is_causal, _fields(name)[0])
