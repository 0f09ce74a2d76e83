"""The reference backend: plain PyTorch, any device, the oracle for every other backend."""

from __future__ import annotations

from . import reference_dense, reference_math
from .base import Backend


class ReferenceBackend(Backend):
    name = "reference"

    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        return []  # supports every problem that passed argument validation

    def na_forward(self, q, k, v, rpb, params):
        return reference_math.forward(q, k, v, rpb, params)

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params):
        return reference_math.backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params)

    def dense_not_supported_reasons(self, q, k, v, is_causal, explicit):
        return []

    def dense_forward(self, q, k, v, is_causal, scale):
        return reference_dense.forward(q, k, v, is_causal, scale)

    def dense_backward(self, q, k, v, out, lse, grad_out, grad_lse, is_causal, scale):
        return reference_dense.backward(q, k, v, out, lse, grad_out, grad_lse, is_causal, scale)
