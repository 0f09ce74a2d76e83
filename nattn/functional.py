"""Public functional API: ``na1d``/``na2d``/``na3d``, dense ``attention``, ``merge_attentions``.

Function and argument names follow NATTEN's functional API; docs/porting-from-natten.md
lists what differs. Layout is heads-last: ``[B, *spatial, H, D]``.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from . import _call_cache, ops
from .backends import autotune, choose_dense_backend, choose_na_backend, deferred
from .backends import get as get_backend
from ._eager import (DenseDropoutFunction, NADropoutFunction, NAPackedFunction, _functorch_active,
                     dense_dropout_forward_only, dense_forward_only, dense_function, eager_ok,
                     na_dropout_forward_only, na_forward_only, na_forward_packed_only, na_function,
                     records_graph)
from .dropout import draw_rng
from .merge import merge_attentions
from .params import BoolOrTuple, IntOrTuple, check_dropout_p, check_qkv, check_scale, normalize

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
    tune: Optional[bool] = None,
    deterministic: Optional[bool] = None,
    dropout_p: float = 0.0,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Neighborhood attention over ``na_dim`` (1, 2 or 3) spatial axes.

    ``neighborhood_attention(q, k, v, ..., na_dim=2)`` is ``na2d(q, k, v, ...)``; the
    arguments, results and errors are those of [na1d][nattn.functional.na1d],
    [na2d][nattn.functional.na2d] and [na3d][nattn.functional.na3d], with ``query``
    ``[B, *spatial, H, D]`` of ``na_dim`` spatial axes.

    Args:
        na_dim: the number of spatial axes (keyword-only).
        tune: as in na1d/na2d/na3d (keyword-only).
        deterministic: as in na1d/na2d/na3d (keyword-only).
        dropout_p: as in na1d/na2d/na3d (keyword-only).
    """
    if dropout_p.__class__ is not float or dropout_p != 0.0:  # the default costs one test
        dropout_p = check_dropout_p(dropout_p)
    if torch.compiler.is_compiling():  # the op chooses when it runs (backends/deferred.py)
        params = normalize(
            query, key, value, na_dim, kernel_size, stride, dilation, is_causal, scale,
            rpb, additional_keys, additional_values, dropout_p,
        )
        grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, rpb))
        name = deferred.spec(backend, tune, deterministic, grads)
        impl = None
    else:
        params, name = _checked_and_chosen(
            query, key, value, na_dim, kernel_size, stride, dilation, is_causal, scale,
            rpb, additional_keys, additional_values, backend, tune, deterministic, dropout_p)
        impl = get_backend(name)
    # Attention dropout: one [seed, offset] draw from the default generator of the inputs'
    # device (nattn/dropout.py) feeds the NA part and, for keys numbered from N (the spatial
    # tokens) on, the extra keys; only backends with supports_dropout run it (the choice
    # above; docs/semantics.md, "Attention dropout").
    rng = draw_rng(query.device) if dropout_p else None
    if impl is not None and impl.composite and rng is None:  # differentiable as it is
        out, lse = impl.na_composite(query, key, value, rpb, params)
    elif impl is not None and eager_ok(query, key, value, rpb):  # no custom-op dispatch cost (nattn/_eager.py)
        if records_graph(query, key, value, rpb):
            if rng is None:
                out, lse = na_function().apply(query, key, value, rpb, params, name)
            else:
                out, lse = NADropoutFunction.apply(query, key, value, rpb, rng, params, name)
        elif rng is None:  # inference: no autograd Function either
            out, lse = na_forward_only(impl, query, key, value, rpb, params)
        else:
            out, lse = na_dropout_forward_only(impl, query, key, value, rpb, rng, params)
    else:
        out, lse = ops.na_forward(
            query, key, value, rpb, list(params.kernel_size), list(params.stride),
            list(params.dilation), list(params.is_causal), params.scale, name,
            *(() if rng is None else (params.dropout_p, rng)),
        )
    if additional_keys is not None:
        b, heads = query.shape[0], query.shape[-2]
        q_flat = query.reshape(b, -1, heads, query.shape[-1])
        # The extra keys go to the fastest dense backend, whichever NA backend was named; with
        # dropout, extra key j is key N + j of the call's mask (N spatial tokens).
        extra_out, extra_lse = _dense(q_flat, additional_keys, additional_values, False, params.scale, None,
                                      dropout_p, rng, q_flat.shape[1])
        out, lse = merge_attentions(
            [out, extra_out.reshape(out.shape)], [lse, extra_lse.reshape(lse.shape)]
        )
    return (out, lse) if return_lse else out


