"""Public functional API: ``na1d``/``na2d``/``na3d``, dense ``attention``, ``merge_attentions``.

Names and keywords follow NATTEN's functional API, so existing code ports by changing
the import. Layout is heads-last: ``[B, *spatial, H, D]``.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import ops
from .backends import BACKENDS, choose_dense_backend, choose_na_backend
from ._eager import DenseFunction, NAFunction, eager_ok
from .merge import merge_attentions
from .params import BoolOrTuple, IntOrTuple, check_qkv, check_scale, normalize

__all__ = ["na1d", "na2d", "na3d", "neighborhood_attention", "attention", "merge_attentions"]


def neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple = 1,
    dilation: IntOrTuple = 1,
    is_causal: BoolOrTuple = False,
    scale: Optional[float] = None,
    additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None,
    rpb: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    return_lse: bool = False,
    *,
    na_dim: int,
):
    """Neighborhood attention over ``na_dim`` spatial axes (see :func:`na2d`)."""
    params = normalize(
        query, key, value, na_dim, kernel_size, stride, dilation, is_causal, scale,
        rpb, additional_keys, additional_values,
    )
    name = choose_na_backend(query, key, value, rpb, params, backend)
    impl = BACKENDS[name]
    if impl.composite and not torch.compiler.is_compiling():  # differentiable as it is
        out, lse = impl.na_composite(query, key, value, rpb, params)
    elif eager_ok(query, key, value, rpb):  # no custom-op dispatch cost (nattn/_eager.py)
        out, lse = NAFunction.apply(query, key, value, rpb, params, name)
    else:
        out, lse = ops.na_forward(
            query, key, value, rpb, list(params.kernel_size), list(params.stride),
            list(params.dilation), list(params.is_causal), params.scale, name,
        )
    if additional_keys is not None:
        b, heads = query.shape[0], query.shape[-2]
        q_flat = query.reshape(b, -1, heads, query.shape[-1])
        # The extra keys go to the fastest dense backend, whichever NA backend was named.
        extra_out, extra_lse = _dense(q_flat, additional_keys, additional_values, False, params.scale, None)
        out, lse = merge_attentions(
            [out, extra_out.reshape(out.shape)], [lse, extra_lse.reshape(lse.shape)]
        )
    return (out, lse) if return_lse else out


def _doc(na_dim: int) -> str:
    axes = ", ".join("XYZ"[:na_dim])
    return f"""{na_dim}-D neighborhood attention.

    Args:
        query: ``[B, {axes}, H, D]``.
        key, value: ``[B, {axes}, H_kv, D]`` and ``[B, {axes}, H_kv, D_v]``; ``H % H_kv == 0``.
        kernel_size: window size per axis (int or {na_dim}-tuple, >= 2, even allowed).
        stride: query grouping per axis, ``1 <= stride <= kernel_size``.
        dilation: per axis, ``kernel_size * dilation <= size``.
        is_causal: bool or {na_dim}-tuple of bools (causal per axis).
        scale: logit scale, default ``D ** -0.5``.
        additional_keys, additional_values: ``[B, N_extra, H_kv, D]`` / ``[..., D_v]``, attended
            by every query besides its neighborhood, merged exactly through the LSE.
        rpb: relative positional bias ``[H, 2k-1, ...]`` (odd kernels, stride 1, non-causal).
        backend: ``None``/``"auto"`` (fastest that fits) or a backend name.
        return_lse: also return the logsumexp ``[B, {axes}, H]`` (float32).

    Returns:
        ``out [B, {axes}, H, D_v]``, or ``(out, lse)`` when ``return_lse``.
    """


def _make(na_dim: int):
    def na(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None,
           additional_keys=None, additional_values=None, rpb=None, backend=None, return_lse=False):
        return neighborhood_attention(
            query, key, value, kernel_size, stride, dilation, is_causal, scale,
            additional_keys, additional_values, rpb, backend, return_lse, na_dim=na_dim,
        )

    na.__name__ = na.__qualname__ = f"na{na_dim}d"
    na.__doc__ = _doc(na_dim)
    return na


na1d = _make(1)
na2d = _make(2)
na3d = _make(3)


def _dense(q, k, v, is_causal, scale, backend):
    name = choose_dense_backend(q, k, v, is_causal, backend)
    if eager_ok(q, k, v):
        return DenseFunction.apply(q, k, v, is_causal, scale, name)
    return ops.attention_forward(q, k, v, is_causal, scale, name)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: Optional[float] = None,
    return_lse: bool = False,
    backend: Optional[str] = None,
):
    """Dense attention ``[B, N, H, D]`` with optional LSE (memory-bounded, chunked).

    ``key``/``value`` are ``[B, N_kv, H_kv, D]``/``[..., D_v]``; causal masking is
    top-left aligned (query ``i`` sees keys ``j <= i``) and needs ``N == N_kv``.
    """
    check_qkv(query, key, value, na_dim=1)
    if query.shape[0] != key.shape[0]:
        raise ValueError(f"query batch {query.shape[0]} differs from key batch {key.shape[0]}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if is_causal and query.shape[1] != key.shape[1]:
        raise ValueError(
            f"is_causal=True needs as many keys as queries, got N={query.shape[1]}, N_kv={key.shape[1]}"
        )
    scale = check_scale(scale, query.shape[-1])
    out, lse = _dense(query, key, value, is_causal, scale, backend)
    return (out, lse) if return_lse else out

