"""Unfused NA ops: ``na{1,2,3}d_qk`` (window logits) and ``na{1,2,3}d_av`` (apply weights).

``softmax(naXd_qk(q * scale, k, ...)) `` followed by ``naXd_av(weights, v, ...)`` is
``naXd(q, k, v, ..., scale=scale)``. The window of every query and the order of its
``W = prod(kernel_size)`` slots (row-major over the per-axis slots, as in NATTEN) come
from :class:`~nattn.windows.WindowTable`; slots a causal window does not hold get a
``-inf`` logit and are ignored by ``*_av``. Plain PyTorch, differentiable by autograd,
any device. Memory: ``B * N * W * H_kv * D`` for the gathered window keys/values (never
an ``N x N`` tensor).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .params import (
    BoolOrTuple, IntOrTuple, NAParams, _check_tensor, layout_hint,
    normalize, normalize_window_args,
)
from .windows import WindowTable

__all__ = ["na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av", "na_qk", "na_av"]

_AXES = ("X", "Y", "Z")


def _table(spatial, params: NAParams, device) -> WindowTable:
    return WindowTable(spatial, params.kernel_size, params.stride, params.dilation,
                       params.is_causal, device=device)


def na_qk(query, key, kernel_size, stride=1, dilation=1, is_causal=False, rpb=None, *, na_dim: int):
    """Logits ``query . key`` over each query's window, ``[B, *spatial, H, W]``; no scale."""
    # key doubles as the value for the shared layout checks (same shape by construction).
    params = normalize(query, key, key, na_dim, kernel_size, stride, dilation, is_causal, None, rpb)
    b, heads, dim = query.shape[0], query.shape[-2], query.shape[-1]
    spatial = tuple(query.shape[1:-2])
    heads_kv = key.shape[-2]
    groups = heads // heads_kv
    table = _table(spatial, params, query.device)
    key_idx, valid, rpb_idx = table.chunk(0, table.num_tokens)  # [N, W] each
    qf = query.reshape(b, -1, heads_kv, groups, dim)
    k_w = key.reshape(b, -1, heads_kv, dim)[:, key_idx]  # [B, N, W, H_kv, D]
    if any(params.is_causal):  # clamped slots: selected away, so a NaN there cannot leak
        k_w = torch.where(valid[None, :, :, None, None], k_w, 0)
    logits = torch.einsum("bnhgd,bnwhd->bnhgw", qf, k_w)
    if rpb is not None:
        bias = rpb.flatten(1)[:, rpb_idx].to(logits.dtype)  # [H, N, W]
        logits = logits + bias.reshape(heads_kv, groups, *bias.shape[1:]).permute(2, 0, 1, 3)[None]
    logits = logits.masked_fill(~valid[None, :, None, None, :], float("-inf"))
    return logits.reshape(b, *spatial, heads, table.window_size)


