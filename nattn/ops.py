"""torch.library custom ops: one forward/backward pair for NA, one for dense attention.

The backend is an argument of the op, so every backend shares the fake (meta)
implementations and the autograd registration, and ``torch.compile(fullgraph=True)``
sees one opaque op per call instead of a graph break.

Attention dropout travels as two trailing arguments with defaults, ``dropout_p`` and ``rng``
(the call's ``[seed, offset]`` int64 tensor, nattn/dropout.py; the dense ops also take
``key_offset``, the global index of their key 0): the op is a pure function of its inputs, the
backward op receives the forward's ``rng``, and calls without dropout pass neither.

The ops are defined with the low-level ``torch.library.Library`` API, not
``torch.library.custom_op``: the latter wraps every kernel call in a Python checker that
cost ~290 us per call on the H200 machine's host (torch 2.11, seventh session: a compiled
forward + backward paid 1.2 ms of host time against 0.5 ms eager), more than a DiNAT
layer's kernels. The schemas are the ones ``custom_op`` inferred from the signatures.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ._eager import na_backward_packed, na_forward_packed_only
from .backends import BACKENDS, deferred
from .backends import get as get_backend
from .params import NAParams


# The ops' NAParams by their arguments: a model calls each op with a few argument sets, and
# a kept instance also keeps its hash (the backends' call caches hash it every call).
_PARAMS_CACHE: dict = {}


def _params(kernel_size, stride, dilation, is_causal, scale, dropout_p=0.0) -> NAParams:
    key = (*kernel_size, None, *stride, None, *dilation, None, *is_causal, scale, dropout_p)
    params = _PARAMS_CACHE.get(key)
    if params is None:
        if len(_PARAMS_CACHE) >= 512:  # bounded: e.g. a sweep over scales
            _PARAMS_CACHE.clear()
        # is_causal travels as int[] because torch.jit tracing (fvcore) cannot record bool[].
        params = _PARAMS_CACHE[key] = NAParams(tuple(kernel_size), tuple(stride), tuple(dilation),
                                               tuple(bool(c) for c in is_causal), scale, dropout_p)
    return params


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_LIB = torch.library.Library("nattn", "FRAGMENT")


def _define(schema: str, impl, fake, backward=None, setup_context=None):
    """Define ``nattn::<name>`` from ``schema``, with one implementation for every device
    (the backend argument picks the code), a fake kernel, and autograd when given; return
    the callable overload."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"nattn::{name}", fake, lib=_LIB)
    op = getattr(torch.ops.nattn, name).default
    if backward is not None:
        kernel = _autograd_kernel(op, impl, backward, setup_context)
        if kernel is None:
            torch.library.register_autograd(f"nattn::{name}", backward, setup_context=setup_context, lib=_LIB)
        else:
            _LIB.impl(name, kernel, "Autograd", with_keyset=True)
    return op


# Keys below autograd on which a call may run its implementation directly: plain tensors,
# no tracing, fake tensors, functionalization or dispatch modes (those put their own key first).
_DIRECT_KEYS = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)


def _autograd_kernel(op, impl, backward, setup_context):
    """The autograd kernel ``torch.library.register_autograd`` would register, with one
    shortcut: a call that records no gradient on plain CPU / CUDA tensors runs ``impl`` at
    once instead of redispatching below autograd through the dispatcher, which boxed the
    arguments into Python a second time (a no-grad forward op call 33.6 -> 27.8 us on a CPU
    stand-in; every nattn op inside a compiled graph is such a call). None where this torch
    lacks the pieces (then register_autograd's own kernel)."""
    try:
        from torch._library import autograd as _autograd
        made = _autograd.make_autograd_impl(op, _autograd.Info(backward, setup_context))
        below_autograd = torch._C._after_autograd_keyset
        any_requires_grad = torch._C._any_requires_grad
        below_guard = torch._C._AutoDispatchBelowAutograd
    except (ImportError, AttributeError, TypeError):  # pragma: no cover (older torch)
        return None
    grad_enabled = torch._C.is_grad_enabled

    def kernel(keyset, *args, **kwargs):
        if (not (grad_enabled() and any_requires_grad(*args))
                and (keyset & below_autograd).highestPriorityTypeId() in _DIRECT_KEYS):
            with below_guard():
                return impl(*args, **kwargs)
        return made(keyset, *args, **kwargs)

    return kernel