def na_packed_qkv(qkv, kernel_size, stride, dilation, is_causal, scale, rpb, backend, tune, deterministic,
                  *, na_dim: int) -> Optional[torch.Tensor]:
    """The modules' call over a packed ``qkv`` ``[B, *spatial, 3, H, D]``, whose backward
    writes one ``d(qkv)``: compiled, the ``nattn::na_qkv_forward`` op; eagerly, when the
    chosen backend writes gradients into given tensors and nothing observes the call (as for
    the eager fast path), NAPackedFunction, and without a gradient to record the backend's
    forward on ``qkv`` (the cuda backend builds no views); else None, and the caller takes
    ``neighborhood_attention`` over ``qkv.unbind(-3)``. No dropout, no extra keys. The eager
    choice is remembered per ``qkv`` signature: a hit unbinds nothing."""
    # functorch transforms (torch.func.grad, ...) need a Function with setup_context: the
    # q/k/v path has one (NAFunction)
    if torch.compiler.is_compiling():  # the packed op: its backward returns d(qkv) whole
        q, k, v = qkv.unbind(-3)
        params = normalize(q, k, v, na_dim, kernel_size, stride, dilation, is_causal, scale, rpb)
        grads = torch.is_grad_enabled() and (qkv.requires_grad or (rpb is not None and rpb.requires_grad))
        name = deferred.spec(backend, tune, deterministic, grads)
        return ops.na_qkv_forward(qkv, rpb, list(params.kernel_size), list(params.stride), list(params.dilation),
                                  list(params.is_causal), params.scale, name)[0]
    if _functorch_active() or not eager_ok(qkv, rpb):
        return None
    sig = None
    if not autotune.active(qkv, tune):
        sig = _call_cache.key((qkv, rpb), ("packed", na_dim, kernel_size, stride, dilation, is_causal, scale,
                                           backend, tune, deterministic))
    hit = _call_cache.get(sig)
    if hit is None:
        q, k, v = qkv.unbind(-3)
        hit = _checked_and_chosen(q, k, v, na_dim, kernel_size, stride, dilation, is_causal, scale, rpb,
                                  None, None, backend, tune, deterministic)
        _call_cache.put(sig, hit)
    params, name = hit
    impl = get_backend(name)
    if impl.composite:
        return None
    if not records_graph(qkv, rpb):  # inference: the backend's forward on qkv as it is
        return na_forward_packed_only(impl, qkv, rpb, params)[0]
    if not impl.writes_grads_into:
        return None
    return NAPackedFunction.apply(qkv, rpb, params, name)[0]


def _checked_and_chosen(query, key, value, na_dim, kernel_size, stride, dilation, is_causal, scale,
                        rpb, additional_keys, additional_values, backend, tune, deterministic, dropout_p=0.0):
    """``(params, backend name)`` of an eager call: checked and chosen once per signature
    (nattn/_call_cache.py), except while tuning (the tuner keeps its own cache)."""
    sig = None
    if not autotune.active(query, tune):
        args = (na_dim, kernel_size, stride, dilation, is_causal, scale, backend, tune, deterministic)
        if dropout_p:
            args += (dropout_p,)
        sig = _call_cache.key((query, key, value, rpb, additional_keys, additional_values), args)
        hit = _call_cache.get(sig)
        if hit is not None:
            return hit
    params = normalize(
        query, key, value, na_dim, kernel_size, stride, dilation, is_causal, scale,
        rpb, additional_keys, additional_values, dropout_p,
    )
    name = choose_na_backend(query, key, value, rpb, params, backend, tune, deterministic)
    _call_cache.put(sig, (params, name))
    return params, name