def na_av(attn, value, kernel_size, stride=1, dilation=1, is_causal=False, *, na_dim: int):
    """``sum_w attn[..., w] * value[window key w]``, ``[B, *spatial, H, D_v]``."""
    _check_tensor(attn, "attn")
    _check_tensor(value, "value")
    kernel, strides, dils, causal = normalize_window_args(na_dim, kernel_size, stride, dilation, is_causal)
    rank = na_dim + 3
    for name, t in (("attn", attn), ("value", value)):
        if t.dim() != rank:
            axes = ", ".join(_AXES[:na_dim])
            last = "H, W" if name == "attn" else "H_kv, D_v"
            raise ValueError(f"{name} must have rank {rank} ([B, {axes}, {last}]), got shape {tuple(t.shape)}")
    if value.dtype != attn.dtype or value.device != attn.device:
        raise TypeError(
            f"value must match attn's dtype and device ({attn.dtype}, {attn.device}), "
            f"got ({value.dtype}, {value.device})"
        )
    window = math.prod(kernel)
    if attn.shape[:-2] != value.shape[:-2] or attn.shape[-1] != window:
        raise ValueError(
            f"attn must have shape [B, *spatial, H, prod(kernel_size)={window}] with value's "
            f"[B, *spatial] = {tuple(value.shape[:-2])}, got {tuple(attn.shape)}"
        )
    heads, heads_kv, dim_v = attn.shape[-2], value.shape[-2], value.shape[-1]
    if heads % heads_kv != 0:
        raise ValueError(f"attn heads ({heads}) must be divisible by value heads ({heads_kv}) for GQA/MQA")
    spatial = tuple(value.shape[1:-2])
    for axis in range(na_dim):
        if kernel[axis] * dils[axis] > spatial[axis]:
            raise ValueError(
                f"kernel_size * dilation along axis {axis} ({_AXES[axis]}) must be <= the input "
                f"size {spatial[axis]}, got {kernel[axis]} * {dils[axis]}. {layout_hint(value, na_dim)}"
            )
    params = NAParams(kernel, strides, dils, causal, 1.0)
    b, groups = attn.shape[0], heads // heads_kv
    table = _table(spatial, params, value.device)
    key_idx, valid, _ = table.chunk(0, table.num_tokens)
    v_w = value.reshape(b, -1, heads_kv, dim_v)[:, key_idx]  # [B, N, W, H_kv, D_v]
    weights = attn.reshape(b, -1, heads_kv, groups, window)
    if any(causal):  # slots outside the window contribute nothing, whatever attn holds there
        v_w = torch.where(valid[None, :, :, None, None], v_w, 0)
        weights = torch.where(valid[None, :, None, None, :], weights, 0)
    out = torch.einsum("bnhgw,bnwhe->bnhge", weights, v_w)
    return out.reshape(b, *spatial, heads, dim_v)


def _qk_doc(n: int) -> str:
    axes = ", ".join(_AXES[:n])
    return f"""{n}-D neighborhood-attention logits (unfused QK), heads-last.

    Args:
        query: ``[B, {axes}, H, D]``.
        key: ``[B, {axes}, H_kv, D]``, ``H % H_kv == 0`` (GQA/MQA).
        kernel_size, stride, dilation, is_causal: as in ``na{n}d`` (docs/semantics.md).
        rpb: ``[H, 2k-1, ...]`` or None, added to the logits (odd kernels, stride 1, no causal axis).

    Returns:
        ``[B, {axes}, H, W]``, ``W = prod(kernel_size)``: ``query . key`` for every window
        slot (row-major over the per-axis slots), **unscaled** (scale the query, as NATTEN's
        qk ops expect), plus the RPB; ``-inf`` in the slots a causal window does not hold.
        ``softmax`` of it with ``na{n}d_av`` is ``na{n}d``.
    """


def _av_doc(n: int) -> str:
    axes = ", ".join(_AXES[:n])
    return f"""{n}-D neighborhood attention's weighted sum of values (unfused AV), heads-last.

    Args:
        attn: ``[B, {axes}, H, W]`` weights, ``W = prod(kernel_size)``, slots as ``na{n}d_qk``.
        value: ``[B, {axes}, H_kv, D_v]``, ``H % H_kv == 0``, same dtype and device.
        kernel_size, stride, dilation, is_causal: as in ``na{n}d_qk``.

    Returns:
        ``[B, {axes}, H, D_v]``. Slots a causal window does not hold are ignored.
    """


def _make(n: int):
    def qk(query: torch.Tensor, key: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
           dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False,
           rpb: Optional[torch.Tensor] = None) -> torch.Tensor:
        return na_qk(query, key, kernel_size, stride, dilation, is_causal, rpb, na_dim=n)

    def av(attn: torch.Tensor, value: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
           dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False) -> torch.Tensor:
        return na_av(attn, value, kernel_size, stride, dilation, is_causal, na_dim=n)

    qk.__name__ = qk.__qualname__ = f"na{n}d_qk"
    av.__name__ = av.__qualname__ = f"na{n}d_av"
    qk.__doc__, av.__doc__ = _qk_doc(n), _av_doc(n)
    return qk, av


na1d_qk, na1d_av = _make(1)
na2d_qk, na2d_av = _make(2)
na3d_qk, na3d_av = _make(3)
