"""The eager fast path: NA forward/backward as a plain ``torch.autograd.Function``.

The custom ops in ``nattn.ops`` are what ``torch.compile``, fake tensors, FLOP counters and
tracers see; their Python dispatch costs several hundred microseconds per call on the host
(PERF.md: 0.37 ms forward, 1.0 ms forward+backward on the H200 machine), more than the
kernels of a DiNAT layer. Plain eager calls on plain tensors skip that layer and call the
backend directly; anything that observes the op (compilation, tracing, dispatch or
function modes, tensor subclasses) still goes through the custom op.
Both paths run the same backend methods.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

from . import _buffers
from .backends import BACKENDS
from .backends import get as get_backend
from .backends.heuristics import needs_grads
from .params import NAParams

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_NO_DOUBLE_BACKWARD = b"nattn: neighborhood attention has no double backward (second derivatives)"


def _first_order_only(grads):
    """Gradients computed without a graph. Under ``create_graph=True`` they come back behind an
    error node, as from the custom op: differentiating them again raises, instead of silently
    dropping the second-order terms through attention."""
    if not torch.is_grad_enabled() or _functorch_active():  # functorch forbids requires_grad_
        return grads
    present = [g for g in grads if g is not None]
    err = torch._C._functions.DelayedError(_NO_DOUBLE_BACKWARD, len(present))
    marked = iter(err(*[g.detach().requires_grad_() for g in present]))
    return tuple(next(marked) if g is not None else None for g in grads)


_NULL = contextlib.nullcontext()  # reusable


def _grads_off():
    """no_grad for a backward (off already unless the caller asked for create_graph)."""
    return torch.no_grad() if torch.is_grad_enabled() else _NULL


def _no_autocast(t: torch.Tensor, impl=None):
    """The backends run at their inputs' dtype, as below the custom op (which autocast never
    reaches): an enclosing autocast region must not recast the reference's matmuls. Backends
    that run no op autocast recasts (``impl.autocast_neutral``: the cuda backend) skip the
    region, ~5 us of host time per call under autocast."""
    if impl is not None and impl.autocast_neutral:
        return _NULL
    device = t.device.type
    # torch.autocast(enabled=False), not autocast_off's C++ guard: the backends behind this
    # region may ask torch whether autocast is on (dynamo does, compiling flex_attention),
    # and the guard leaves that flag set
    return torch.autocast(device, enabled=False) if autocast_on(device) else _NULL


# torch's C++ guard that excludes the autocast dispatch keys (what torch.utils.checkpoint uses)
_DISABLE_AUTOCAST = getattr(torch._C, "_DisableAutocast", None)


def autocast_off(device: str):
    """A region where autocast does not recast ops (on ``device``'s type) for regions of a
    few aten ops: torch's C++ guard eagerly (~0.5 us to enter and leave against ~3 us for
    ``torch.autocast(device, enabled=False)`` on a CPU here, paid per block norm and branch
    of a model step), the latter while compiling, where dynamo traces it. The guard excludes
    autocast's dispatch keys but leaves ``torch.is_autocast_enabled`` true: not for code
    that asks it."""
    if _DISABLE_AUTOCAST is None or torch.compiler.is_compiling():
        return torch.autocast(device, enabled=False)
    return _DISABLE_AUTOCAST()


def autocast_on(device: str) -> bool:
    """Whether autocast is on for device type ``device`` (False for device types without
    autocast, e.g. meta tensors, where torch's query would raise)."""
    return _autocast_available(device) and torch.is_autocast_enabled(device)


_AUTOCAST_AVAILABLE: dict = {}  # per device type: torch's answer does not change in a process


def _autocast_available(device: str) -> bool:
    if torch.compiler.is_compiling():
        # a constant for dynamo: torch 2.11's dynamo cannot trace torch's own query (a graph
        # break), and a cache filled while tracing is guarded on, so the first compiled call's
        # write made the second recompile the whole model
        return device in _AUTOCAST_DEVICES
    known = _AUTOCAST_AVAILABLE.get(device)
    if known is None:
        known = _AUTOCAST_AVAILABLE[device] = _ask_autocast_available(device)
    return known


def _ask_autocast_available(device: str) -> bool:
    check = getattr(torch.amp, "is_autocast_available", None)
    if check is None:
        return device in ("cpu", "cuda")
    try:
        return bool(check(device))
    except (RuntimeError, ValueError):  # a device type this torch does not know
        return False


# The device types with autocast among those torch names (asked once, at import)
_AUTOCAST_DEVICES = tuple(d for d in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "privateuseone")
                          if _ask_autocast_available(d))


