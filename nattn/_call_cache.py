"""NA calls remember their checked parameters and chosen backend per signature (eager calls,
and the ops of compiled calls: nattn/backends/deferred.py).

A model calls the same few signatures every step; checking the arguments
(``params.normalize``) and choosing a backend cost ~10 us of host time per call, as much
as a small layer's kernels. The key holds everything either depends on: the Python
arguments with their types (``1``, ``1.0`` and ``True`` hash alike but are checked
differently), each tensor's type, shape, strides, dtype, device, ``requires_grad`` and
offset alignment, grad mode, torch's determinism switch and its TF32 switch for float32
matmuls (nattn/_tf32.py: the cuda backend runs float32 on tensor cores only with it). Calls
that tune (``autotune.active``), pass other argument types, or tensor subclasses are not cached.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from . import _tf32

_SCALARS = (int, float, bool, str, type(None))
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_MAX = 4096
_CACHE: Dict[tuple, tuple] = {}


class _Uncacheable(Exception):
    pass


_SCALAR_SET = frozenset(_SCALARS)


def _freeze(x):
    t = type(x)
    if t in _SCALAR_SET:
        return (t, x)
    if t is tuple or t is list:
        types = tuple(map(type, x))  # a flat tuple of scalars (the common case) in C-level passes
        if _SCALAR_SET.issuperset(types):
            return (t, types, tuple(x))
        return (t, tuple(map(_freeze, x)))
    raise _Uncacheable


def _meta(t):
    if t is None:
        return None
    if type(t) not in _TENSORS:
        raise _Uncacheable
    return (type(t), t.shape, t.stride(), t.dtype, t.device, t.requires_grad,
            (t.storage_offset() * t.element_size()) % 16)


def key(tensors, args) -> Optional[tuple]:
    """The signature of a call (``tensors``: the tensor arguments or None, ``args``: the
    others), or None when it cannot be cached."""
    try:
        return (tuple(map(_meta, tensors)), tuple(map(_freeze, args)),
                torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(), _tf32.allowed())
    except _Uncacheable:
        return None


def op_key(tensors, name: str, params) -> Optional[tuple]:
    """The signature of a compiled call's op (nattn/backends/deferred.py): its arguments are
    normalized already (``params``, a frozen NAParams, and the backend string), so only the
    tensors need describing (~half the cost of ``key``, paid on every op call)."""
    q, k, v, rpb = tensors  # spelled out, not a generator: paid on every compiled op call
    try:
        return (name, params, _meta(q), _meta(k), _meta(v), _meta(rpb), torch.is_grad_enabled(),
                torch.are_deterministic_algorithms_enabled(), _tf32.allowed())
    except _Uncacheable:
        return None


def get(k: Optional[tuple]):
    return _CACHE.get(k) if k is not None else None


def put(k: Optional[tuple], value: Tuple) -> None:
    if k is None:
        return
    if len(_CACHE) >= _MAX:
        _CACHE.clear()
    _CACHE[k] = value


def clear() -> None:
    """Forget every remembered call (a backend was registered or changed)."""
    _CACHE.clear()
