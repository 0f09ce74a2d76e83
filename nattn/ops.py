"""torch.library custom ops: one forward/backward pair for NA, one for dense attention.

The backend is an argument of the op, so every backend shares the fake (meta)
implementations and the autograd registration, and ``torch.compile(fullgraph=True)``
sees one opaque op per call instead of a graph break.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .backends import BACKENDS, deferred
from .backends import get as get_backend
from .params import NAParams


def _params(kernel_size, stride, dilation, is_causal, scale) -> NAParams:
    # is_causal travels as int[] because torch.jit tracing (fvcore) cannot record bool[].
    return NAParams(tuple(kernel_size), tuple(stride), tuple(dilation), tuple(bool(c) for c in is_causal), scale)


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- NA
@torch.library.custom_op("nattn::na_forward", mutates_args=())
def na_forward(
    q: Tensor, k: Tensor, v: Tensor, rpb: Optional[Tensor],
    kernel_size: List[int], stride: List[int], dilation: List[int], is_causal: List[int],
    scale: float, backend: str,
) -> Tuple[Tensor, Tensor]:
    params = _params(kernel_size, stride, dilation, is_causal, scale)
    backend = deferred.resolve_na(backend, q, k, v, rpb, params)
    return get_backend(backend).na_forward(q, k, v, rpb, params)


@na_forward.register_fake
def _(q, k, v, rpb, kernel_size, stride, dilation, is_causal, scale, backend):
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    lse = q.new_empty(q.shape[:-1], dtype=_lse_dtype(q.dtype))
    return out, lse


@torch.library.custom_op("nattn::na_backward", mutates_args=())
def na_backward(
    grad_out: Tensor, grad_lse: Tensor, q: Tensor, k: Tensor, v: Tensor, rpb: Optional[Tensor],
    out: Tensor, lse: Tensor,
    kernel_size: List[int], stride: List[int], dilation: List[int], is_causal: List[int],
    scale: float, backend: str,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    params = _params(kernel_size, stride, dilation, is_causal, scale)
    backend = deferred.resolve_na(backend, q, k, v, rpb, params)
    dq, dk, dv, drpb = get_backend(backend).na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params)
    if drpb is None:
        drpb = q.new_empty(0)  # custom ops cannot return None
    return dq, dk, dv, drpb


@na_backward.register_fake
def _(grad_out, grad_lse, q, k, v, rpb, out, lse, kernel_size, stride, dilation, is_causal, scale, backend):
    drpb = torch.empty_like(rpb) if rpb is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), drpb


def _na_setup_context(ctx, inputs, output):
    q, k, v, rpb, kernel_size, stride, dilation, is_causal, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, rpb, out, lse)
    ctx.args = (kernel_size, stride, dilation, is_causal, scale, backend)


def _na_backward(ctx, grad_out, grad_lse):
    q, k, v, rpb, out, lse = ctx.saved_tensors
    grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse
    dq, dk, dv, drpb = na_backward(grad_out, grad_lse, q, k, v, rpb, out, lse, *ctx.args)
    return dq, dk, dv, (drpb if rpb is not None else None), None, None, None, None, None, None


na_forward.register_autograd(_na_backward, setup_context=_na_setup_context)


# ------------------------------------------------------------------------ dense
@torch.library.custom_op("nattn::attention_forward", mutates_args=())
def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float, backend: str
) -> Tuple[Tensor, Tensor]:
    return BACKENDS[deferred.resolve_dense(backend, q, k, v, is_causal)].dense_forward(q, k, v, is_causal, scale)


@attention_forward.register_fake
def _(q, k, v, is_causal, scale, backend):
    return q.new_empty(*q.shape[:-1], v.shape[-1]), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q.dtype))


@torch.library.custom_op("nattn::attention_backward", mutates_args=())
def attention_backward(
    grad_out: Tensor, grad_lse: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    is_causal: bool, scale: float, backend: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    return BACKENDS[deferred.resolve_dense(backend, q, k, v, is_causal)].dense_backward(q, k, v, out, lse, grad_out, grad_lse, is_causal, scale)


@attention_backward.register_fake
def _(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _dense_setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (is_causal, scale, backend)


def _dense_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse
    dq, dk, dv = attention_backward(grad_out, grad_lse, q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, None, None, None


attention_forward.register_autograd(_dense_backward, setup_context=_dense_setup_context)