def _probe(name: str):
    """A torch-internal predicate, or one that always answers "observed" if this torch lacks it
    (then every call takes the custom op: slower, never wrong)."""
    fn = getattr(torch._C, name, None)
    return fn if fn is not None else (lambda: True)


_dispatch_modes = _probe("_len_torch_dispatch_stack")        # FlopCounterMode, FakeTensorMode, ...
_function_modes = _probe("_is_torch_function_mode_enabled")  # TorchFunctionMode
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def eager_ok(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a call may bypass the custom op: nothing is watching it. functorch transforms
    take this path too: the custom op's autograd cannot run under ``torch.func.grad``, the
    Function below can (vmap has no rule on either path)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if _dispatch_modes() or _function_modes():
        return False
    return all(t is None or type(t) in _PLAIN for t in tensors)


def records_graph(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether an eager call must go through an autograd Function: grad mode is on and an
    input requires grad, or a functorch transform is active (its wrappers hide that)."""
    return _functorch_active() or needs_grads(*tensors)


def na_forward_only(impl, q, k, v, rpb, params: NAParams):
    """The backend's NA forward at the inputs' dtype: the autograd Functions' forward, and
    the whole of an eager call that records no graph (skipping the Function's apply and
    context saves ~11 us of host time per call on the H200 machine)."""
    with _no_autocast(q, impl):
        return impl.na_forward(q, k, v, rpb, params)


def na_forward_packed_only(impl, qkv, rpb, params: NAParams):
    """``na_forward_only`` on the q / k / v views of a packed ``qkv`` ``[B, *spatial, 3, H,
    D]``: the backend's packed call where it has one (the cuda backend's builds no views),
    else its call on the views."""
    fast = getattr(impl, "na_forward_packed", None)
    if fast is None:
        q, k, v = qkv.unbind(-3)
        return na_forward_only(impl, q, k, v, rpb, params)
    with _no_autocast(qkv, impl):
        return fast(qkv, rpb, params)


def dense_forward_only(name: str, q, k, v, is_causal: bool, scale: float):
    """The same for a dense call (NA's extra keys)."""
    with _no_autocast(q):
        return BACKENDS[name].dense_forward(q, k, v, is_causal, scale)


class NAFunction(torch.autograd.Function):
    """``(out, lse)`` of one NA call through a named backend, with that backend's backward.
    Forward and ``setup_context`` are separate, so ``torch.func.grad`` works too."""

    @staticmethod
    def forward(q, k, v, rpb, params: NAParams, backend: str):
        return na_forward_only(get_backend(backend), q, k, v, rpb, params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, rpb, params, backend = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, rpb, out, lse)
        ctx.params, ctx.backend = params, backend
        ctx.set_materialize_grads(False)  # an unused LSE gradient stays None (no zeros kernel)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return (*na_backward_saved(ctx, grad_out, grad_lse), None, None)


def na_backward_saved(ctx, grad_out, grad_lse, **backend_kwargs):
    """``(dq, dk, dv, drpb)`` from a Function's saved ``(q, k, v, rpb, out, lse)``, ``params``
    and ``backend`` (NAFunction's; nattn.distributed's ranged NA passes its query range)."""
    q, k, v, rpb, out, lse = ctx.saved_tensors
    impl = get_backend(ctx.backend)
    with _grads_off(), _no_autocast(q, impl):
        if grad_out is None:  # only the LSE was used
            grad_out = torch.zeros_like(out)
        dq, dk, dv, drpb = impl.na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, ctx.params, **backend_kwargs)
    return _first_order_only((dq, dk, dv, drpb if rpb is not None else None))


class NAFunctionFast(torch.autograd.Function):
    """NAFunction without ``setup_context``: the same forward and backward, about 20 us less
    host time per call (torch binds a setup_context Function's arguments with
    ``inspect.signature`` on every apply). Used unless a functorch transform is active."""

    @staticmethod
    def forward(ctx, q, k, v, rpb, params: NAParams, backend: str):
        out, lse = na_forward_only(get_backend(backend), q, k, v, rpb, params)
        ctx.save_for_backward(q, k, v, rpb, out, lse)
        ctx.params, ctx.backend = params, backend
        ctx.set_materialize_grads(False)
        return out, lse

    backward = NAFunction.backward


class NAPackedFunction(torch.autograd.Function):
    """NAFunctionFast over q, k and v packed in one tensor ``qkv`` ``[B, *spatial, 3, H, D]``
    (a qkv projection's output, the modules' layout), for backends that write gradients into
    given tensors (``writes_grads_into``): the backward fills one ``d(qkv)`` through its three
    views. Through ``qkv.unbind`` instead, autograd would stack dq, dk and dv into it: one
    more read and write of the whole gradient, three allocations and a node per call."""

    @staticmethod
    def forward(ctx, qkv, rpb, params: NAParams, backend: str):
        out, lse = na_forward_packed_only(get_backend(backend), qkv, rpb, params)
        ctx.save_for_backward(qkv, rpb, out, lse)
        ctx.params, ctx.backend = params, backend
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        qkv, rpb, out, lse = ctx.saved_tensors
        impl = get_backend(ctx.backend)
        with _grads_off(), _no_autocast(qkv, impl):
            if grad_out is None:  # only the LSE was used
                grad_out = torch.zeros_like(out)
            dqkv, drpb = na_backward_packed(impl, qkv, rpb, out, lse, grad_out, grad_lse, ctx.params)
        dqkv, drpb = _first_order_only((dqkv, drpb if rpb is not None else None))
        return dqkv, drpb, None, None


def na_backward_packed(impl, qkv, rpb, out, lse, grad_out, grad_lse, params: NAParams):
    """``(d(qkv), drpb)`` of NA over ``qkv``'s q / k / v views (``[B, *spatial, 3, H, D]``):
    NAPackedFunction's and the packed op's backward. The backend's packed call where it has
    one (the cuda backend's builds no views); else written through d(qkv)'s views by backends
    that take given gradient tensors (``writes_grads_into``), or stacked into it."""
    fast = getattr(impl, "na_backward_packed", None)
    if fast is not None:
        return fast(qkv, rpb, out, lse, grad_out, grad_lse, params)
    q, k, v = qkv.unbind(-3)
    dqkv = _buffers.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    if impl.writes_grads_into:
        *_, drpb = impl.na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params, grads_into=dqkv.unbind(-3))
    else:
        dq, dk, dv, drpb = impl.na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params)
        torch.stack((dq, dk, dv), dim=-3, out=dqkv)
    return dqkv, drpb


