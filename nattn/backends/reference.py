"""The reference backend: plain PyTorch, any device, the oracle for every other backend.

Meta tensors (a module moved with ``.to("meta")``) carry shapes only: they get empty
results of the right shapes and dtypes, as the custom ops' fake implementations give,
instead of a walk over every chunk.
"""

from __future__ import annotations

from . import reference_dense, reference_math
from .base import Backend


def _is_meta(t) -> bool:
    return t.device.type == "meta"


def _empty_forward(q, v):
    lse = q.new_empty(q.shape[:-1], dtype=reference_math.lse_dtype(q.dtype))
    return q.new_empty(*q.shape[:-1], v.shape[-1]), lse


class ReferenceBackend(Backend):
    name = "reference"
    supports_dropout = True  # the oracle of attention dropout (nattn/dropout.py's mask)

    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        return []  # supports every problem that passed argument validation

    def na_forward(self, q, k, v, rpb, params, rng=None):
        if _is_meta(q):
            return _empty_forward(q, v)
        return reference_math.forward(q, k, v, rpb, params, rng)

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params, rng=None):
        if _is_meta(q):
            return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), (
                rpb.new_empty(rpb.shape) if rpb is not None else None)
        return reference_math.backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params, rng)

    def dense_not_supported_reasons(self, q, k, v, is_causal, explicit):
        return []

    def dense_forward(self, q, k, v, is_causal, scale, dropout_p=0.0, rng=None, key_offset=0):
        if _is_meta(q):
            return _empty_forward(q, v)
        return reference_dense.forward(q, k, v, is_causal, scale, dropout_p, rng, key_offset)

    def dense_backward(self, q, k, v, out, lse, grad_out, grad_lse, is_causal, scale, dropout_p=0.0, rng=None,
                       key_offset=0):
        if _is_meta(q):
            return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
        return reference_dense.backward(q, k, v, out, lse, grad_out, grad_lse, is_causal, scale, dropout_p, rng,
                                        key_offset)
