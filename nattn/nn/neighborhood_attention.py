"""NeighborhoodAttention1D/2D/3D: token-mixing layers over ``[B, *spatial, C]`` inputs.

One fused ``qkv`` projection, NA over the spatial axes (heads-last, straight into
:func:`nattn.functional.neighborhood_attention`), an output projection. The parameter
names (``qkv``, ``rpb``, ``proj``) are those of NAT/DiNAT checkpoints, so their weights
load without renaming.

Attention dropout (``attn_drop > 0``, training mode) runs fused, as the functional call's
``dropout_p`` (docs/semantics.md), when the backend chosen for the call with dropout is a fast
one for it: the ``cuda`` backend where libnattn's tensor-core family takes the problem
(float16/bfloat16, head dims <= 128, SM80+), or the reference where it would run the call
anyway (CPU). Otherwise, and while ``torch.compile`` traces the layer, the layer keeps the
unfused ``nattn.nn.na_explicit`` path, which forms the weights and applies ``nn.Dropout``.
"""

from __future__ import annotations

from functools import partial

import dataclasses
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .. import _call_cache
from .._cuda import library
from ..backends import NoBackendError, choose_na_backend, kernel_config
from ..functional import na_packed_qkv, neighborhood_attention
from ..params import NAParams, check_scale, normalize_window_args, rpb_config_reasons
from . import param_cast
from .unfused import na_explicit

