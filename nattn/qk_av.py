"""Unfused NA ops: ``na{1,2,3}d_qk`` (window logits) and ``na{1,2,3}d_av`` (apply weights).

``softmax(naXd_qk(q * scale, k, ...))`` followed by ``naXd_av(weights, v, ...)`` is
``naXd(q, k, v, ..., scale=scale)``. The window of every query and the order of its
``W = prod(kernel_size)`` slots (row-major over the per-axis slots, as in NATTEN) come
from :class:`~nattn.windows.WindowTable`; slots a causal window does not hold get a
``-inf`` logit and are ignored by ``*_av``. Differentiable (first derivatives). CUDA
tensors run libnattn's window kernels (nattn/qk_av_kernels.py: fp32/fp16/bf16, head dims
that are multiples of 8); CPU tensors run the tiled backend's boxes (nattn/qk_av_tiled.py:
matrix products over each box's key range); everything else runs plain PyTorch
(nattn/qk_av_math.py gathers the window keys/values a chunk of queries at a time, forward
and backward). Memory: the inputs and the logits
``B * N * H * W``, plus one chunk; never an ``N x N`` tensor.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import qk_av_kernels
from .params import (
    BoolOrTuple, IntOrTuple, NAParams, _check_tensor, layout_hint,
    normalize, normalize_window_args,
)
from .qk_av_kernels import KernelAV, KernelQK
from .qk_av_math import WindowAV, WindowQK
from .qk_av_tiled import TiledAV, TiledQK
from .windows import WindowTable

# CUDA tensors run libnattn's window kernels where it has them (nattn/qk_av_kernels.py);
# False sends them through the plain PyTorch path too (tests and benchmarks compare both).
USE_KERNELS = True
# CPU tensors run the tiled backend's boxes (nattn/qk_av_tiled.py); False: the window gathers.
USE_TILED = True


def _tiled(t: torch.Tensor) -> bool:
    # traced code keeps the window gathers (the boxes' index tensors are cached per problem)
    return USE_TILED and t.device.type == "cpu" and not torch.compiler.is_compiling()


def _kernels(t: torch.Tensor, na_dim: int, dim: int, dtype: Optional[torch.dtype] = None) -> bool:
    # Traced code keeps the PyTorch path, which dynamo can follow (the kernels are ctypes calls).
    return USE_KERNELS and not torch.compiler.is_compiling() and qk_av_kernels.available(t, na_dim, dim, dtype)

__all__ = ["na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av", "na_qk", "na_av"]

_AXES = ("X", "Y", "Z")


def _table(spatial, params: NAParams, device) -> WindowTable:
    return WindowTable(spatial, params.kernel_size, params.stride, params.dilation,
                       params.is_causal, device=device)


def na_qk(
    query: torch.Tensor, key: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
    dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False,
    rpb: Optional[torch.Tensor] = None, *, na_dim: int,
) -> torch.Tensor:
    """Neighborhood-attention logits (unfused QK) over ``na_dim`` spatial axes.

    ``softmax`` of them (after scaling the query) with :func:`na_av` is the fused op.

    Args:
        query: ``[B, *spatial, H, D]`` (heads-last, as ``naXd``).
        key: ``[B, *spatial, H_kv, D]``, ``H % H_kv == 0`` (GQA/MQA), same dtype and device.
        kernel_size: window size per axis (int or tuple), as in the fused op (docs/semantics.md).
        stride: per axis, ``1 <= stride <= kernel_size``.
        dilation: per axis, ``>= 1``.
        is_causal: a bool or a per-axis tuple of bools.
        rpb: ``[H, 2k-1, ...]`` or None, added to the logits; needs odd kernels, stride 1
            and no causal axis.
        na_dim: the number of spatial axes, 1, 2 or 3 (keyword-only).

    Returns:
        ``[B, *spatial, H, W]`` with ``W = prod(kernel_size)``: ``query . key`` for every
        window slot (row-major over the per-axis slots, as NATTEN), **not scaled** (scale
        the query, as with NATTEN's qk ops), plus the RPB; ``-inf`` in the slots a causal
        window does not hold.

    Raises:
        TypeError, ValueError: as the fused op, naming the argument.
    """
    # key doubles as the value for the shared layout checks (same shape by construction).
    params = normalize(query, key, key, na_dim, kernel_size, stride, dilation, is_causal, None, rpb)
    b, heads, dim = query.shape[0], query.shape[-2], query.shape[-1]
    spatial = tuple(query.shape[1:-2])
    heads_kv = key.shape[-2]
    groups = heads // heads_kv
    table = _table(spatial, params, query.device)
    if _kernels(query, na_dim, dim):
        logits = KernelQK.apply(query, key, params)  # -inf in the slots a causal window lacks
        if rpb is not None:  # (no causal axis with an RPB)
            logits = logits + table.bias(rpb, logits.dtype).reshape(1, *spatial, heads, table.window_size)
        return logits
    tiled = _tiled(query)
    if tiled:
        logits = TiledQK.apply(query, key, params)  # 0 in the slots a causal window lacks
        if rpb is None and not any(params.is_causal):
            return logits  # (no window table to build, no masking pass)
        logits = logits.reshape(b, -1, heads_kv, groups, table.window_size)
    key_idx, valid, rpb_idx = table.chunk(0, table.num_tokens)  # [N, W] each
    if not tiled:
        qf = query.reshape(b, -1, heads_kv, groups, dim)
        # [B, N, H_kv, G, W] in chunks of queries; clamped slots never read (NaN there cannot leak)
        logits = WindowQK.apply(qf, key.reshape(b, -1, heads_kv, dim), key_idx, valid, any(params.is_causal))
    if rpb is not None:
        logits = logits + table.bias(rpb, logits.dtype, rpb_idx).reshape(1, -1, heads_kv, groups, table.window_size)
    if any(params.is_causal):  # (every slot holds a key otherwise)
        logits = logits.masked_fill(~valid[None, :, None, None, :], float("-inf"))
    return logits.reshape(b, *spatial, heads, table.window_size)


def na_av(
    attn: torch.Tensor, value: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
    dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False, *, na_dim: int,
) -> torch.Tensor:
    """Neighborhood attention's weighted sum of window values (unfused AV) over ``na_dim`` axes.

    ``out[b, i, h] = sum_w attn[b, i, h, w] * value[b, key_w(i), h // (H // H_kv)]``.

    Args:
        attn: ``[B, *spatial, H, W]`` weights, ``W = prod(kernel_size)``, slots as ``*_qk``.
        value: ``[B, *spatial, H_kv, D_v]``, ``H % H_kv == 0``, same dtype and device.
        kernel_size: as in ``*_qk``.
        stride: as in ``*_qk``.
        dilation: as in ``*_qk``.
        is_causal: as in ``*_qk``.
        na_dim: the number of spatial axes, 1, 2 or 3 (keyword-only).

    Returns:
        ``[B, *spatial, H, D_v]``; slots a causal window does not hold are ignored.

    Raises:
        TypeError, ValueError: naming the argument.
    """
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
    if _kernels(value, na_dim, dim_v):
        return KernelAV.apply(attn, value, params)
    if _tiled(value):
        return TiledAV.apply(attn, value, params)
    b, groups = attn.shape[0], heads // heads_kv
    table = _table(spatial, params, value.device)
    key_idx, valid, _ = table.chunk(0, table.num_tokens)
    weights = attn.reshape(b, -1, heads_kv, groups, window)
    masked = any(causal)
    if masked:  # slots outside the window contribute nothing, whatever attn holds there
        weights = torch.where(valid[None, :, None, None, :], weights, 0)
    out = WindowAV.apply(weights, value.reshape(b, -1, heads_kv, dim_v), key_idx, valid, masked)
    return out.reshape(b, *spatial, heads, dim_v)


def na1d_qk(query: torch.Tensor, key: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
            dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False,
            rpb: Optional[torch.Tensor] = None) -> torch.Tensor:
    """1-D logits ``[B, *spatial, H, prod(kernel_size)]``, unscaled: [na_qk][nattn.qk_av.na_qk] with ``na_dim=1``."""
    return na_qk(query, key, kernel_size, stride, dilation, is_causal, rpb, na_dim=1)


def na2d_qk(query: torch.Tensor, key: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
            dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False,
            rpb: Optional[torch.Tensor] = None) -> torch.Tensor:
    """2-D logits ``[B, *spatial, H, prod(kernel_size)]``, unscaled: [na_qk][nattn.qk_av.na_qk] with ``na_dim=2``."""
    return na_qk(query, key, kernel_size, stride, dilation, is_causal, rpb, na_dim=2)


def na3d_qk(query: torch.Tensor, key: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
            dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False,
            rpb: Optional[torch.Tensor] = None) -> torch.Tensor:
    """3-D logits ``[B, *spatial, H, prod(kernel_size)]``, unscaled: [na_qk][nattn.qk_av.na_qk] with ``na_dim=3``."""
    return na_qk(query, key, kernel_size, stride, dilation, is_causal, rpb, na_dim=3)


def na1d_av(attn: torch.Tensor, value: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
            dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False) -> torch.Tensor:
    """1-D weighted sum of window values: [na_av][nattn.qk_av.na_av] with ``na_dim=1``."""
    return na_av(attn, value, kernel_size, stride, dilation, is_causal, na_dim=1)


def na2d_av(attn: torch.Tensor, value: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
            dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False) -> torch.Tensor:
    """2-D weighted sum of window values: [na_av][nattn.qk_av.na_av] with ``na_dim=2``."""
    return na_av(attn, value, kernel_size, stride, dilation, is_causal, na_dim=2)


def na3d_av(attn: torch.Tensor, value: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
            dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False) -> torch.Tensor:
    """3-D weighted sum of window values: [na_av][nattn.qk_av.na_av] with ``na_dim=3``."""
    return na_av(attn, value, kernel_size, stride, dilation, is_causal, na_dim=3)