# --------------------------------------------------------------------------- NA
def _na_forward_impl(
    q: Tensor, k: Tensor, v: Tensor, rpb: Optional[Tensor],
    kernel_size: List[int], stride: List[int], dilation: List[int], is_causal: List[int],
    scale: float, backend: str, dropout_p: float = 0.0, rng: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    params = _params(kernel_size, stride, dilation, is_causal, scale, dropout_p)
    backend = deferred.resolve_na(backend, q, k, v, rpb, params)
    if dropout_p:
        return get_backend(backend).na_forward(q, k, v, rpb, params, rng=rng)
    return get_backend(backend).na_forward(q, k, v, rpb, params)


def _na_forward_fake(q, k, v, rpb, kernel_size, stride, dilation, is_causal, scale, backend, dropout_p=0.0,
                     rng=None):
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    lse = q.new_empty(q.shape[:-1], dtype=_lse_dtype(q.dtype))
    return out, lse


def _na_backward_impl(
    grad_out: Tensor, grad_lse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, rpb: Optional[Tensor],
    out: Tensor, lse: Tensor,
    kernel_size: List[int], stride: List[int], dilation: List[int], is_causal: List[int],
    scale: float, backend: str, dropout_p: float = 0.0, rng: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    params = _params(kernel_size, stride, dilation, is_causal, scale, dropout_p)
    backend = deferred.resolve_na(backend, q, k, v, rpb, params)
    if dropout_p:
        dq, dk, dv, drpb = get_backend(backend).na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params,
                                                            rng=rng)
    else:
        dq, dk, dv, drpb = get_backend(backend).na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params)
    if drpb is None:
        drpb = q.new_empty(0)  # custom ops cannot return None
    return dq, dk, dv, drpb


def _na_backward_fake(grad_out, grad_lse, q, k, v, rpb, out, lse, kernel_size, stride, dilation, is_causal,
                      scale, backend, dropout_p=0.0, rng=None):
    drpb = torch.empty_like(rpb) if rpb is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), drpb


def _na_setup_context(ctx, inputs, output):
    q, k, v, rpb, kernel_size, stride, dilation, is_causal, scale, backend, dropout_p, rng = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, rpb, out, lse, rng)
    ctx.args = (kernel_size, stride, dilation, is_causal, scale, backend, dropout_p)
    # An unused LSE's gradient stays None: no zeros kernel per call (in compiled backward
    # graphs too), the backends skip its term.
    ctx.set_materialize_grads(False)


def _na_backward(ctx, grad_out, grad_lse):
    q, k, v, rpb, out, lse, rng = ctx.saved_tensors
    if grad_out is None:  # only the LSE was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv, drpb = na_backward(grad_out, grad_lse, q, k, v, rpb, out, lse, *ctx.args, rng)
    return dq, dk, dv, (drpb if rpb is not None else None), None, None, None, None, None, None, None, None


na_backward = _define(
    "na_backward(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k, Tensor v, Tensor? rpb, Tensor out, "
    "Tensor lse, SymInt[] kernel_size, SymInt[] stride, SymInt[] dilation, SymInt[] is_causal, float scale, "
    "str backend, float dropout_p=0.0, Tensor? rng=None) -> (Tensor, Tensor, Tensor, Tensor)",
    _na_backward_impl, _na_backward_fake)
na_forward = _define(
    "na_forward(Tensor q, Tensor k, Tensor v, Tensor? rpb, SymInt[] kernel_size, SymInt[] stride, "
    "SymInt[] dilation, SymInt[] is_causal, float scale, str backend, float dropout_p=0.0, Tensor? rng=None) "
    "-> (Tensor, Tensor)",
    _na_forward_impl, _na_forward_fake, _na_backward, _na_setup_context)


# ------------------------------------------------------- NA over a packed qkv (modules)
# q, k and v as the three views of one ``qkv`` [B, *spatial, 3, H, D] (the modules' qkv
# projection): the backward returns one d(qkv), written through its views by backends that
# take given gradient tensors (``writes_grads_into``), so a compiled graph needs no stack of
# dq, dk and dv into it (a full copy of the gradient per layer). No dropout, no extra keys.
def _na_qkv_forward_impl(
    qkv: Tensor, rpb: Optional[Tensor], kernel_size: List[int], stride: List[int], dilation: List[int],
    is_causal: List[int], scale: float, backend: str,
) -> Tuple[Tensor, Tensor]:
    params = _params(kernel_size, stride, dilation, is_causal, scale)
    impl = get_backend(deferred.resolve_na_packed(backend, qkv, rpb, params))
    return na_forward_packed_only(impl, qkv, rpb, params)


def _na_qkv_forward_fake(qkv, rpb, kernel_size, stride, dilation, is_causal, scale, backend):
    shape = (*qkv.shape[:-3], *qkv.shape[-2:])
    return qkv.new_empty(shape), qkv.new_empty(shape[:-1], dtype=_lse_dtype(qkv.dtype))


