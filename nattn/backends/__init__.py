"""Backend registry and dispatch: the fastest backend whose check passes wins."""

from __future__ import annotations

from typing import Dict, List, Optional

from .base import Backend
from .reference import ReferenceBackend

# Fastest first. Compiled and flex backends insert themselves ahead of the reference.
BACKENDS: Dict[str, Backend] = {}
AUTO_ORDER: List[str] = []


def register_backend(backend: Backend, before: Optional[str] = None) -> None:
    """Add ``backend`` to the registry, ahead of ``before`` in the automatic order."""
    BACKENDS[backend.name] = backend
    if backend.name in AUTO_ORDER:
        AUTO_ORDER.remove(backend.name)
    AUTO_ORDER.insert(AUTO_ORDER.index(before) if before in AUTO_ORDER else len(AUTO_ORDER), backend.name)


register_backend(ReferenceBackend())


class NoBackendError(ValueError):
    """No backend can run the requested problem; the message lists every reason."""


def _resolve(requested: Optional[str]) -> List[str]:
    if requested is None or requested == "auto":
        return list(AUTO_ORDER)
    if not isinstance(requested, str) or requested not in BACKENDS:
        raise ValueError(
            f"backend must be None, 'auto' or one of {sorted(BACKENDS)}, got {requested!r}"
        )
    return [requested]


def _choose(requested, reasons_of) -> str:
    names = _resolve(requested)
    explicit = requested not in (None, "auto")
    why: Dict[str, List[str]] = {}
    for name in names:
        reasons = reasons_of(BACKENDS[name], explicit)
        if not reasons:
            return name
        why[name] = reasons
    lines = [f"  {name}: " + "; ".join(r) for name, r in why.items()]
    raise NoBackendError("no backend can run this problem:\n" + "\n".join(lines))


def choose_na_backend(q, k, v, rpb, params, requested: Optional[str] = None) -> str:
    return _choose(requested, lambda b, explicit: b.na_not_supported_reasons(q, k, v, rpb, params, explicit))


def choose_dense_backend(q, k, v, is_causal, requested: Optional[str] = None) -> str:
    return _choose(requested, lambda b, explicit: b.dense_not_supported_reasons(q, k, v, is_causal, explicit))


def na_backend_reasons(q, k, v, rpb, params) -> Dict[str, List[str]]:
    """Every registered backend's reasons for this problem (empty list: it can run it)."""
    return {n: BACKENDS[n].na_not_supported_reasons(q, k, v, rpb, params, True) for n in AUTO_ORDER}
