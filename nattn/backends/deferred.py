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

from typing import Optional

from .. import _call_cache

PREFIX = "deferred:"


def spec(requested: Optional[str], tune: Optional[bool], deterministic: Optional[bool],
         grads: Optional[bool]) -> str:
    """The string a compiled call passes as its op's backend (an f-string of constants,
    which dynamo folds; backend names hold no '|')."""
    return f"{PREFIX}{requested}|{tune}|{deterministic}|{grads}"


def is_deferred(name: str) -> bool:
    return name.startswith(PREFIX)


_WORDS = {"None": None, "True": True, "False": False}
_PARSED: dict = {}  # deferred name -> its fields (a model passes a handful of names)


def _fields(name: str):
    fields = _PARSED.get(name)
    if fields is None:
        requested, tune, deterministic, grads = name[len(PREFIX):].split("|")
        fields = (None if requested == "None" else requested, _WORDS[tune], _WORDS[deterministic], _WORDS[grads])
        if len(_PARSED) < 1024:
            _PARSED[name] = fields
    return fields


_DEPS: list = []  # (autotune, choose_na_backend, grads_hint): imported once, on the first call


def _deps():
    if not _DEPS:  # not at import time: the backends package imports this module
        from . import autotune, choose_na_backend
        from .heuristics import grads_hint
        _DEPS.extend((autotune, choose_na_backend, grads_hint))
    return _DEPS


def resolve_na(name: str, q, k, v, rpb, params) -> str:
    """The backend name a deferred NA call runs (a plain name passes through)."""
    if not is_deferred(name):
        return name
    autotune, choose_na_backend, grads_hint = _deps()
    requested, tune, deterministic, grads = _fields(name)
    # Choices are remembered per signature with the eager calls' (nattn/_call_cache.py); the
    # tuner keeps its own cache of measured choices.
    sig = None if autotune.active(q, tune) else _call_cache.op_key((q, k, v, rpb), name, params)
    hit = _call_cache.get(sig)
    if hit is not None:
        return hit[0]
    with grads_hint(grads):
        chosen = choose_na_backend(q, k, v, rpb, params, requested, tune, deterministic)
    _call_cache.put(sig, (chosen,))
    return chosen


PACKED = "packed|"  # tags resolve_na_packed's signatures apart from resolve_na's


def resolve_na_packed(name: str, qkv, rpb, params) -> str:
    """``resolve_na`` for the q / k / v views of a packed ``qkv`` ``[B, *spatial, 3, H, D]``
    (the modules' op): remembered per ``qkv`` signature, so the views are built only when the
    choice is made."""
    if not is_deferred(name):
        return name
    autotune = _deps()[0]
    tune = _fields(name)[1]
    sig = None if autotune.active(qkv, tune) else _call_cache.op_key((qkv, None, None, rpb), PACKED + name, params)
    hit = _call_cache.get(sig)
    if hit is not None:
        return hit[0]
    q, k, v = qkv.unbind(-3)
    chosen = resolve_na(name, q, k, v, rpb, params)
    _call_cache.put(sig, (chosen,))
    return chosen


def resolve_dense(name: str, q, k, v, is_causal, dropout_p: float = 0.0) -> str:
    """The backend name a deferred dense call runs (a plain name passes through)."""
    if not is_deferred(name):
        return name
    from . import choose_dense_backend
    return choose_dense_backend(q, k, v, is_causal, _fields(name)[0], dropout_p)