def _na_qkv_backward_impl(
    grad_out: Tensor, grad_lse: Optional[Tensor], qkv: Tensor, rpb: Optional[Tensor], out: Tensor, lse: Tensor,
    kernel_size: List[int], stride: List[int], dilation: List[int], is_causal: List[int], scale: float,
    backend: str,
) -> Tuple[Tensor, Tensor]:
    params = _params(kernel_size, stride, dilation, is_causal, scale)
    impl = get_backend(deferred.resolve_na_packed(backend, qkv, rpb, params))
    dqkv, drpb = na_backward_packed(impl, qkv, rpb, out, lse, grad_out, grad_lse, params)
    return dqkv, (drpb if drpb is not None else qkv.new_empty(0))


def _na_qkv_backward_fake(grad_out, grad_lse, qkv, rpb, out, lse, kernel_size, stride, dilation, is_causal, scale,
                          backend):
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    return dqkv, (torch.empty_like(rpb) if rpb is not None else qkv.new_empty(0))


def _na_qkv_setup_context(ctx, inputs, output):
    qkv, rpb, kernel_size, stride, dilation, is_causal, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(qkv, rpb, out, lse)
    ctx.args = (kernel_size, stride, dilation, is_causal, scale, backend)
    ctx.set_materialize_grads(False)  # an unused LSE's gradient stays None


def _na_qkv_backward(ctx, grad_out, grad_lse):
    qkv, rpb, out, lse = ctx.saved_tensors
    if grad_out is None:  # only the LSE was used
        grad_out = torch.zeros_like(out)
    dqkv, drpb = na_qkv_backward(grad_out, grad_lse, qkv, rpb, out, lse, *ctx.args)
    return dqkv, (drpb if rpb is not None else None), None, None, None, None, None, None


na_qkv_backward = _define(
    "na_qkv_backward(Tensor grad_out, Tensor? grad_lse, Tensor qkv, Tensor? rpb, Tensor out, Tensor lse, "
    "SymInt[] kernel_size, SymInt[] stride, SymInt[] dilation, SymInt[] is_causal, float scale, str backend) "
    "-> (Tensor, Tensor)",
    _na_qkv_backward_impl, _na_qkv_backward_fake)
na_qkv_forward = _define(
    "na_qkv_forward(Tensor qkv, Tensor? rpb, SymInt[] kernel_size, SymInt[] stride, SymInt[] dilation, "
    "SymInt[] is_causal, float scale, str backend) -> (Tensor, Tensor)",
    _na_qkv_forward_impl, _na_qkv_forward_fake, _na_qkv_backward, _na_qkv_setup_context)


# ------------------------------------------------------------------------ dense
def _attention_forward_impl(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float, backend: str, dropout_p: float = 0.0,
    rng: Optional[Tensor] = None, key_offset: int = 0,
) -> Tuple[Tensor, Tensor]:
    impl = BACKENDS[deferred.resolve_dense(backend, q, k, v, is_causal, dropout_p)]
    if dropout_p:
        return impl.dense_forward(q, k, v, is_causal, scale, dropout_p, rng, key_offset)
    return impl.dense_forward(q, k, v, is_causal, scale)


def _attention_forward_fake(q, k, v, is_causal, scale, backend, dropout_p=0.0, rng=None, key_offset=0):
    return q.new_empty(*q.shape[:-1], v.shape[-1]), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q.dtype))


def _attention_backward_impl(
    grad_out: Tensor, grad_lse: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    is_causal: bool, scale: float, backend: str, dropout_p: float = 0.0, rng: Optional[Tensor] = None,
    key_offset: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    impl = BACKENDS[deferred.resolve_dense(backend, q, k, v, is_causal, dropout_p)]
    if dropout_p:
        return impl.dense_backward(q, k, v, out, lse, grad_out, grad_lse, is_causal, scale, dropout_p, rng,
                                   key_offset)
    return impl.dense_backward(q, k, v, out, lse, grad_out, grad_lse, is_causal, scale)


def _attention_backward_fake(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, backend, dropout_p=0.0,
                             rng=None, key_offset=0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _dense_setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale, backend, dropout_p, rng, key_offset = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, rng)
    ctx.args = (is_causal, scale, backend, dropout_p)
    ctx.key_offset = key_offset


def _dense_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, rng = ctx.saved_tensors
    grad_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse
    dq, dk, dv = attention_backward(grad_out, grad_lse, q, k, v, out, lse, *ctx.args, rng, ctx.key_offset)
    return dq, dk, dv, None, None, None, None, None, None


attention_backward = _define(
    "attention_backward(Tensor grad_out, Tensor grad_lse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    "bool is_causal, float scale, str backend, float dropout_p=0.0, Tensor? rng=None, SymInt key_offset=0) "
    "-> (Tensor, Tensor, Tensor)",
    _attention_backward_impl, _attention_backward_fake)
attention_forward = _define(
    "attention_forward(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, str backend, "
    "float dropout_p=0.0, Tensor? rng=None, SymInt key_offset=0) -> (Tensor, Tensor)",
    _attention_forward_impl, _attention_forward_fake, _dense_backward, _dense_setup_context)
