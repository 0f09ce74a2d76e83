"""NATTEN 0.17's ``natten.functional`` names and argument orders, on nattn's ops.

- Fused, heads-last ``[B, *spatial, H, D]``: ``na2d(query, key, value, kernel_size,
  dilation=1, is_causal=False, rpb=None, scale=None, additional_keys=None,
  additional_values=None, xformers_kwargs=None)``. The fifth positional argument is the
  dilation here; in nattn (and NATTEN 0.20+) it is the stride. ``scale`` None (or 0, as
  NATTEN's ``scale or ...``) means ``head_dim ** -0.5``.
- Unfused, heads-first ``[B, H, *spatial, D]``: ``na2d_qk(query, key, kernel_size,
  dilation=1, additional_keys=None, is_causal=False, rpb=None)`` returns the logits
  ``[B, H, *spatial, W + E]`` (``W = prod(kernel_size)`` window slots, then one per
  additional key, ``additional_keys [B, H, E, D]``); ``na2d_av(attn, value, kernel_size,
  dilation=1, additional_values=None, is_causal=False)`` applies weights of that width.
  The caller scales the query, as with NATTEN's unfused ops. NATTEN 0.15/0.16's
  ``na2d_qk_with_bias(query, key, bias, kernel_size, dilation, additional_keys=None)`` too.
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import functional as _fused
from ..qk_av import na_av, na_qk

__all__ = ["na1d", "na2d", "na3d", "na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av",
           "na1d_qk_with_bias", "na2d_qk_with_bias", "na3d_qk_with_bias"]

_AXES = ("X", "Y", "Z")
_FUSED = {1: _fused.na1d, 2: _fused.na2d, 3: _fused.na3d}


def _fused_op(na_dim, query, key, value, kernel_size, dilation, is_causal, rpb, scale,
              additional_keys, additional_values, xformers_kwargs):
    if xformers_kwargs:
        raise ValueError("xformers_kwargs is not supported (nattn has no xFormers path); pass None")
    return _FUSED[na_dim](query, key, value, kernel_size, dilation=1 if dilation is None else dilation,
                          is_causal=is_causal, scale=scale or None, additional_keys=additional_keys,
                          additional_values=additional_values, rpb=rpb)


def _heads_first(t, name: str, rank: int, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be heads-first {what} (NATTEN 0.17 layout), got shape {tuple(t.shape)}")
    return t


def _qk(na_dim, query, key, kernel_size, dilation, additional_keys, is_causal, rpb):
    axes = ", ".join(_AXES[:na_dim])
    what = f"[B, H, {axes}, D]"
    q = _heads_first(query, "query", na_dim + 3, what).movedim(1, -2)
    k = _heads_first(key, "key", na_dim + 3, what).movedim(1, -2)
    logits = na_qk(q, k, kernel_size, 1, 1 if dilation is None else dilation, is_causal, rpb,
                   na_dim=na_dim).movedim(-2, 1)  # [B, H, *spatial, W]
    if additional_keys is None:
        return logits
    extra = _heads_first(additional_keys, "additional_keys", 4, "[B, H, E, D]")
    if extra.shape[:2] != query.shape[:2] or extra.shape[-1] != query.shape[-1]:
        raise ValueError(f"additional_keys must be [B, H, E, D] = [{query.shape[0]}, {query.shape[1]}, E, "
                         f"{query.shape[-1]}], got {tuple(extra.shape)}")
    b, h = query.shape[:2]
    flat = query.reshape(b, h, -1, query.shape[-1])
    extra_logits = torch.matmul(flat, extra.transpose(-1, -2)).reshape(*query.shape[:-1], extra.shape[2])
    return torch.cat([logits, extra_logits.to(logits.dtype)], dim=-1)


def _av(na_dim, attn, value, kernel_size, dilation, additional_values, is_causal):
    axes = ", ".join(_AXES[:na_dim])
    v = _heads_first(value, "value", na_dim + 3, f"[B, H, {axes}, D]")
    a = _heads_first(attn, "attn", na_dim + 3, f"[B, H, {axes}, W + E]")
    dilation = 1 if dilation is None else dilation
    if additional_values is None:
        return na_av(a.movedim(1, -2), v.movedim(1, -2), kernel_size, 1, dilation, is_causal,
                     na_dim=na_dim).movedim(-2, 1)
    extra = _heads_first(additional_values, "additional_values", 4, "[B, H, E, D]")
    e = extra.shape[2]
    w = a.shape[-1] - e
    if w <= 0:
        raise ValueError(f"attn's last dim ({a.shape[-1]}) must be the window size plus the {e} additional values")
    out = na_av(a[..., :w].movedim(1, -2), v.movedim(1, -2), kernel_size, 1, dilation, is_causal,
                na_dim=na_dim).movedim(-2, 1)
    b, h = a.shape[:2]
    extra_out = torch.matmul(a[..., w:].reshape(b, h, -1, e), extra).reshape(*out.shape)
    return out + extra_out.to(out.dtype)


def na1d(query, key, value, kernel_size, dilation=1, is_causal=False, rpb=None, scale=None,
         additional_keys=None, additional_values=None, xformers_kwargs=None) -> torch.Tensor:
    """NATTEN 0.17's fused 1-D op: heads-last ``[B, L, H, D]``; the fifth argument is the dilation."""
    return _fused_op(1, query, key, value, kernel_size, dilation, is_causal, rpb, scale,
                     additional_keys, additional_values, xformers_kwargs)