def na1d(
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
    tune: Optional[bool] = None,
    deterministic: Optional[bool] = None,
    dropout_p: float = 0.0,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """1-D neighborhood attention: each query attends to a window of keys around it.

    Every query at ``[b, X, h]`` attends to the keys of its neighborhood (a window of
    ``kernel_size`` keys per axis, see docs/semantics.md) and, if given, to every one of
    ``additional_keys``. Differentiable in ``query``, ``key``, ``value``, ``rpb`` and the
    additional keys/values (first derivatives only).

    Args:
        query: ``[B, X, H, D]``; float32, float16, bfloat16 or float64.
        key: ``[B, X, H_kv, D]``, same dtype and device as ``query``; ``H`` must be a
            multiple of ``H_kv`` (GQA/MQA: query head ``h`` uses key head ``h // (H // H_kv)``).
        value: ``[B, X, H_kv, D_v]``; ``D_v`` may differ from ``D``.
        kernel_size: window size, an int for every axis or a 1-tuple of ints; each ``>= 2``
            (even sizes allowed) and ``kernel_size * dilation <= `` the input size on that axis.
        stride: per axis, ``1 <= stride <= kernel_size``: blocks of ``stride`` queries share
            one window.
        dilation: per axis, ``>= 1``: the window takes every ``dilation``-th key.
        is_causal: a bool for every axis or a 1-tuple of bools; a causal axis keeps only keys
            at or before the query on that axis.
        scale: factor applied to ``q . k`` before the softmax. Default ``D ** -0.5``.
        additional_keys: ``[B, N_extra, H_kv, D]`` or None: keys attended by every query
            besides its neighborhood (one softmax over both, merged through the logsumexp).
            Give together with ``additional_values``.
        additional_values: ``[B, N_extra, H_kv, D_v]`` or None.
        rpb: relative positional bias ``[H, 2*k_X-1]`` or None: the logit of a key at
            offset ``o`` from its query (in dilated steps) gets ``rpb[h, o_X + k_X - 1]``.
            Needs odd kernel sizes, stride 1 and no causal axis.
        backend: None or ``"auto"`` picks the fastest backend that can run the call
            (docs/backends.md); ``"cuda"``, ``"flex"`` or ``"reference"`` forces one.
        return_lse: also return the logsumexp of the logits.
        tune: keyword-only. True times every backend and kernel configuration that can run
            the call the first time its problem signature is seen and runs the fastest from
            then on (measured dispatch, docs/backends.md); False never tunes it; None (the
            default) follows ``with nattn.autotune():`` or ``NATTN_AUTOTUNE``.
        deterministic: keyword-only. True pins a bitwise-reproducible backward (the Hopper
            kernels' own dQ pass rather than dQ accumulated with atomics, whatever tuning or
            NATTN_SM90_DQ say); None (the default) follows
            ``torch.use_deterministic_algorithms``; False lets tuning choose.
        dropout_p: keyword-only. Attention dropout, a float in ``[0, 1)``: each attention
            weight (neighborhood and extra keys) is dropped with probability ``dropout_p``
            where it multiplies the values, the kept ones scaled by ``1 / (1 - dropout_p)``;
            the softmax normaliser and the returned LSE are those without dropout. Applied
            whenever it is > 0 (as ``F.scaled_dot_product_attention`` does: pass 0 in eval).
            The mask comes from Philox keyed by a seed and an offset drawn from the default
            generator of the inputs' device, so ``torch.manual_seed`` reproduces it, forward
            and backward (docs/semantics.md, "Attention dropout"). Only backends with dropout
            run it: ``"reference"`` and ``"cuda"`` (libnattn's tensor-core and SIMT families;
            not the Hopper family, so such calls run the tensor-core kernels on an H100/H200
            too); ``"flex"`` declines it. 0 (the default) changes nothing and draws nothing.

    Returns:
        ``out`` ``[B, X, H, D_v]`` in the dtype of ``query``; with ``return_lse=True`` the
            tuple ``(out, lse)``, ``lse`` ``[B, X, H]`` in float32 (float64 for float64
            inputs), natural log.

    Raises:
        TypeError: an argument of the wrong type (a non-tensor, a dtype other than those
            above, mixed dtypes, a non-int ``kernel_size``/``stride``/``dilation``, a
            non-bool ``is_causal``, a ``dropout_p`` that is not a real number).
        ValueError: shapes that do not match the layout above, tensors on different
            devices, a tuple of the wrong length, a value outside the ranges above (``dropout_p``
            outside ``[0, 1)`` included), or an unknown ``backend`` name; the message names
            the argument (and the axis).
        nattn.backends.NoBackendError: (a ``ValueError``) no backend, or not the one named
            in ``backend``, can run the call (a backend without dropout for ``dropout_p > 0``);
            the message gives each backend's reasons.

    Example:
        ```python
        q = k = v = torch.randn(2, 128, 4, 32)
        out = nattn.na1d(q, k, v, kernel_size=7)
        ```
    """
    return neighborhood_attention(
        query, key, value, kernel_size, stride, dilation, is_causal, scale,
        additional_keys, additional_values, rpb, backend, return_lse, na_dim=1, tune=tune,
        deterministic=deterministic, dropout_p=dropout_p,
    )


def na2d(
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
    tune: Optional[bool] = None,
    deterministic: Optional[bool] = None,
    dropout_p: float = 0.0,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """2-D neighborhood attention: each query attends to a window of keys around it.

    Every query at ``[b, X, Y, h]`` attends to the keys of its neighborhood (a window of
    ``kernel_size`` keys per axis, see docs/semantics.md) and, if given, to every one of
    ``additional_keys``. Differentiable in ``query``, ``key``, ``value``, ``rpb`` and the
    additional keys/values (first derivatives only).

    Args:
        query: ``[B, X, Y, H, D]``; float32, float16, bfloat16 or float64.
        key: ``[B, X, Y, H_kv, D]``, same dtype and device as ``query``; ``H`` must be a
            multiple of ``H_kv`` (GQA/MQA: query head ``h`` uses key head ``h // (H // H_kv)``).
        value: ``[B, X, Y, H_kv, D_v]``; ``D_v`` may differ from ``D``.
        kernel_size: window size, an int for every axis or a 2-tuple of ints; each ``>= 2``
            (even sizes allowed) and ``kernel_size * dilation <= `` the input size on that axis.
        stride: per axis, ``1 <= stride <= kernel_size``: blocks of ``stride`` queries share
            one window.
        dilation: per axis, ``>= 1``: the window takes every ``dilation``-th key.
        is_causal: a bool for every axis or a 2-tuple of bools; a causal axis keeps only keys
            at or before the query on that axis.
        scale: factor applied to ``q . k`` before the softmax. Default ``D ** -0.5``.
        additional_keys: ``[B, N_extra, H_kv, D]`` or None: keys attended by every query
            besides its neighborhood (one softmax over both, merged through the logsumexp).
            Give together with ``additional_values``.
        additional_values: ``[B, N_extra, H_kv, D_v]`` or None.
        rpb: relative positional bias ``[H, 2*k_X-1, 2*k_Y-1]`` or None: the logit of a key at
            offset ``o`` from its query (in dilated steps) gets
            ``rpb[h, o_X + k_X - 1, o_Y + k_Y - 1]``.
            Needs odd kernel sizes, stride 1 and no causal axis.
        backend: None or ``"auto"`` picks the fastest backend that can run the call
            (docs/backends.md); ``"cuda"``, ``"flex"`` or ``"reference"`` forces one.
        return_lse: also return the logsumexp of the logits.
        tune: keyword-only. True times every backend and kernel configuration that can run
            the call the first time its problem signature is seen and runs the fastest from
            then on (measured dispatch, docs/backends.md); False never tunes it; None (the
            default) follows ``with nattn.autotune():`` or ``NATTN_AUTOTUNE``.
        deterministic: keyword-only. True pins a bitwise-reproducible backward (the Hopper
            kernels' own dQ pass rather than dQ accumulated with atomics, whatever tuning or
            NATTN_SM90_DQ say); None (the default) follows
            ``torch.use_deterministic_algorithms``; False lets tuning choose.
        dropout_p: keyword-only. Attention dropout, a float in ``[0, 1)``: each attention
            weight (neighborhood and extra keys) is dropped with probability ``dropout_p``
            where it multiplies the values, the kept ones scaled by ``1 / (1 - dropout_p)``;
            the softmax normaliser and the returned LSE are those without dropout. Applied
            whenever it is > 0 (as ``F.scaled_dot_product_attention`` does: pass 0 in eval).
            The mask comes from Philox keyed by a seed and an offset drawn from the default
            generator of the inputs' device, so ``torch.manual_seed`` reproduces it, forward
            and backward (docs/semantics.md, "Attention dropout"). Only backends with dropout
            run it: ``"reference"`` and ``"cuda"`` (libnattn's tensor-core and SIMT families;
            not the Hopper family, so such calls run the tensor-core kernels on an H100/H200
            too); ``"flex"`` declines it. 0 (the default) changes nothing and draws nothing.

    Returns:
        ``out`` ``[B, X, Y, H, D_v]`` in the dtype of ``query``; with ``return_lse=True`` the
            tuple ``(out, lse)``, ``lse`` ``[B, X, Y, H]`` in float32 (float64 for float64
            inputs), natural log.

    Raises:
        TypeError: an argument of the wrong type (a non-tensor, a dtype other than those
            above, mixed dtypes, a non-int ``kernel_size``/``stride``/``dilation``, a
            non-bool ``is_causal``, a ``dropout_p`` that is not a real number).
        ValueError: shapes that do not match the layout above, tensors on different
            devices, a tuple of the wrong length, a value outside the ranges above (``dropout_p``
            outside ``[0, 1)`` included), or an unknown ``backend`` name; the message names
            the argument (and the axis).
        nattn.backends.NoBackendError: (a ``ValueError``) no backend, or not the one named
            in ``backend``, can run the call (a backend without dropout for ``dropout_p > 0``);
            the message gives each backend's reasons.

    Example:
        ```python
        q = k = v = torch.randn(2, 32, 32, 4, 32)
        out = nattn.na2d(q, k, v, kernel_size=7, dilation=2)
        ```
    """
    return neighborhood_attention(
        query, key, value, kernel_size, stride, dilation, is_causal, scale,
        additional_keys, additional_values, rpb, backend, return_lse, na_dim=2, tune=tune,
        deterministic=deterministic, dropout_p=dropout_p,
    )


def na3d(
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
    tune: Optional[bool] = None,
    deterministic: Optional[bool] = None,
    dropout_p: float = 0.0,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """3-D neighborhood attention: each query attends to a window of keys around it.

    Every query at ``[b, X, Y, Z, h]`` attends to the keys of its neighborhood (a window of
    ``kernel_size`` keys per axis, see docs/semantics.md) and, if given, to every one of
    ``additional_keys``. Differentiable in ``query``, ``key``, ``value``, ``rpb`` and the
    additional keys/values (first derivatives only).

    Args:
        query: ``[B, X, Y, Z, H, D]``; float32, float16, bfloat16 or float64.
        key: ``[B, X, Y, Z, H_kv, D]``, same dtype and device as ``query``; ``H`` must be a
            multiple of ``H_kv`` (GQA/MQA: query head ``h`` uses key head ``h // (H // H_kv)``).
        value: ``[B, X, Y, Z, H_kv, D_v]``; ``D_v`` may differ from ``D``.
        kernel_size: window size, an int for every axis or a 3-tuple of ints; each ``>= 2``
            (even sizes allowed) and ``kernel_size * dilation <= `` the input size on that axis.
        stride: per axis, ``1 <= stride <= kernel_size``: blocks of ``stride`` queries share
            one window.
        dilation: per axis, ``>= 1``: the window takes every ``dilation``-th key.
        is_causal: a bool for every axis or a 3-tuple of bools; a causal axis keeps only keys
            at or before the query on that axis.
        scale: factor applied to ``q . k`` before the softmax. Default ``D ** -0.5``.
        additional_keys: ``[B, N_extra, H_kv, D]`` or None: keys attended by every query
            besides its neighborhood (one softmax over both, merged through the logsumexp).
            Give together with ``additional_values``.
        additional_values: ``[B, N_extra, H_kv, D_v]`` or None.
        rpb: relative positional bias ``[H, 2*k_X-1, 2*k_Y-1, 2*k_Z-1]`` or None: the logit
            of a key at offset ``o`` from its query (in dilated steps) gets
            ``rpb[h, o_X + k_X - 1, o_Y + k_Y - 1, o_Z + k_Z - 1]``.
            Needs odd kernel sizes, stride 1 and no causal axis.
        backend: None or ``"auto"`` picks the fastest backend that can run the call
            (docs/backends.md); ``"cuda"``, ``"flex"`` or ``"reference"`` forces one.
        return_lse: also return the logsumexp of the logits.
        tune: keyword-only. True times every backend and kernel configuration that can run
            the call the first time its problem signature is seen and runs the fastest from
            then on (measured dispatch, docs/backends.md); False never tunes it; None (the
            default) follows ``with nattn.autotune():`` or ``NATTN_AUTOTUNE``.
        deterministic: keyword-only. True pins a bitwise-reproducible backward (the Hopper
            kernels' own dQ pass rather than dQ accumulated with atomics, whatever tuning or
            NATTN_SM90_DQ say); None (the default) follows
            ``torch.use_deterministic_algorithms``; False lets tuning choose.
        dropout_p: keyword-only. Attention dropout, a float in ``[0, 1)``: each attention
            weight (neighborhood and extra keys) is dropped with probability ``dropout_p``
            where it multiplies the values, the kept ones scaled by ``1 / (1 - dropout_p)``;
            the softmax normaliser and the returned LSE are those without dropout. Applied
            whenever it is > 0 (as ``F.scaled_dot_product_attention`` does: pass 0 in eval).
            The mask comes from Philox keyed by a seed and an offset drawn from the default
            generator of the inputs' device, so ``torch.manual_seed`` reproduces it, forward
            and backward (docs/semantics.md, "Attention dropout"). Only backends with dropout
            run it: ``"reference"`` and ``"cuda"`` (libnattn's tensor-core and SIMT families;
            not the Hopper family, so such calls run the tensor-core kernels on an H100/H200
            too); ``"flex"`` declines it. 0 (the default) changes nothing and draws nothing.

    Returns:
        ``out`` ``[B, X, Y, Z, H, D_v]`` in the dtype of ``query``; with ``return_lse=True`` the
            tuple ``(out, lse)``, ``lse`` ``[B, X, Y, Z, H]`` in float32 (float64 for float64
            inputs), natural log.

    Raises:
        TypeError: an argument of the wrong type (a non-tensor, a dtype other than those
            above, mixed dtypes, a non-int ``kernel_size``/``stride``/``dilation``, a
            non-bool ``is_causal``, a ``dropout_p`` that is not a real number).
        ValueError: shapes that do not match the layout above, tensors on different
            devices, a tuple of the wrong length, a value outside the ranges above (``dropout_p``
            outside ``[0, 1)`` included), or an unknown ``backend`` name; the message names
            the argument (and the axis).
        nattn.backends.NoBackendError: (a ``ValueError``) no backend, or not the one named
            in ``backend``, can run the call (a backend without dropout for ``dropout_p > 0``);
            the message gives each backend's reasons.

    Example:
        ```python
        q = k = v = torch.randn(2, 8, 16, 16, 4, 32)
        out = nattn.na3d(q, k, v, kernel_size=(3, 7, 7))
        ```
    """
    return neighborhood_attention(
        query, key, value, kernel_size, stride, dilation, is_causal, scale,
        additional_keys, additional_values, rpb, backend, return_lse, na_dim=3, tune=tune,
        deterministic=deterministic, dropout_p=dropout_p,
    )


def _dense(q, k, v, is_causal, scale, backend, dropout_p=0.0, rng=None, key_offset=0):
    """Dense attention through the chosen backend; with dropout (``rng`` given) its keys are
    numbered from ``key_offset`` in the call's mask."""
    drop = () if rng is None else (dropout_p, rng, key_offset)
    if torch.compiler.is_compiling():  # the op chooses when it runs (backends/deferred.py)
        return ops.attention_forward(q, k, v, is_causal, scale, deferred.spec(backend, None, None, None), *drop)
    name = choose_dense_backend(q, k, v, is_causal, backend, dropout_p)
    if eager_ok(q, k, v, rng):
        if rng is None:
            if not records_graph(q, k, v):
                return dense_forward_only(name, q, k, v, is_causal, scale)
            return dense_function().apply(q, k, v, is_causal, scale, name)
        if not records_graph(q, k, v):
            return dense_dropout_forward_only(name, q, k, v, is_causal, scale, dropout_p, rng, key_offset)
        return DenseDropoutFunction.apply(q, k, v, rng, is_causal, scale, name, dropout_p, key_offset)
    return ops.attention_forward(q, k, v, is_causal, scale, name, *drop)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    is_causal: bool = False,
    scale: Optional[float] = None,
    return_lse: bool = False,
    backend: Optional[str] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Dense (full) attention in the heads-last layout, with the logsumexp on request.

    Every query attends to every key. This is the operation that ``additional_keys`` of
    [na2d][nattn.functional.na2d] runs; its ``(out, lse)`` pairs merge exactly with
    [merge_attentions][nattn.merge.merge_attentions].

    Args:
        query: ``[B, N, H, D]``; float32, float16, bfloat16 or float64.
        key: ``[B, N_kv, H_kv, D]``, same dtype and device as ``query``; ``H`` must be a
            multiple of ``H_kv`` (GQA/MQA).
        value: ``[B, N_kv, H_kv, D_v]``.
        is_causal: query ``i`` attends only to keys ``j <= i`` (top-left aligned); needs
            ``N == N_kv``.
        scale: factor applied to ``q . k`` before the softmax. Default ``D ** -0.5``.
        return_lse: also return the logsumexp of the logits.
        backend: None or ``"auto"`` picks the fastest backend that implements dense
            attention, a name forces one. Today only ``"reference"`` does (plain PyTorch,
            in chunks of queries: memory is bounded by the chunk, not by ``N x N_kv``).

    Returns:
        ``out`` ``[B, N, H, D_v]`` in the dtype of ``query``; with ``return_lse=True`` the
            tuple ``(out, lse)``, ``lse`` ``[B, N, H]`` in float32 (float64 for float64 inputs).

    Raises:
        TypeError: a non-tensor, an unsupported or mixed dtype, a non-bool ``is_causal``.
        ValueError: shapes that do not match the layout above, a batch mismatch,
            ``is_causal=True`` with ``N != N_kv``, or an unknown ``backend`` name.
        nattn.backends.NoBackendError: (a ``ValueError``) the backend named in ``backend``
            does not implement dense attention.
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

