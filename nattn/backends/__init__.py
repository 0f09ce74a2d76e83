"""Backend registry and dispatch: the fastest backend whose check passes wins."""

from __future__ import annotations

import importlib
from typing import Dict, List, Optional

from .. import _call_cache
from . import autotune, kernel_config
from .base import DROPOUT_REASON, Backend
from .heuristics import na_auto_order
from .reference import ReferenceBackend

# Automatic dispatch tries backends in this order (fastest first); unknown names go
# just before the reference, which runs everything and so always comes last.
PRIORITY = ("cuda", "flex", "tiled", "reference")
BACKENDS: Dict[str, Backend] = {}
AUTO_ORDER: List[str] = []


def _rank(name: str) -> int:
    return PRIORITY.index(name) if name in PRIORITY else PRIORITY.index("reference") - 0.5


def register_backend(backend: Backend) -> None:
    """Add (or replace) ``backend`` in the registry and the automatic order."""
    BACKENDS[backend.name] = backend
    if backend.name not in AUTO_ORDER:
        AUTO_ORDER.append(backend.name)
    AUTO_ORDER.sort(key=_rank)
    _call_cache.clear()  # choices remembered per signature may now differ


def _load_optional(module: str) -> None:
    """Import a backend module that registers itself, if this install has it."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # a real missing dependency inside the module: surface it
            raise


register_backend(ReferenceBackend())
for _name in PRIORITY[:-1]:
    _load_optional(f"{__name__}.{_name}")


class NoBackendError(ValueError):
    """No backend can run the requested problem; the message lists every reason."""


def get(name: str) -> Backend:
    """The backend a name selects: a registered name, or one with a kernel configuration
    (``"cuda:q8x16_k8x16"``, backends/kernel_config.py)."""
    backend = BACKENDS.get(name)  # a plain registered name: one lookup (every eager call)
    if backend is not None:
        return backend
    base, config = kernel_config.split(name)
    backend = BACKENDS[base]
    return backend.configured(config) if config else backend


def _resolve(requested: Optional[str], auto_order=None) -> List[str]:
    if requested is None or requested == "auto":
        # `is not None`: torch.compile cannot branch on a function's truth value (graph break)
        return auto_order() if auto_order is not None else list(AUTO_ORDER)
    if not isinstance(requested, str) or kernel_config.split(requested)[0] not in BACKENDS:
        raise ValueError(
            f"backend must be None, 'auto' or one of {sorted(BACKENDS)} (cuda optionally with a "
            f"kernel configuration, e.g. 'cuda:q8x16_k8x16'), got {requested!r}"
        )
    get(requested)  # a malformed configuration raises here, naming the accepted forms
    return [requested]


def _choose(requested, reasons_of, auto_order=None) -> str:
    names = _resolve(requested, auto_order)
    explicit = requested not in (None, "auto")
    why: Dict[str, List[str]] = {}
    for name in names:
        reasons = reasons_of(get(name), explicit)
        if not reasons:
            return name
        why[name] = reasons
    lines = [f"  {name}: " + "; ".join(r) for name, r in why.items()]
    raise NoBackendError("no backend can run this problem:\n" + "\n".join(lines))


def choose_na_backend(q, k, v, rpb, params, requested: Optional[str] = None, tune: Optional[bool] = None,
                      deterministic: Optional[bool] = None) -> str:
    """The backend name (possibly with a kernel configuration) to run this problem: the
    requested one, else the measured fastest when tuning is on (``tune``, ``with
    nattn.autotune()``, NATTN_AUTOTUNE), else the first of the heuristic order that accepts it.
    ``deterministic`` (None: ``torch.are_deterministic_algorithms_enabled()``) pins the chosen
    backend's bitwise-reproducible backward (the cuda backend's dQ pass)."""
    det = autotune.deterministic(deterministic)
    return _pin_deterministic(_choose_na(q, k, v, rpb, params, requested, tune, det), det)


def na_reasons(backend: Backend, q, k, v, rpb, params, explicit: bool) -> List[str]:
    """Why ``backend`` cannot run this NA call: its own reasons, or, for a call with attention
    dropout, that it has none (``Backend.supports_dropout``)."""
    if params.dropout_p > 0 and not backend.supports_dropout:
        return [DROPOUT_REASON]
    return backend.na_not_supported_reasons(q, k, v, rpb, params, explicit)


def _choose_na(q, k, v, rpb, params, requested, tune, det) -> str:
    if params.dropout_p > 0:  # only backends with dropout; none is tuned (the tuner draws no rng)
        return _choose(requested, lambda b, explicit: na_reasons(b, q, k, v, rpb, params, explicit),
                       lambda: na_auto_order(AUTO_ORDER, q, params, v))
    if requested in (None, "auto") and autotune.active(q, tune):  # measured dispatch (opt-in)
        best = autotune.measured(q, k, v, rpb, params, det)
        if (best and kernel_config.split(best)[0] in BACKENDS
                and not get(best).na_not_supported_reasons(q, k, v, rpb, params, False)):
            return best  # one check per call, as on the heuristic path
        ok = [n for n in na_auto_order(AUTO_ORDER, q, params, v)
              if not BACKENDS[n].na_not_supported_reasons(q, k, v, rpb, params, False)]
        if ok:
            return autotune.choose(ok, BACKENDS, q, k, v, rpb, params, det)
    return _choose(
        requested,
        lambda b, explicit: b.na_not_supported_reasons(q, k, v, rpb, params, explicit),
        lambda: na_auto_order(AUTO_ORDER, q, params, v),
    )


def _pin_deterministic(name: str, det: bool) -> str:
    """``name`` with its backend's deterministic backward configuration when ``det``."""
    if not det:
        return name
    base, text = kernel_config.split(name)
    pin = BACKENDS[base].deterministic_configuration()
    if not pin:
        return name
    return kernel_config.join(base, kernel_config.parse(text).with_dq(kernel_config.parse(pin).dq_mode))


def choose_dense_backend(q, k, v, is_causal, requested: Optional[str] = None, dropout_p: float = 0.0) -> str:
    if dropout_p > 0:
        return _choose(requested, lambda b, explicit: [DROPOUT_REASON] if not b.supports_dropout
                       else b.dense_not_supported_reasons(q, k, v, is_causal, explicit))
    return _choose(requested, lambda b, explicit: b.dense_not_supported_reasons(q, k, v, is_causal, explicit))


def na_backend_reasons(q, k, v, rpb, params) -> Dict[str, List[str]]:
    """Every registered backend's reasons for this problem (empty list: it can run it)."""
    return {n: na_reasons(BACKENDS[n], q, k, v, rpb, params, True) for n in AUTO_ORDER}
