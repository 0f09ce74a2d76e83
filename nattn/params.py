"""Normalize and validate the arguments of one NA call, once, at the entry.

Everything downstream of :func:`normalize` sees an :class:`NAParams` with per-axis
tuples; no backend re-parses ints or re-checks shapes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

import torch

IntOrTuple = Union[int, Sequence[int]]
BoolOrTuple = Union[bool, Sequence[bool]]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_AXES = ("X", "Y", "Z")


@dataclass(frozen=True)
class NAParams:
    """Per-axis parameters of one NA problem (all tuples have ``na_dim`` entries), its logit
    scale and its attention dropout probability (0: none; docs/semantics.md)."""

    kernel_size: Tuple[int, ...]
    stride: Tuple[int, ...]
    dilation: Tuple[int, ...]
    is_causal: Tuple[bool, ...]
    scale: float
    dropout_p: float = 0.0

    def __hash__(self) -> int:
        # Hashed on every eager call (call and layout caches): computed once per instance.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.kernel_size, self.stride, self.dilation, self.is_causal, self.scale, self.dropout_p))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def na_dim(self) -> int:
        return len(self.kernel_size)

    @property
    def window_size(self) -> int:
        return math.prod(self.kernel_size)


def _per_axis(value, na_dim: int, name: str, kind: type) -> tuple:
    """Turn an int/bool or a sequence of them into an ``na_dim``-tuple, or raise."""
    if isinstance(value, (list, tuple)):
        if len(value) != na_dim:
            raise ValueError(
                f"{name} must be a single {kind.__name__} or a tuple of {na_dim} "
                f"(one per spatial axis), got {len(value)} values: {tuple(value)!r}"
            )
        values = tuple(value)
    else:
        values = (value,) * na_dim
    for axis, v in enumerate(values):
        ok = isinstance(v, bool) if kind is bool else (
            isinstance(v, int) and not isinstance(v, bool)
        )
        if not ok:
            raise TypeError(
                f"{name} along axis {axis} ({_AXES[axis]}) must be a Python {kind.__name__}, "
                f"got {type(v).__name__} ({v!r})"
            )
    return values


def check_scale(scale, head_dim: int, name: str = "scale") -> float:
    """The logit scale as a float: ``None`` gives ``head_dim ** -0.5``.

    Any finite real number is accepted, zero and negative included (as NATTEN does: 0 gives
    uniform weights over the window); bools, strings, tensors and sequences are a
    ``TypeError``, NaN, infinities and ints too large for a float a ``ValueError``.
    """
    if scale is None:
        return head_dim ** -0.5
    accepted = "a finite real number (int or float) or None"
    if isinstance(scale, (bool, torch.Tensor)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{name} must be {accepted}, got {type(scale).__name__} ({_short(scale)})")
    try:
        value = float(scale)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {accepted}, got {_short(scale)}")
    return value


def check_dropout_p(dropout_p, name: str = "dropout_p") -> float:
    """``dropout_p`` as a float in ``[0, 1)``, or a ``TypeError`` (not a real number) /
    ``ValueError`` (outside the range, NaN) naming the argument and the range."""
    if isinstance(dropout_p, float) and 0.0 <= dropout_p < 1.0:  # the common case first
        return dropout_p
    accepted = "a float in [0, 1)"
    if isinstance(dropout_p, (bool, torch.Tensor)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"{name} must be {accepted}, got {type(dropout_p).__name__} ({_short(dropout_p)})")
    value = float(dropout_p)
    if not 0.0 <= value < 1.0:  # NaN fails too
        raise ValueError(f"{name} must be {accepted}, got {_short(dropout_p)}")
    return value


def _short(x, limit: int = 40) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[:limit] + "..."


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}"
        )
    if t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")


def check_qkv(query, key, value, na_dim: int) -> None:
    """Layout checks shared by NA and dense attention (``na_dim`` spatial axes)."""
    rank = na_dim + 3
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(t, name)
        if t.dim() != rank:
            layout = "[B, " + ", ".join(_AXES[:na_dim]) + ", H, D]" if na_dim <= 3 else ""
            raise ValueError(
                f"{name} must have rank {rank} ({layout}), got shape {tuple(t.shape)}"
            )
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from query dtype {query.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name} device {t.device} differs from query device {query.device}")
    if key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            "key and value must agree on [B, *spatial, H_kv], got "
            f"{tuple(key.shape)} and {tuple(value.shape)}"
        )
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"key head dim {key.shape[-1]} must equal query head dim {query.shape[-1]}"
        )
    heads, heads_kv = query.shape[-2], key.shape[-2]
    if heads % heads_kv != 0:
        raise ValueError(
            f"query heads ({heads}) must be divisible by key/value heads ({heads_kv}) for GQA/MQA"
        )


def layout_hint(query: torch.Tensor, na_dim: int) -> str:
    """How a query was read (heads-last), for errors a heads-first tensor runs into."""
    axes = _AXES[:na_dim]
    named = ", ".join(f"{a}={n}" for a, n in zip(axes, query.shape[1 : 1 + na_dim]))
    return (
        f"Inputs are heads-last [B, {', '.join(axes)}, H, D]: query {tuple(query.shape)} was read "
        f"as B={query.shape[0]}, {named}, H={query.shape[-2]}, D={query.shape[-1]}; a heads-first "
        f"[B, H, {', '.join(axes)}, D] tensor needs .movedim(1, -2) first."
    )


def normalize_window_args(na_dim: int, kernel_size, stride=1, dilation=1, is_causal=False):
    """Per-axis ``(kernel, stride, dilation, causal)`` tuples, with the checks that need no input."""
    kernel = _per_axis(kernel_size, na_dim, "kernel_size", int)
    strides = _per_axis(stride, na_dim, "stride", int)
    dils = _per_axis(dilation, na_dim, "dilation", int)
    causal = _per_axis(is_causal, na_dim, "is_causal", bool)
    for axis in range(na_dim):
        k, s, d = kernel[axis], strides[axis], dils[axis]
        where = f"along axis {axis} ({_AXES[axis]})"
        if k < 2:
            raise ValueError(f"kernel_size {where} must be >= 2, got {k}")
        if d < 1:
            raise ValueError(f"dilation {where} must be >= 1, got {d}")
        if not 1 <= s <= k:
            raise ValueError(f"stride {where} must satisfy 1 <= stride <= kernel_size ({k}), got {s}")
    return kernel, strides, dils, causal


def rpb_config_reasons(kernel_size, stride, is_causal) -> list:
    """What an RPB table needs of the per-axis window arguments (empty when all is met)."""
    reasons = []
    if any(k % 2 == 0 for k in kernel_size):
        reasons.append(f"odd kernel_size (got {tuple(kernel_size)})")
    if any(s != 1 for s in stride):
        reasons.append(f"stride 1 (got {tuple(stride)})")
    if any(is_causal):
        reasons.append(f"is_causal=False (got {tuple(is_causal)})")
    return reasons


def normalize(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    na_dim: int,
    kernel_size: IntOrTuple,
    stride: IntOrTuple = 1,
    dilation: IntOrTuple = 1,
    is_causal: BoolOrTuple = False,
    scale: Optional[float] = None,
    rpb: Optional[torch.Tensor] = None,
    additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
) -> NAParams:
    """Validate one NA call and return its per-axis parameters (see docs/semantics.md)."""
    check_qkv(query, key, value, na_dim)
    if query.shape[:-2] != key.shape[:-2]:
        raise ValueError(
            "query and key must agree on [B, *spatial] in neighborhood attention, got "
            f"{tuple(query.shape)} and {tuple(key.shape)}. {layout_hint(query, na_dim)}"
        )
    kernel, strides, dils, causal = normalize_window_args(na_dim, kernel_size, stride, dilation, is_causal)
    spatial = tuple(query.shape[1 : 1 + na_dim])
    for axis in range(na_dim):
        k, d, n = kernel[axis], dils[axis], spatial[axis]
        if k * d > n:
            raise ValueError(
                f"kernel_size * dilation along axis {axis} ({_AXES[axis]}) must be <= the input "
                f"size {n}, got {k} * {d} = {k * d}. {layout_hint(query, na_dim)}"
            )
    params = NAParams(kernel, strides, dils, causal, check_scale(scale, query.shape[-1]),
                      check_dropout_p(dropout_p))
    if rpb is not None:
        check_rpb(rpb, query, params)
    check_additional_kv(query, key, value, additional_keys, additional_values)
    return params


def check_rpb(rpb, query: torch.Tensor, params: NAParams) -> None:
    """RPB needs odd kernels, no stride, no causal mask, and a [H, 2k-1, ...] table."""
    if not isinstance(rpb, torch.Tensor):
        raise TypeError(f"rpb must be a torch.Tensor or None, got {type(rpb).__name__}")
    reasons = rpb_config_reasons(params.kernel_size, params.stride, params.is_causal)
    if reasons:
        raise ValueError("rpb (relative positional bias) requires " + ", ".join(reasons))
    expected = (query.shape[-2],) + tuple(2 * k - 1 for k in params.kernel_size)
    if tuple(rpb.shape) != expected:
        raise ValueError(f"rpb must have shape [H, 2k-1, ...] = {expected}, got {tuple(rpb.shape)}")
    if rpb.device != query.device:
        raise ValueError(f"rpb device {rpb.device} differs from query device {query.device}")
    if rpb.dtype not in FLOAT_DTYPES:
        raise TypeError(f"rpb must be a floating tensor, got {rpb.dtype}")


def check_additional_kv(query, key, value, extra_k, extra_v) -> None:
    if extra_k is None and extra_v is None:
        return
    if extra_k is None or extra_v is None:
        raise ValueError("additional_keys and additional_values must be given together")
    for name, t, ref in (
        ("additional_keys", extra_k, key),
        ("additional_values", extra_v, value),
    ):
        _check_tensor(t, name)
        expected = f"[B={ref.shape[0]}, N_extra, H_kv={ref.shape[-2]}, {ref.shape[-1]}]"
        if (
            t.dim() != 4
            or t.shape[0] != ref.shape[0]
            or t.shape[2] != ref.shape[-2]
            or t.shape[3] != ref.shape[-1]
        ):
            raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
        if t.dtype != query.dtype or t.device != query.device:
            raise ValueError(
                f"{name} must match query's dtype and device ({query.dtype}, {query.device}), "
                f"got ({t.dtype}, {t.device})"
            )
    if extra_k.shape[1] != extra_v.shape[1]:
        raise ValueError(
            f"additional_keys and additional_values must have the same N_extra, "
            f"got {extra_k.shape[1]} and {extra_v.shape[1]}"
        )
