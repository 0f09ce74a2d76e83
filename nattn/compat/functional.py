"""NATTEN 0.14-0.17's unfused ops under their old names, heads-first ``[B, H, *spatial, D]``
(and NATTEN 0.17's ``na{1,2,3}d``, ``na{1,2,3}d_qk``, ``na{1,2,3}d_av``: functional_017.py).

``natten2dqkrpb(query, key, rpb, kernel_size, dilation)`` returns the logits
``[B, H, X, Y, k*k]`` (the caller has scaled ``query``), ``natten2dav(attn, value,
kernel_size, dilation)`` applies softmax weights to ``value``; the 3-D ops take
``kernel_size_d, kernel_size, dilation_d, dilation`` (depth first, then both other axes).
Each is a permute around :func:`nattn.na2d_qk` / :func:`nattn.na2d_av`, so it is
differentiable and runs on any device. ``kernel_size``/``dilation`` may also be per-axis
tuples; ``dilation=None`` means 1.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..qk_av import na_av, na_qk
from .functional_017 import (  # NATTEN 0.15-0.17's names (natten.functional.na2d, na2d_qk, ...)
    na1d, na1d_av, na1d_qk, na1d_qk_with_bias, na2d, na2d_av, na2d_qk, na2d_qk_with_bias, na3d, na3d_av,
    na3d_qk, na3d_qk_with_bias,
)

__all__ = [
    "natten1dqkrpb", "natten2dqkrpb", "natten3dqkrpb",
    "natten1dqk", "natten2dqk", "natten3dqk",
    "natten1dav", "natten2dav", "natten3dav",
    "na1d", "na2d", "na3d", "na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av",
    "na1d_qk_with_bias", "na2d_qk_with_bias", "na3d_qk_with_bias",
]

_AXES = ("X", "Y", "Z")


def _heads_last(t, name: str, na_dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != na_dim + 3:
        axes = ", ".join(_AXES[:na_dim])
        raise ValueError(
            f"{name} must be heads-first [B, H, {axes}, ...] of rank {na_dim + 3} "
            f"(NATTEN 0.17 layout), got shape {tuple(t.shape)}"
        )
    return t.movedim(1, -2)


def _dil(dilation):
    return 1 if dilation is None else dilation


def _qk(query, key, rpb, kernel_size, dilation, na_dim):
    q, k = _heads_last(query, "query", na_dim), _heads_last(key, "key", na_dim)
    return na_qk(q, k, kernel_size, 1, _dil(dilation), False, rpb, na_dim=na_dim).movedim(-2, 1)


def _av(attn, value, kernel_size, dilation, na_dim):
    a, v = _heads_last(attn, "attn", na_dim), _heads_last(value, "value", na_dim)
    return na_av(a, v, kernel_size, 1, _dil(dilation), False, na_dim=na_dim).movedim(-2, 1)


def _3d(depth, rest):
    return (depth, rest, rest) if not isinstance(rest, (tuple, list)) else (depth, *rest)


def natten1dqkrpb(query: torch.Tensor, key: torch.Tensor, rpb: Optional[torch.Tensor],
                  kernel_size, dilation) -> torch.Tensor:
    """Logits ``[B, H, L, k]`` of query ``[B, H, L, D]`` with key ``[B, H, L, D]``, plus ``rpb [H, 2k-1]``."""
    return _qk(query, key, rpb, kernel_size, dilation, 1)


def natten2dqkrpb(query: torch.Tensor, key: torch.Tensor, rpb: Optional[torch.Tensor],
                  kernel_size, dilation) -> torch.Tensor:
    """Logits ``[B, H, X, Y, k*k]`` of heads-first query/key, plus ``rpb [H, 2k-1, 2k-1]``."""
    return _qk(query, key, rpb, kernel_size, dilation, 2)


def natten3dqkrpb(query: torch.Tensor, key: torch.Tensor, rpb: Optional[torch.Tensor],
                  kernel_size_d, kernel_size, dilation_d, dilation) -> torch.Tensor:
    """Logits ``[B, H, Z, X, Y, k_d*k*k]``; ``rpb [H, 2k_d-1, 2k-1, 2k-1]`` or None."""
    return _qk(query, key, rpb, _3d(kernel_size_d, kernel_size),
               _3d(_dil(dilation_d), _dil(dilation)), 3)


def natten1dqk(query, key, kernel_size, dilation) -> torch.Tensor:
    """:func:`natten1dqkrpb` without a bias."""
    return _qk(query, key, None, kernel_size, dilation, 1)


def natten2dqk(query, key, kernel_size, dilation) -> torch.Tensor:
    """:func:`natten2dqkrpb` without a bias."""
    return _qk(query, key, None, kernel_size, dilation, 2)


def natten3dqk(query, key, kernel_size_d, kernel_size, dilation_d, dilation) -> torch.Tensor:
    """:func:`natten3dqkrpb` without a bias."""
    return natten3dqkrpb(query, key, None, kernel_size_d, kernel_size, dilation_d, dilation)


def natten1dav(attn: torch.Tensor, value: torch.Tensor, kernel_size, dilation) -> torch.Tensor:
    """``[B, H, L, D]``: weights ``attn [B, H, L, k]`` applied to ``value [B, H, L, D]``."""
    return _av(attn, value, kernel_size, dilation, 1)


def natten2dav(attn: torch.Tensor, value: torch.Tensor, kernel_size, dilation) -> torch.Tensor:
    """``[B, H, X, Y, D]``: weights ``attn [B, H, X, Y, k*k]`` applied to ``value``."""
    return _av(attn, value, kernel_size, dilation, 2)


def natten3dav(attn: torch.Tensor, value: torch.Tensor, kernel_size_d, kernel_size,
               dilation_d, dilation) -> torch.Tensor:
    """``[B, H, Z, X, Y, D]``: weights ``attn [B, H, Z, X, Y, k_d*k*k]`` applied to ``value``."""
    return _av(attn, value, _3d(kernel_size_d, kernel_size),
               _3d(_dil(dilation_d), _dil(dilation)), 3)
