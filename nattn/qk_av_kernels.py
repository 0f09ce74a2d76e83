"""The unfused ops on CUDA tensors: libnattn's window kernels (csrc/include/nattn/window/).

Three products over each query's window slots, fp32 accumulation, one kernel launch each:
``dot`` (the logits of ``*_qk``; the weights' gradient of ``*_av``), ``sum`` (``*_av``; the
query's gradient of ``*_qk``) and ``inverse_sum`` (the key's and value's gradients: each key
sums over the queries whose windows hold it, a box of queries per key, so no atomics and
the result is deterministic). nattn/qk_av.py uses them for CUDA tensors of a dtype and NA
dim the library has, with head dims that are multiples of 8; the plain PyTorch path
(nattn/qk_av_math.py) takes everything else.
"""

from __future__ import annotations

import ctypes
import math
from typing import Optional
import torch
from torch.autograd.function import once_differentiable

from . import _buffers
from ._cuda import kernel_table, library
from .params import NAParams

DOT, SUM, INVERSE_SUM = (kernel_table.WINDOW_OPS.index(n) for n in ("dot", "sum", "inverse_sum"))
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_ERR_LEN = 1024


def available(t: torch.Tensor, na_dim: int, dim: int, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the window kernels take tensors like ``t`` (CUDA, a compiled dtype and NA dim,
    rows of ``dim`` channels, a multiple of 8), or like ``t`` converted to ``dtype``."""
    dtype = t.dtype if dtype is None else dtype
    if t.device.type != "cuda" or dim % 8 or dtype not in _DTYPE_NAMES:
        return False
    lib = library.load()
    return lib is not None and lib.window_op is not None and (_DTYPE_NAMES[dtype], na_dim) in lib.window_ops


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, at a 16-byte aligned address (the kernels load 8 channels at a time)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _run(op: int, a, b, out, params: NAParams, rows: torch.Tensor, kv: torch.Tensor,
         neg_inf: bool = False) -> None:
    """One window op; ``rows`` is a query-side tensor ``[B, *spatial, H, ...]`` and ``kv`` the
    key/value-side ``[B, *spatial, H_kv, dim]`` of the call (they give its sizes)."""
    spatial, heads, heads_kv, dim = kv.shape[1:-2], rows.shape[-2], kv.shape[-2], kv.shape[-1]
    lib = library.load()
    n = len(spatial)
    pad = lambda xs, fill: list(xs) + [fill] * (3 - n)  # noqa: E731
    values = {
        "abi_version": [getattr(lib, "abi", kernel_table.ABI_VERSION)], "device": [a.device.index or 0],
        "dtype": [kernel_table.DTYPES.index(_DTYPE_NAMES[a.dtype])], "op": [op], "na_dim": [n],
        "batch": [a.shape[0]], "heads": [heads], "heads_kv": [heads_kv], "dim": [dim],
        "spatial": pad(spatial, 1), "kernel": pad(params.kernel_size, 1), "stride": pad(params.stride, 1),
        "dilation": pad(params.dilation, 1), "causal": pad([int(c) for c in params.is_causal], 0),
        "neg_inf": [int(neg_inf)], "a_ptr": [a.data_ptr()], "b_ptr": [b.data_ptr()], "out_ptr": [out.data_ptr()],
    }
    flat = [v for name, count in kernel_table.WINDOW_FIELDS for v in values[name]]
    fields = (ctypes.c_int64 * len(flat))(*flat)
    err = ctypes.create_string_buffer(_ERR_LEN)
    stream = torch.cuda.current_stream(a.device).cuda_stream
    rc = lib.window_op(ctypes.cast(fields, ctypes.c_void_p), len(flat), ctypes.c_void_p(stream), err, _ERR_LEN)
    if rc:
        raise RuntimeError(err.value.decode(errors="replace"))


class KernelQK(torch.autograd.Function):
    """``q [B, *spatial, H, D]``, ``k [B, *spatial, H_kv, D]`` -> logits ``[B, *spatial, H, W]``
    (``-inf`` in slots a causal window does not hold)."""

    @staticmethod
    def forward(ctx, q, k, params: NAParams):
        q, k = _aligned(q), _aligned(k)
        out = _buffers.empty(*q.shape[:-1], math.prod(params.kernel_size), dtype=q.dtype, device=q.device)
        _run(DOT, q, k, out, params, q, k, neg_inf=True)
        ctx.save_for_backward(q, k)
        ctx.params = params
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        grad = _aligned(grad.to(q.dtype))
        dq = dk = None
        if ctx.needs_input_grad[0]:
            dq = _buffers.empty_like(q)
            _run(SUM, grad, k, dq, ctx.params, q, k)
        if ctx.needs_input_grad[1]:
            dk = _buffers.empty_like(k)
            _run(INVERSE_SUM, grad, q, dk, ctx.params, q, k)
        return dq, dk, None


class KernelAV(torch.autograd.Function):
    """``attn [B, *spatial, H, W]``, ``v [B, *spatial, H_kv, D_v]`` -> ``[B, *spatial, H, D_v]``
    (slots a causal window does not hold are skipped, whatever ``attn`` holds there)."""

    @staticmethod
    def forward(ctx, attn, v, params: NAParams):
        attn, v = _aligned(attn), _aligned(v)
        out = _buffers.empty(*attn.shape[:-1], v.shape[-1], dtype=v.dtype, device=v.device)
        _run(SUM, attn, v, out, params, attn, v)
        ctx.save_for_backward(attn, v)
        ctx.params = params
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        attn, v = ctx.saved_tensors
        grad = _aligned(grad.to(v.dtype))
        da = dv = None
        if ctx.needs_input_grad[0]:
            da = _buffers.empty_like(attn)
            _run(DOT, grad, v, da, ctx.params, attn, v, neg_inf=False)
        if ctx.needs_input_grad[1]:
            dv = _buffers.empty_like(v)
            _run(INVERSE_SUM, attn, grad, dv, ctx.params, attn, v)
        return da, dv, None