def na_function():
    """The autograd Function an eager NA call goes through."""
    return NAFunction if _functorch_active() else NAFunctionFast


class DenseFunction(torch.autograd.Function):
    """``(out, lse)`` of dense attention through a named backend (the extra keys of NA)."""

    @staticmethod
    def forward(q, k, v, is_causal: bool, scale: float, backend: str):
        return dense_forward_only(backend, q, k, v, is_causal, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, is_causal, scale, backend = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (is_causal, scale, backend)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, scale, backend = ctx.args
        with torch.no_grad(), _no_autocast(q):
            if grad_out is None:
                grad_out = torch.zeros_like(out)
            dq, dk, dv = BACKENDS[backend].dense_backward(q, k, v, out, lse, grad_out, grad_lse, is_causal, scale)
        dq, dk, dv = _first_order_only((dq, dk, dv))
        return dq, dk, dv, None, None, None


class DenseFunctionFast(torch.autograd.Function):
    """DenseFunction without ``setup_context`` (see NAFunctionFast)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool, scale: float, backend: str):
        out, lse = dense_forward_only(backend, q, k, v, is_causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (is_causal, scale, backend)
        ctx.set_materialize_grads(False)
        return out, lse

    backward = DenseFunction.backward


def dense_function():
    """The autograd Function an eager dense call (NA's extra keys) goes through."""
    return DenseFunction if _functorch_active() else DenseFunctionFast


# ------------------------------------------------------------------ attention dropout
# Calls with dropout_p > 0 take these instead (calls without dropout never reach them): the
# call's rng tensor ([seed, offset], nattn/dropout.py) goes to the backend's forward and is
# saved for its backward, which rebuilds the same mask from it.
def na_dropout_forward_only(impl, q, k, v, rpb, rng, params: NAParams):
    """na_forward_only for a call with attention dropout (``params.dropout_p > 0``)."""
    with _no_autocast(q, impl):
        return impl.na_forward(q, k, v, rpb, params, rng=rng)


class NADropoutFunction(torch.autograd.Function):
    """NAFunction for a call with attention dropout: ``rng`` reaches the backend's forward and
    backward (one class with ``setup_context``, so ``torch.func.grad`` works too)."""

    @staticmethod
    def forward(q, k, v, rpb, rng, params: NAParams, backend: str):
        return na_dropout_forward_only(get_backend(backend), q, k, v, rpb, rng, params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, rpb, rng, params, backend = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, rpb, rng, out, lse)
        ctx.params, ctx.backend = params, backend
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, rpb, rng, out, lse = ctx.saved_tensors
        impl = get_backend(ctx.backend)
        with _grads_off(), _no_autocast(q, impl):
            if grad_out is None:  # only the LSE was used
                grad_out = torch.zeros_like(out)
            dq, dk, dv, drpb = impl.na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, ctx.params, rng=rng)
        dq, dk, dv, drpb = _first_order_only((dq, dk, dv, drpb if rpb is not None else None))
        return dq, dk, dv, drpb, None, None, None


def dense_dropout_forward_only(name: str, q, k, v, is_causal: bool, scale: float, dropout_p: float, rng,
                               key_offset: int):
    """dense_forward_only with attention dropout (keys numbered from ``key_offset``)."""
    with _no_autocast(q):
        return BACKENDS[name].dense_forward(q, k, v, is_causal, scale, dropout_p, rng, key_offset)


class DenseDropoutFunction(torch.autograd.Function):
    """DenseFunction with attention dropout (the extra keys of an NA call with dropout)."""

    @staticmethod
    def forward(q, k, v, rng, is_causal: bool, scale: float, backend: str, dropout_p: float, key_offset: int):
        return dense_dropout_forward_only(backend, q, k, v, is_causal, scale, dropout_p, rng, key_offset)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, rng, is_causal, scale, backend, dropout_p, key_offset = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, rng, out, lse)
        ctx.args = (is_causal, scale, backend, dropout_p, key_offset)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, rng, out, lse = ctx.saved_tensors
        is_causal, scale, backend, dropout_p, key_offset = ctx.args
        with torch.no_grad(), _no_autocast(q):
            if grad_out is None:
                grad_out = torch.zeros_like(out)
            dq, dk, dv = BACKENDS[backend].dense_backward(
                q, k, v, out, lse, grad_out, grad_lse, is_causal, scale, dropout_p, rng, key_offset)
        dq, dk, dv = _first_order_only((dq, dk, dv))
        return dq, dk, dv, None, None, None, None, None, None
