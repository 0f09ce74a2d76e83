"""NATTEN 0.14/0.15's ``NeighborhoodAttention1D/2D/3D`` argument order, on nattn's modules,
with NATTEN 0.16/0.17's keywords ``is_causal=`` and ``rel_pos_bias=`` as well.

``NeighborhoodAttention2D(dim, num_heads, kernel_size, dilation=1, bias=True, qkv_bias=True,
qk_scale=None, attn_drop=0.0, proj_drop=0.0)``: relative positional bias on by default
(``bias``), ``dilation=None`` means 1, ``qk_scale`` falsy means ``head_dim ** -0.5``. The 3-D
module takes NATTEN 0.15's ``(dim, num_heads, kernel_size, kernel_size_d=None, dilation=1,
dilation_d=None, bias=True, ...)`` or 0.17's per-axis tuples. ``rel_pos_bias=`` (0.17) replaces
``bias=`` (0.14); without either the bias is on, as in 0.14 (0.17 code that relied on its
default ``rel_pos_bias=False`` must say so, or a strict checkpoint load reports the extra
``rpb``). ``is_causal`` is keyword-only: NATTEN 0.17's fifth positional parameter, here
``bias``. Parameters ``qkv``, ``rpb``, ``proj`` as in those
releases, so their checkpoints load unchanged. Input and output ``[B, *spatial, dim]``.
"""

from __future__ import annotations

from typing import Optional

from ..nn import neighborhood_attention as _na
from ..params import normalize_window_args, rpb_config_reasons

__all__ = ["NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D"]


_UNSET = object()  # bias not given: RPB on (NATTEN 0.14) unless rel_pos_bias says (0.16/0.17)


def _old_args(cls, dim, num_heads, kernel_size, dilation, bias, qk_scale, is_causal=False,
              rel_pos_bias=None) -> dict:
    if rel_pos_bias is not None:  # NATTEN 0.16/0.17's keyword
        if bias is not _UNSET:
            raise TypeError("pass either bias (NATTEN 0.14) or rel_pos_bias (NATTEN 0.17), not both")
        if not isinstance(rel_pos_bias, bool):
            raise TypeError(f"rel_pos_bias must be a bool, got {rel_pos_bias!r}")
        bias = rel_pos_bias
    elif bias is _UNSET:
        bias = True
    if not isinstance(bias, bool):
        raise TypeError(f"bias (relative positional bias on/off) must be a bool, got {bias!r}")
    dilation = 1 if dilation is None else dilation
    if bias:
        kernel, stride, _, causal = normalize_window_args(cls.na_dim, kernel_size, 1, dilation, is_causal)
        reasons = rpb_config_reasons(kernel, stride, causal)
        if reasons:
            raise ValueError(
                "bias=True (relative positional bias) requires " + ", ".join(reasons)
                + "; pass bias=False for this kernel"
            )
    return dict(embed_dim=dim, num_heads=num_heads, kernel_size=kernel_size, dilation=dilation,
                is_causal=is_causal, rel_pos_bias=bias, qk_scale=qk_scale or None)


class _Old:
    def __init__(self, dim: int, num_heads: int, kernel_size, dilation=1, bias=_UNSET,
                 qkv_bias: bool = True, qk_scale: Optional[float] = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, *, is_causal=False,
                 rel_pos_bias: Optional[bool] = None):
        super().__init__(**_old_args(type(self), dim, num_heads, kernel_size, dilation, bias, qk_scale,
                                     is_causal, rel_pos_bias),
                         qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)


class NeighborhoodAttention1D(_Old, _na.NeighborhoodAttention1D):
    """NATTEN 0.14's 1-D module: ``(dim, num_heads, kernel_size, dilation=1, bias=True, ...)``."""


class NeighborhoodAttention2D(_Old, _na.NeighborhoodAttention2D):
    """NATTEN 0.14's 2-D module: ``(dim, num_heads, kernel_size, dilation=1, bias=True, ...)``."""


class NeighborhoodAttention3D(_na.NeighborhoodAttention3D):
    """NATTEN 0.15's 3-D module: ``(dim, num_heads, kernel_size, kernel_size_d=None,
    dilation=1, dilation_d=None, bias=True, ...)``; ``kernel_size``/``dilation`` cover the
    two inner axes, ``kernel_size_d``/``dilation_d`` (default: the same) the depth axis."""

    def __init__(self, dim: int, num_heads: int, kernel_size, kernel_size_d: Optional[int] = None,
                 dilation=1, dilation_d=None, bias=_UNSET, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop: float = 0.0, proj_drop: float = 0.0, *,
                 is_causal=False, rel_pos_bias: Optional[bool] = None):
        dilation = 1 if dilation is None else dilation
        if isinstance(kernel_size, (tuple, list)):  # NATTEN 0.17: per-axis tuples, no *_d arguments
            if kernel_size_d is not None or dilation_d is not None:
                raise TypeError("kernel_size_d / dilation_d go with an int kernel_size (NATTEN 0.15), not a tuple")
            kernel, dils = tuple(kernel_size), dilation
        else:
            kernel = (kernel_size if kernel_size_d is None else kernel_size_d, kernel_size, kernel_size)
            dils = (dilation if dilation_d is None else dilation_d, dilation, dilation)
        super().__init__(**_old_args(type(self), dim, num_heads, kernel, dils, bias, qk_scale,
                                     is_causal, rel_pos_bias),
                         qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
