"""NATTEN 0.14/0.15's ``NeighborhoodAttention1D/2D/3D`` argument order, on nattn's modules.

``NeighborhoodAttention2D(dim, num_heads, kernel_size, dilation=1, bias=True, qkv_bias=True,
qk_scale=None, attn_drop=0.0, proj_drop=0.0)``: relative positional bias on by default
(``bias``), ``dilation=None`` means 1, ``qk_scale`` falsy means ``head_dim ** -0.5``. The 3-D
module takes NATTEN 0.15's ``(dim, num_heads, kernel_size, kernel_size_d=None, dilation=1,
dilation_d=None, bias=True, ...)``. Parameters ``qkv``, ``rpb``, ``proj`` as in those
releases, so their checkpoints load unchanged. Input and output ``[B, *spatial, dim]``.
"""

from __future__ import annotations

from typing import Optional

from ..nn import neighborhood_attention as _na
from ..params import normalize_window_args, rpb_config_reasons

__all__ = ["NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D"]


def _old_args(cls, dim, num_heads, kernel_size, dilation, bias, qk_scale) -> dict:
    if not isinstance(bias, bool):
        raise TypeError(f"bias (relative positional bias on/off) must be a bool, got {bias!r}")
    dilation = 1 if dilation is None else dilation
    if bias:
        kernel, stride, _, causal = normalize_window_args(cls.na_dim, kernel_size, 1, dilation)
        reasons = rpb_config_reasons(kernel, stride, causal)
        if reasons:
            raise ValueError(
                "bias=True (relative positional bias) requires " + ", ".join(reasons)
                + "; pass bias=False for this kernel"
            )
    return dict(embed_dim=dim, num_heads=num_heads, kernel_size=kernel_size, dilation=dilation,
                rel_pos_bias=bias, qk_scale=qk_scale or None)


class _Old:
    def __init__(self, dim: int, num_heads: int, kernel_size, dilation=1, bias: bool = True,
                 qkv_bias: bool = True, qk_scale: Optional[float] = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__(**_old_args(type(self), dim, num_heads, kernel_size, dilation, bias, qk_scale),
                         qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)


class NeighborhoodAttention1D(_Old, _na.NeighborhoodAttention1D):
    """NATTEN 0.14's 1-D module: ``(dim, num_heads, kernel_size, dilation=1, bias=True, ...)``."""


class NeighborhoodAttention2D(_Old, _na.NeighborhoodAttention2D):
    """NATTEN 0.14's 2-D module: ``(dim, num_heads, kernel_size, dilation=1, bias=True, ...)``."""


class NeighborhoodAttention3D(_na.NeighborhoodAttention3D):
    """NATTEN 0.15's 3-D module: ``(dim, num_heads, kernel_size, kernel_size_d=None,
    dilation=1, dilation_d=None, bias=True, ...)``; ``kernel_size``/``dilation`` cover the
    two inner axes, ``kernel_size_d``/``dilation_d`` (default: the same) the depth axis."""

    def __init__(self, dim: int, num_heads: int, kernel_size: int, kernel_size_d: Optional[int] = None,
                 dilation=1, dilation_d=None, bias: bool = True, qkv_bias: bool = True,
                 qk_scale: Optional[float] = None, attn_drop: float = 0.0, proj_drop: float = 0.0):
        dilation = 1 if dilation is None else dilation
        kernel = (kernel_size if kernel_size_d is None else kernel_size_d, kernel_size, kernel_size)
        dils = (dilation if dilation_d is None else dilation_d, dilation, dilation)
        super().__init__(**_old_args(type(self), dim, num_heads, kernel, dils, bias, qk_scale),
                         qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop)
