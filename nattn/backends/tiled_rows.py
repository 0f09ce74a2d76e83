"""The token-row layout of the tiled backend (backends/tiled.py) and the unfused QK / AV
products on its boxes (nattn/qk_av_tiled.py).

A tensor ``[B, *grid, H, w]`` is kept as ``[B, N, H * w]`` rows, one per token: a box's rows
are one ``index_select`` of whole tokens, and each head's slice of those rows is a strided
matrix that ``torch.bmm`` reads in place. Products run one head at a time, batched over
boxes, into ``[H, B * C, rows, cols]`` results: a product over every head at once would
first copy the gathered rows heads first (~40% of a 7x7 window's forward, CPU), which pays
only for small products (SMALL_PRODUCT), where the Python loop costs more.
Temporaries come from the thread's scratch buffers (backends/scratch.py), by name.
"""

from __future__ import annotations

import math

import torch

from . import scratch


def token_rows(x: torch.Tensor, dtype) -> torch.Tensor:
    """``x [B, *grid, H, w]`` as ``[B, N, H * w]`` in ``dtype``: ``x``'s own view where it
    is contiguous, else a copy."""
    b, heads, width = x.shape[0], x.shape[-2], x.shape[-1]
    if x.dtype == dtype and x.is_contiguous():
        return x.view(b, -1, heads * width)
    # a copy, once: index_select would copy a strided source (e.g. q of a packed qkv) whole
    # for every chunk's gather
    return torch.empty(x.shape, dtype=dtype, device=x.device).copy_(x).view(b, -1, heads * width)


def store(x: torch.Tensor, dst: torch.Tensor, count) -> None:
    """A result ``x [B * prod(count), N (+ spare rows), ...]`` into ``dst``, a class view
    ``[B, *count, *grid, ...]`` of the output (dilation_fold.class_view): one strided copy."""
    na = len(count)
    dst.copy_(x[:, : math.prod(dst.shape[1 + na : 1 + 2 * na])].view(dst.shape))


# Multiply-adds of one head's product below which one product over every head (torch
# copies the strided operands heads first) beats a Python loop of products over the heads.
SMALL_PRODUCT = 1 << 18


def _small(left, right) -> bool:
    return left.shape[1] * left.shape[2] * left.shape[3] * right.shape[-1] < SMALL_PRODUCT


def each_head(out, left, right, groups: int = 1) -> None:
    """``out[h] = left[h] @ right[h // groups]`` for every query head ``h``: ``left [H, B * C,
    R, K]`` and ``right [H_kv, B * C, K, U]`` (strided views, heads first), batched over boxes."""
    if _small(left, right):  # (matmul's out= fails on functorch's wrappers: a copy instead)
        out.copy_(torch.matmul(left, right if groups == 1 else right.repeat_interleave(groups, 0)))
        return
    for h, (a, o) in enumerate(zip(left.unbind(0), out.unbind(0))):
        torch.bmm(a, right[h // groups], out=o)


def each_kv_head(out, left, right, groups: int) -> None:
    """``out[j] = sum of left[h] @ right[h]`` over the query heads ``h`` of KV head ``j``:
    ``left [H, B * C, U, R]``, ``right [H, B * C, R, w]``, ``out [H_kv, B * C, U, w]``."""
    if _small(left, right):
        prod = torch.matmul(left, right)
        out.copy_(prod if groups == 1 else prod.unflatten(0, (-1, groups)).sum(1))
        return
    for h, (a, b) in enumerate(zip(left.unbind(0), right.unbind(0))):
        if h % groups:
            out[h // groups].baddbmm_(a, b)
        else:
            torch.bmm(a, b, out=out[h // groups])


def heads_first(x: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """Gathered rows ``[B * C, R, H, w]`` as the view ``[H, B * C, R, w]`` (``transposed``:
    ``[H, B * C, w, R]``) that each_head / each_kv_head take."""
    return x.permute(2, 0, 3, 1) if transposed else x.permute(2, 0, 1, 3)


class TokenRows:
    """A class of dilation groups' undilated problem: batch, compute dtype, temporaries."""

    def __init__(self, batch: int, dtype: torch.dtype, device: torch.device):
        self.batch, self.dtype, self.device = batch, dtype, device

    def new(self, name: str, *shape) -> torch.Tensor:
        """A temporary: the thread's scratch buffer ``name`` (else fresh pages per chunk and
        call, backends/scratch.py)."""
        return scratch.take(name, shape, self.dtype, self.device)

    def rows(self, name: str, x, idx, heads: int):
        """``x [B, N, H * w]`` at the token rows ``idx [C, R]`` -> ``[B * C, R, H, w]``."""
        (c, r), b = idx.shape, x.shape[0]
        out = self.new(name, b, c * r, x.shape[-1])
        return torch.index_select(x, 1, idx.reshape(-1), out=out).view(b * c, r, heads, -1)

    def scatter_rows(self, dst, rows, x):
        """Per-head results ``x [H, B * C, R, w]`` into ``dst [B, N + 1, H, w]`` at the token
        rows ``rows [C, R]`` (padded rows: the spare token N)."""
        h, _, r, w = x.shape
        dst.index_copy_(1, rows.reshape(-1), x.view(h, self.batch, -1, w).permute(1, 2, 0, 3))

    def add_key_products(self, acc, left, right, idx, groups: int):
        """A key-side gradient: per box ``sum over the query heads of KV head j of left[h] @
        right[h]`` (``left [H, B * C, U, R]``, ``right [H, B * C, R, w]``), summed into ``acc
        [N, B, H_kv * w]`` at the boxes' keys ``idx [C, U]``."""
        part = self.new("part", left.shape[0] // groups, left.shape[1], left.shape[2], right.shape[-1])
        each_kv_head(part, left, right, groups)
        self.add_token_major(acc, part, idx)

    def add_token_major(self, acc, part, idx):
        """Per-box key results ``part [H_kv, B * C, U, w]`` summed into ``acc [N, B, H_kv *
        w]`` at the boxes' keys ``idx [C, U]`` (token-major: index_add_ along dim 0 runs ~5x
        faster than along a later dim)."""
        hk, _, u, w = part.shape
        c, b = idx.shape[0], self.batch
        tm = self.new("token_major", c, u, b, hk, w)
        tm.copy_(part.view(hk, b, c, u, w).permute(2, 3, 1, 0, 4))
        acc.index_add_(0, idx.reshape(-1), tm.view(c * u, b, hk * w))

    def store_token_major(self, acc, dst, count):
        """``acc [N, B, H_kv * w]`` (add_token_major's) into ``dst``'s class view."""
        n, b = acc.shape[0], acc.shape[1]
        store(acc.view(n, b, dst.shape[-2], -1).transpose(0, 1), dst, count)