IntOrTuple = Union[int, Sequence[int]]
BoolOrTuple = Union[bool, Sequence[bool]]


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _probability(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
    return float(value)


class NeighborhoodAttentionND(nn.Module):
    """Multi-head neighborhood attention over ``na_dim`` spatial axes (use the 1D/2D/3D classes).

    A fused ``qkv`` projection, one [na1d][nattn.functional.na1d] /
    [na2d][nattn.functional.na2d] / [na3d][nattn.functional.na3d] call and an output
    projection ``proj``: input and output ``[B, *spatial, embed_dim]``. Parameter names
    (``qkv``, ``rpb``, ``proj``) are those of NAT/DiNAT checkpoints.

    Args:
        embed_dim: channels ``C`` of input and output; divisible by ``num_heads``.
        num_heads: attention heads; the head dim is ``embed_dim // num_heads``.
        kernel_size: window size per axis (int or tuple), ``>= 2``, even allowed.
        stride: per axis (int or tuple), ``1 <= stride <= kernel_size``.
        dilation: per axis (int or tuple), ``>= 1``; ``None`` means 1 (as the original NAT
            code passes it).
        is_causal: bool or per-axis tuple of bools.
        qkv_bias: bias in the fused qkv projection.
        qk_scale: logit scale; None means ``head_dim ** -0.5``.
        attn_drop: dropout on the attention weights, in ``[0, 1)``, applied in training mode.
            There the layer passes it as the fused op's ``dropout_p`` (docs/semantics.md,
            "Attention dropout": the weights are never formed) when the backend that runs the
            call with dropout is a fast one for it: any backend but the reference (``cuda``
            on its tensor-core family: float16/bfloat16, head dims <= 128, SM80+), or the
            reference where it also runs the call without dropout (CPU). Otherwise (say
            float32 on a GPU, or while ``torch.compile`` traces the layer, which cannot
            make that choice) it takes an unfused path (``nattn.nn.na_explicit``) that
            forms the weights and drops them with ``nn.Dropout``; both are the same
            attention dropout in distribution (their random streams differ).
        proj_drop: dropout after the output projection, in ``[0, 1)``.
        rel_pos_bias: learn a relative positional bias table ``rpb [num_heads, 2k-1, ...]``
            (NAT/DiNAT; truncated-normal init, std 0.02); needs odd kernels, stride 1 and
            no causal axis.
        backend: NA backend name; None for automatic choice.
        context_parallel: a ``nattn.distributed.ContextParallel(group, axis)`` when the
            input is this rank's contiguous shard along spatial ``axis`` of a problem
            sharded over ``group``: attention then runs across the group, head-parallel
            (``nattn.distributed.na_ulysses``; ``num_heads`` must divide by the group size)
            or with key/value halos (``scheme="halo"``, ``na_halo``), and the output is this
            rank's shard. Replicated parameters (``rpb``) get this
            rank's share of their gradient: sum it over the group. None: one process.

    Raises:
        TypeError: a ``qk_scale`` or ``rel_pos_bias`` of the wrong type, or a window
            argument of the wrong type.
        ValueError: a non-positive ``embed_dim``/``num_heads``, ``embed_dim`` not divisible
            by ``num_heads``, window arguments out of range, dropout outside ``[0, 1)``, or
            ``rel_pos_bias=True`` with an even kernel, a stride or a causal axis.

    Inputs smaller than ``kernel_size * dilation`` along an axis are zero-padded at the
    end of that axis (before the qkv projection) and the output is cropped back, as
    NAT/DiNAT did, so that small feature maps still run.
    """

    na_dim: int = 0

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        kernel_size: IntOrTuple,
        stride: IntOrTuple = 1,
        dilation: Optional[IntOrTuple] = 1,
        is_causal: BoolOrTuple = False,
        qkv_bias: bool = True,
        qk_scale: Optional[float] = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        rel_pos_bias: bool = False,
        backend: Optional[str] = None,
        context_parallel=None,
    ):
        super().__init__()
        n = self.na_dim
        if n not in (1, 2, 3):
            raise TypeError("use NeighborhoodAttention1D, NeighborhoodAttention2D or NeighborhoodAttention3D")
        self.embed_dim = _positive_int(embed_dim, "embed_dim")
        self.num_heads = _positive_int(num_heads, "num_heads")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.head_dim = embed_dim // num_heads
        dilation = 1 if dilation is None else dilation  # NAT's original layers pass None
        self.kernel_size, self.stride, self.dilation, self.is_causal = normalize_window_args(
            n, kernel_size, stride, dilation, is_causal)
        self.scale = check_scale(qk_scale, self.head_dim, "qk_scale")
        if not isinstance(rel_pos_bias, bool):
            raise TypeError(f"rel_pos_bias must be a bool, got {rel_pos_bias!r}")
        if rel_pos_bias:
            reasons = rpb_config_reasons(self.kernel_size, self.stride, self.is_causal)
            if reasons:
                raise ValueError("rel_pos_bias=True requires " + ", ".join(reasons))
        self.backend = backend
        # Measured dispatch for this module's calls (True / False; None: `with
        # nattn.autotune()` or NATTN_AUTOTUNE decide), a plain attribute like `backend`.
        self.tune: Optional[bool] = None
        self.deterministic: Optional[bool] = None  # as na2d's deterministic=
        if context_parallel is not None:
            from ..distributed import ContextParallel
            if not isinstance(context_parallel, ContextParallel):
                raise TypeError("context_parallel must be a nattn.distributed.ContextParallel (or None), "
                                f"got {type(context_parallel).__name__}")
            if not 0 <= context_parallel.axis < n:
                raise ValueError(f"context_parallel.axis must be a spatial axis in [0, {n}), "
                                 f"got {context_parallel.axis}")
        self.context_parallel = context_parallel

        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_bias)
        if rel_pos_bias:
            self.rpb = nn.Parameter(torch.zeros(num_heads, *(2 * k - 1 for k in self.kernel_size)))
            nn.init.trunc_normal_(self.rpb, std=0.02, a=-2.0, b=2.0)
        else:
            self.register_parameter("rpb", None)
        self.attn_drop_p = _probability(attn_drop, "attn_drop")
        self.attn_drop = nn.Dropout(self.attn_drop_p)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(_probability(proj_drop, "proj_drop"))
        # libnattn's first load (file system checks, dlopen; once per process, no CUDA call)
        # happens here, outside any graph torch.compile traces: loading inside one would
        # break it in two (the dispatch then only reads the loaded state).
        library.load()

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, dilation={self.dilation}, "
            f"is_causal={self.is_causal}, rel_pos_bias={self.rpb is not None}, scale={self.scale:.4g}"
        )

    def _fused_dropout(self, q, k, v, extra_k, extra_v) -> bool:
        """Whether a training call with ``attn_drop > 0`` runs its dropout fused (the functional
        call's ``dropout_p``) instead of through na_explicit; remembered per signature."""
        if torch.compiler.is_compiling():  # the dispatch is not traced (backends/deferred.py)
            return False
        args = ("nn.attn_drop", self.na_dim, self.kernel_size, self.stride, self.dilation, self.is_causal,
                self.scale, self.backend, self.deterministic, self.attn_drop_p)
        sig = _call_cache.key((q, k, v, self.rpb, extra_k, extra_v), args)
        hit = _call_cache.get(sig)
        if hit is not None:
            return hit[0]
        plain = NAParams(self.kernel_size, self.stride, self.dilation, self.is_causal, self.scale)
        try:  # the backend that runs the call with dropout (only those with supports_dropout)
            chosen = choose_na_backend(q, k, v, self.rpb, dataclasses.replace(plain, dropout_p=self.attn_drop_p),
                                       self.backend, tune=False, deterministic=self.deterministic)
            fused = kernel_config.split(chosen)[0] != "reference"
            if not fused:  # the reference: fused only where it also runs the call without dropout
                without = choose_na_backend(q, k, v, self.rpb, plain, self.backend, tune=False,
                                            deterministic=self.deterministic)
                fused = kernel_config.split(without)[0] == "reference"
        except NoBackendError:  # e.g. backend="cuda" with float32: the unfused path runs anything
            fused = False
        _call_cache.put(sig, (fused,))
        return fused

    def _padding(self, spatial: Tuple[int, ...]) -> Tuple[int, ...]:
        return tuple(max(0, k * d - n) for n, k, d in zip(spatial, self.kernel_size, self.dilation))

    def _project_extra(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of extra tokens ``[B, N_extra, C]`` through the same projection."""
        c = self.embed_dim
        if tokens.dim() != 3 or tokens.shape[-1] != c:
            raise ValueError(f"additional_tokens must be [B, N_extra, {c}], got {tuple(tokens.shape)}")
        bias = self.qkv.bias[c:] if self.qkv.bias is not None else None
        kv = F.linear(tokens, self.qkv.weight[c:], bias)
        kv = kv.reshape(tokens.shape[0], tokens.shape[1], 2, self.num_heads, self.head_dim)
        return kv[:, :, 0], kv[:, :, 1]

    def forward(self, x: torch.Tensor, additional_tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attend over the neighborhoods of ``x`` (and ``additional_tokens``, if given).

        Args:
            x: ``[B, *spatial, C]`` with ``na_dim`` spatial axes and ``C = embed_dim``.
            additional_tokens: ``[B, N_extra, C]`` or None: extra tokens (class/register
                tokens, a cross-attention context) projected to keys and values with the
                key/value rows of ``qkv`` and attended by every query besides its
                neighborhood.

        Returns:
            ``[B, *spatial, C]``, the shape of ``x``.

        Raises:
            ValueError: ``x`` or ``additional_tokens`` of the wrong rank or channels.
        """
        n = self.na_dim
        if x.dim() != n + 2 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"{type(self).__name__} expects input [B, {n} spatial axes, C={self.embed_dim}], "
                f"got shape {tuple(x.shape)}"
            )
        spatial = tuple(x.shape[1:-1])
        cp = self.context_parallel
        pad = self._padding(spatial) if cp is None else (0,) * n  # a shard is not the whole grid
        if any(pad):
            flat = [0, 0]  # channels
            for p in reversed(pad):
                flat += [0, p]
            x = F.pad(x, flat)
        b = x.shape[0]
        qkv = param_cast.linear(self.qkv, x).reshape(b, *x.shape[1:-1], 3, self.num_heads, self.head_dim)
        out = None
        if cp is None and additional_tokens is None and not (self.training and self.attn_drop_p > 0):
            # training, eagerly: one d(qkv) from the backward (no unbind, no stack copy)
            out = na_packed_qkv(qkv, self.kernel_size, self.stride, self.dilation, self.is_causal, self.scale,
                                self.rpb, self.backend, self.tune, self.deterministic, na_dim=n)
        if out is None:
            out = self._attend(qkv, additional_tokens)
        out = out.reshape(b, *x.shape[1:-1], self.embed_dim)
        if any(pad):
            out = out[(slice(None),) + tuple(slice(0, s) for s in spatial)]
        out = param_cast.linear(self.proj, out)
        return self.proj_drop(out) if self.proj_drop.p > 0 else out  # a no-op module is host time

    def _attend(self, qkv: torch.Tensor, additional_tokens: Optional[torch.Tensor]) -> torch.Tensor:
        """NA over ``qkv``'s q, k and v views: context parallel, attention dropout (fused or
        not), or the plain call (with the extra tokens' keys and values, if any)."""
        n, cp = self.na_dim, self.context_parallel
        q, k, v = qkv.unbind(dim=-3)
        extra_k = extra_v = None
        if additional_tokens is not None:
            extra_k, extra_v = self._project_extra(additional_tokens)
        if cp is not None:
            if self.training and self.attn_drop_p > 0:
                raise NotImplementedError("attention dropout with context_parallel (no unfused distributed path)")
            from ..distributed import na_halo, na_ulysses
            scheme = (partial(na_halo, overlap=cp.overlap) if cp.scheme == "halo"
                      else partial(na_ulysses, chunks=cp.chunks))
            out = scheme(q, k, v, self.kernel_size, self.stride, self.dilation, self.is_causal, self.scale,
                         extra_k, extra_v, self.rpb, self.backend, na_dim=n, axis=cp.axis, group=cp.group)
        elif self.training and self.attn_drop_p > 0 and self._fused_dropout(q, k, v, extra_k, extra_v):
            out = neighborhood_attention(
                q, k, v, self.kernel_size, self.stride, self.dilation, self.is_causal, self.scale,
                extra_k, extra_v, self.rpb, self.backend, na_dim=n, tune=self.tune,
                deterministic=self.deterministic, dropout_p=self.attn_drop_p,
            )
        elif self.training and self.attn_drop_p > 0:
            params = NAParams(self.kernel_size, self.stride, self.dilation, self.is_causal, self.scale)
            out = na_explicit(q, k, v, params, self.rpb, extra_k, extra_v, weights_hook=self.attn_drop)
        else:
            out = neighborhood_attention(
                q, k, v, self.kernel_size, self.stride, self.dilation, self.is_causal, self.scale,
                extra_k, extra_v, self.rpb, self.backend, na_dim=n, tune=self.tune,
                deterministic=self.deterministic,
            )
        return out


