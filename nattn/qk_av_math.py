"""Chunked forward and backward of the unfused QK and AV products (nattn/qk_av.py).

Each query's window keys (values) are gathered a chunk of queries at a time, so the
gathered ``[B, C, W, H_kv, D]`` block stays under :data:`CHUNK_ELEMENTS` elements, and
nothing but the inputs is saved for the backward, which gathers again. Key/value
gradients are scattered back with ``index_add_``. Window slots that a causal window does
not hold (``valid`` false; their index is clamped onto a real token) take no part in
either direction. First derivatives only.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

CHUNK_ELEMENTS = 1 << 24  # gathered elements per chunk (64 MiB in float32)


def _chunks(b: int, n: int, w: int, heads_kv: int, dim: int):
    size = max(1, CHUNK_ELEMENTS // max(1, b * w * heads_kv * dim))
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _gather(x_flat, key_idx, valid, start, stop, masked: bool):
    """``x_flat [B, N, H_kv, D]`` at the window keys of queries ``start..stop-1``: ``[B, C, W, H_kv, D]``."""
    out = x_flat[:, key_idx[start:stop]]
    if masked:
        out = torch.where(valid[start:stop, :, None, None], out, 0)
    return out


def _scatter(grad_flat, contrib, key_idx, valid, start, stop, masked: bool):
    """Add ``contrib [B, C, W, H_kv, D]`` into ``grad_flat`` at the window keys."""
    if masked:
        contrib = torch.where(valid[start:stop, :, None, None], contrib, 0)
    b, c, w = contrib.shape[:3]
    grad_flat.index_add_(1, key_idx[start:stop].reshape(-1), contrib.reshape(b, c * w, *contrib.shape[3:]))


class WindowQK(torch.autograd.Function):
    """``q [B, N, H_kv, G, D]``, ``k [B, N, H_kv, D]`` -> ``[B, N, H_kv, G, W]`` (0 in invalid slots)."""

    @staticmethod
    def forward(ctx, q, k, key_idx, valid, masked: bool):
        b, n, heads_kv, _, dim = q.shape
        w = key_idx.shape[1]
        out = q.new_empty(*q.shape[:4], w)
        for s, e in _chunks(b, n, w, heads_kv, dim):
            k_w = _gather(k, key_idx, valid, s, e, masked)
            out[:, s:e] = torch.einsum("bnhgd,bnwhd->bnhgw", q[:, s:e], k_w)
        ctx.save_for_backward(q, k, key_idx, valid)
        ctx.masked = masked
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, key_idx, valid = ctx.saved_tensors
        b, n, heads_kv, _, dim = q.shape
        w = key_idx.shape[1]
        dq = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        dk = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        for s, e in _chunks(b, n, w, heads_kv, dim):
            g = grad[:, s:e]
            if dq is not None:
                dq[:, s:e] = torch.einsum("bnhgw,bnwhd->bnhgd", g, _gather(k, key_idx, valid, s, e, ctx.masked))
            if dk is not None:
                contrib = torch.einsum("bnhgw,bnhgd->bnwhd", g, q[:, s:e])
                _scatter(dk, contrib, key_idx, valid, s, e, ctx.masked)
        return dq, dk, None, None, None


class WindowAV(torch.autograd.Function):
    """``a [B, N, H_kv, G, W]``, ``v [B, N, H_kv, D_v]`` -> ``[B, N, H_kv, G, D_v]``."""

    @staticmethod
    def forward(ctx, a, v, key_idx, valid, masked: bool):
        b, n, heads_kv, groups, w = a.shape
        dim_v = v.shape[-1]
        out = a.new_empty(b, n, heads_kv, groups, dim_v)
        for s, e in _chunks(b, n, w, heads_kv, dim_v):
            v_w = _gather(v, key_idx, valid, s, e, masked)
            out[:, s:e] = torch.einsum("bnhgw,bnwhe->bnhge", a[:, s:e], v_w)
        ctx.save_for_backward(a, v, key_idx, valid)
        ctx.masked = masked
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        a, v, key_idx, valid = ctx.saved_tensors
        b, n, heads_kv, _, w = a.shape
        dim_v = v.shape[-1]
        da = torch.empty_like(a) if ctx.needs_input_grad[0] else None
        dv = torch.zeros_like(v) if ctx.needs_input_grad[1] else None
        for s, e in _chunks(b, n, w, heads_kv, dim_v):
            g = grad[:, s:e]
            if da is not None:
                da[:, s:e] = torch.einsum("bnhge,bnwhe->bnhgw", g, _gather(v, key_idx, valid, s, e, ctx.masked))
            if dv is not None:
                contrib = torch.einsum("bnhgw,bnhge->bnwhe", a[:, s:e], g)
                _scatter(dv, contrib, key_idx, valid, s, e, ctx.masked)
        return da, dv, None, None, None