def na2d(query, key, value, kernel_size, dilation=1, is_causal=False, rpb=None, scale=None,
         additional_keys=None, additional_values=None, xformers_kwargs=None) -> torch.Tensor:
    """NATTEN 0.17's fused 2-D op: heads-last ``[B, X, Y, H, D]``; the fifth argument is the dilation."""
    return _fused_op(2, query, key, value, kernel_size, dilation, is_causal, rpb, scale,
                     additional_keys, additional_values, xformers_kwargs)


def na3d(query, key, value, kernel_size, dilation=1, is_causal=False, rpb=None, scale=None,
         additional_keys=None, additional_values=None, xformers_kwargs=None) -> torch.Tensor:
    """NATTEN 0.17's fused 3-D op: heads-last ``[B, X, Y, Z, H, D]``; the fifth argument is the dilation."""
    return _fused_op(3, query, key, value, kernel_size, dilation, is_causal, rpb, scale,
                     additional_keys, additional_values, xformers_kwargs)


def na1d_qk(query, key, kernel_size, dilation=1, additional_keys=None, is_causal=False, rpb=None):
    """Heads-first logits ``[B, H, L, k (+ E)]``."""
    return _qk(1, query, key, kernel_size, dilation, additional_keys, is_causal, rpb)


def na2d_qk(query, key, kernel_size, dilation=1, additional_keys=None, is_causal=False, rpb=None):
    """Heads-first logits ``[B, H, X, Y, k*k (+ E)]``."""
    return _qk(2, query, key, kernel_size, dilation, additional_keys, is_causal, rpb)


def na3d_qk(query, key, kernel_size, dilation=1, additional_keys=None, is_causal=False, rpb=None):
    """Heads-first logits ``[B, H, X, Y, Z, prod(kernel) (+ E)]``."""
    return _qk(3, query, key, kernel_size, dilation, additional_keys, is_causal, rpb)


def na1d_qk_with_bias(query, key, bias, kernel_size, dilation, additional_keys=None):
    """NATTEN 0.15/0.16's name for :func:`na1d_qk` with an RPB ``bias``."""
    return _qk(1, query, key, kernel_size, dilation, additional_keys, False, bias)


def na2d_qk_with_bias(query, key, bias, kernel_size, dilation, additional_keys=None):
    """NATTEN 0.15/0.16's name for :func:`na2d_qk` with an RPB ``bias``."""
    return _qk(2, query, key, kernel_size, dilation, additional_keys, False, bias)


def na3d_qk_with_bias(query, key, bias, kernel_size, dilation, additional_keys=None):
    """NATTEN 0.15/0.16's name for :func:`na3d_qk` with an RPB ``bias``."""
    return _qk(3, query, key, kernel_size, dilation, additional_keys, False, bias)


def na1d_av(attn, value, kernel_size, dilation=1, additional_values=None, is_causal=False):
    """Heads-first ``[B, H, L, D]`` from weights ``[B, H, L, k (+ E)]``."""
    return _av(1, attn, value, kernel_size, dilation, additional_values, is_causal)


def na2d_av(attn, value, kernel_size, dilation=1, additional_values=None, is_causal=False):
    """Heads-first ``[B, H, X, Y, D]`` from weights ``[B, H, X, Y, k*k (+ E)]``."""
    return _av(2, attn, value, kernel_size, dilation, additional_values, is_causal)


def na3d_av(attn, value, kernel_size, dilation=1, additional_values=None, is_causal=False):
    """Heads-first ``[B, H, X, Y, Z, D]`` from weights ``[B, H, X, Y, Z, prod(kernel) (+ E)]``."""
    return _av(3, attn, value, kernel_size, dilation, additional_values, is_causal)
