"""FLOP and MAC counting for nattn's ops (docs/semantics.md, "FLOPs").

Only the two matrix products count: ``2 * B * H * N * W * D`` for QK and
``2 * B * H * N * W * D_v`` for AV, with ``N`` query tokens and ``W = prod(kernel_size)``;
softmax, scale and bias are free and a causal mask does not reduce the count. fvcore
reports MACs (half the FLOPs); torch's ``FlopCounterMode`` reports FLOPs.

Importing this module (``import nattn`` does) registers formulas for
``torch.ops.nattn.{na,attention}_{forward,backward}`` with
``torch.utils.flop_counter`` so that ``FlopCounterMode`` counts NA with no user code.
For fvcore, call :func:`add_nattn_handles` on a ``FlopCountAnalysis``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from . import ops  # noqa: F401  (defines torch.ops.nattn.*)

ShapeLike = Union[torch.Tensor, Sequence[int]]

__all__ = [
    "na_flops", "na_macs", "attention_flops", "fvcore_handles", "add_nattn_handles",
]


def _shape(x: ShapeLike, name: str) -> tuple:
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, (list, tuple, torch.Size)) and all(isinstance(s, int) for s in x):
        return tuple(x)
    raise TypeError(f"{name} must be a tensor or a shape (sequence of ints), got {type(x).__name__}")


def _window(kernel_size, na_dim: int) -> int:
    if isinstance(kernel_size, int) and not isinstance(kernel_size, bool):
        return kernel_size ** na_dim
    if isinstance(kernel_size, (list, tuple)) and len(kernel_size) == na_dim:
        return math.prod(int(k) for k in kernel_size)
    raise ValueError(f"kernel_size must be an int or a tuple of {na_dim} ints, got {kernel_size!r}")


def _na_count(q_shape: tuple, v_shape: tuple, kernel_size) -> int:
    """FLOPs of the two products of one NA call, from the query and value shapes."""
    na_dim = len(q_shape) - 3
    if na_dim not in (1, 2, 3):
        raise ValueError(f"query must be [B, *spatial (1-3 axes), H, D], got shape {q_shape}")
    batch, heads, dim = q_shape[0], q_shape[-2], q_shape[-1]
    tokens = math.prod(q_shape[1:-2])
    return 2 * batch * heads * tokens * _window(kernel_size, na_dim) * (dim + v_shape[-1])


def attention_flops(query: ShapeLike, key: ShapeLike, value: ShapeLike) -> int:
    """FLOPs of dense attention ``[B, N, H, D]`` x ``[B, N_kv, H_kv, D]`` (QK and AV)."""
    q, k, v = _shape(query, "query"), _shape(key, "key"), _shape(value, "value")
    return 2 * q[0] * q[-2] * math.prod(q[1:-2]) * math.prod(k[1:-2]) * (q[-1] + v[-1])


def na_flops(
    query: ShapeLike,
    key: Optional[ShapeLike] = None,
    value: Optional[ShapeLike] = None,
    kernel_size: Union[int, Sequence[int]] = 7,
    stride=1,
    dilation=1,
    is_causal=False,
    scale: Optional[float] = None,
    additional_keys: Optional[ShapeLike] = None,
    additional_values: Optional[ShapeLike] = None,
    **_ignored: Any,
) -> int:
    """FLOPs of one ``na1d/na2d/na3d`` call with these arguments (tensors or shapes).

    ``key``/``value`` default to the query's shape. Stride, dilation, causal masking,
    scale and RPB do not change the count. Extra keys/values add a dense attention of
    every query over them.
    """
    q = _shape(query, "query")
    v = _shape(value, "value") if value is not None else q
    total = _na_count(q, v, kernel_size)
    if additional_keys is not None:
        ek = _shape(additional_keys, "additional_keys")
        ev = _shape(additional_values if additional_values is not None else additional_keys,
                    "additional_values")
        flat_q = (q[0], math.prod(q[1:-2]), q[-2], q[-1])
        total += attention_flops(flat_q, ek, ev)
    return total


def na_macs(*args, **kwargs) -> int:
    """Multiply-accumulates of one NA call (what fvcore reports): ``na_flops / 2``."""
    return na_flops(*args, **kwargs) // 2


# ----------------------------------------------------------- torch.utils.flop_counter
def _register_torch_formulas() -> None:
    from torch.utils.flop_counter import register_flop_formula

    # Formulas receive shapes in place of tensors (the op's own argument order).
    def na_forward_flop(q, k, v, rpb, kernel_size, *args, out_shape=None, **kwargs) -> int:
        return _na_count(tuple(q), tuple(v), kernel_size)

    def na_backward_flop(grad_out, grad_lse, q, k, v, rpb, out, lse, kernel_size, *args,
                         out_shape=None, **kwargs) -> int:
        return 2 * _na_count(tuple(q), tuple(v), kernel_size)  # as torch counts sdpa backward

    def na_qkv_forward_flop(qkv, rpb, kernel_size, *args, out_shape=None, **kwargs) -> int:
        q = (*qkv[:-3], *qkv[-2:])  # q's (and v's) shape: one of the packed three
        return _na_count(tuple(q), tuple(q), kernel_size)

    def na_qkv_backward_flop(grad_out, grad_lse, qkv, rpb, out, lse, kernel_size, *args,
                             out_shape=None, **kwargs) -> int:
        q = (*qkv[:-3], *qkv[-2:])
        return 2 * _na_count(tuple(q), tuple(q), kernel_size)

    def attention_forward_flop(q, k, v, *args, out_shape=None, **kwargs) -> int:
        return attention_flops(tuple(q), tuple(k), tuple(v))

    def attention_backward_flop(grad_out, grad_lse, q, k, v, *args, out_shape=None, **kwargs) -> int:
        return 2 * attention_flops(tuple(q), tuple(k), tuple(v))

    for op, formula in (
        (torch.ops.nattn.na_forward, na_forward_flop),
        (torch.ops.nattn.na_backward, na_backward_flop),
        (torch.ops.nattn.na_qkv_forward, na_qkv_forward_flop),
        (torch.ops.nattn.na_qkv_backward, na_qkv_backward_flop),
        (torch.ops.nattn.attention_forward, attention_forward_flop),
        (torch.ops.nattn.attention_backward, attention_backward_flop),
    ):
        try:
            register_flop_formula(op)(formula)
        except RuntimeError as e:  # already registered (module re-executed): keep the first
            if "duplicate" not in str(e).lower() and "already" not in str(e).lower():
                raise


_register_torch_formulas()


# ------------------------------------------------------------------------- fvcore
def _ivalue(value) -> Any:
    """The constant behind a jit graph value (lists are ``prim::ListConstruct`` of constants)."""
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        return [_ivalue(v) for v in node.inputs()]
    return value.toIValue()


def _jit_shape(value) -> tuple:
    sizes = value.type().sizes()
    if sizes is None:
        raise ValueError("fvcore: a nattn op input has no static shape in the traced graph")
    return tuple(sizes)


def _fvcore_na(inputs: List[Any], outputs: List[Any]) -> int:
    # nattn::na_forward(q, k, v, rpb, kernel_size, stride, dilation, is_causal, scale, backend)
    return _na_count(_jit_shape(inputs[0]), _jit_shape(inputs[2]), _ivalue(inputs[4])) // 2


def _fvcore_attention(inputs: List[Any], outputs: List[Any]) -> int:
    # nattn::attention_forward(q, k, v, is_causal, scale, backend)
    return attention_flops(_jit_shape(inputs[0]), _jit_shape(inputs[1]), _jit_shape(inputs[2])) // 2


def fvcore_handles() -> Dict[str, Any]:
    """fvcore op handles (MACs) for the op names nattn's ops get in a jit trace."""
    return {"nattn::na_forward": _fvcore_na, "nattn::attention_forward": _fvcore_attention}


def add_nattn_handles(analysis):
    """Teach a ``fvcore.nn.FlopCountAnalysis`` to count nattn's ops; returns it.

    Example::

        from fvcore.nn import FlopCountAnalysis
        macs = add_nattn_handles(FlopCountAnalysis(model, x)).total()
    """
    return analysis.set_op_handle(**fvcore_handles())