class NeighborhoodAttention1D(NeighborhoodAttentionND):
    """1-D neighborhood attention over ``[B, L, C]`` inputs.

    Arguments and behaviour: [NeighborhoodAttentionND][nattn.nn.NeighborhoodAttentionND].

    Example:
        ```python
        layer = NeighborhoodAttention1D(embed_dim=64, num_heads=4, kernel_size=7)
        x = torch.randn(2, 256, 64)
        y = layer(x)  # same shape as x
        ```
    """

    na_dim = 1


class NeighborhoodAttention2D(NeighborhoodAttentionND):
    """2-D neighborhood attention over ``[B, H, W, C]`` inputs.

    Arguments and behaviour: [NeighborhoodAttentionND][nattn.nn.NeighborhoodAttentionND].

    Example:
        ```python
        layer = NeighborhoodAttention2D(embed_dim=64, num_heads=4, kernel_size=7, dilation=2)
        x = torch.randn(2, 32, 32, 64)
        y = layer(x)  # same shape as x
        ```
    """

    na_dim = 2


class NeighborhoodAttention3D(NeighborhoodAttentionND):
    """3-D neighborhood attention over ``[B, T, H, W, C]`` inputs.

    Arguments and behaviour: [NeighborhoodAttentionND][nattn.nn.NeighborhoodAttentionND].

    Example:
        ```python
        layer = NeighborhoodAttention3D(embed_dim=64, num_heads=4, kernel_size=(3, 7, 7))
        x = torch.randn(2, 8, 16, 16, 64)
        y = layer(x)  # same shape as x
        ```
    """

    na_dim = 3
