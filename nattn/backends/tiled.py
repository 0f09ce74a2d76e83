"""The tiled backend: NA as dense products over boxes of queries, in plain PyTorch.

The reference backend gathers every query's own window and multiplies it vector by vector;
this one cuts the queries into boxes (backends/tiled_plan.py), multiplies each box's
queries with the one range of keys their windows span (matrix products), and masks the
scores outside each query's window before the softmax. It computes more scores than the
windows hold (``prod(U)`` per query, see tiled_plan) and wins by doing them in matrix
products: on a CPU it runs NA several times faster than the reference.

Automatic dispatch runs it on CPU tensors (``backend="tiled"`` runs it on any device).
Same numbers as the reference: float32 math (float64 for float64 inputs), outputs in the
input dtype, LSE in float32 (float64); an explicit backward from the saved LSE whose key,
value and bias gradients are summed back with ``index_add_`` (deterministic on the CPU).
Memory is bounded by the chunk of boxes and a block of KV heads' copies, never N x N. Attention
dropout draws the reference's keep mask (backends/tiled_dropout.py).
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

from ..params import NAParams
from . import register_backend
from .base import Backend
from .dilation_fold import each_class, padded_shape, undilated
from .reference_math import compute_dtype, lse_dtype
from .tiled_dropout import BoxDropout
from .tiled_plan import Boxes, boxes_for


def heads_first(x, heads_kv, dtype, groups=None, scale=None):
    """``x [B, *grid, H, w]`` (times ``scale``) as a new ``[B, H_kv, N, (G,) w]`` tensor in
    ``dtype``: a box's rows are then one gather along N, ready for the products."""
    shape = (x.shape[0], -1, heads_kv) + ((groups,) if groups is not None else ()) + (x.shape[-1],)
    x = x.reshape(shape).transpose(1, 2)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    return out.copy_(x) if scale is None else torch.mul(x, scale, out=out)


def box_rows(x, idx):
    """``x [B, H_kv, N, ...]`` at box rows ``idx [C, R]`` -> ``[B, H_kv, C, R, ...]``."""
    return x.index_select(2, idx.reshape(-1)).view(*x.shape[:2], *idx.shape, *x.shape[3:])


class _Problem:
    """An undilated problem's tensors, heads first (``[B, H_kv, N, G, D]``), compute dtype."""

    def __init__(self, q, k, v, params: NAParams, boxes: Boxes):
        self.batch, self.heads, self.dim = q.shape[0], q.shape[-2], q.shape[-1]
        self.heads_kv, self.dim_v = k.shape[-2], v.shape[-1]
        self.groups = self.heads // self.heads_kv
        self.dtype = compute_dtype(q.dtype)
        self.lengths = tuple(q.shape[1 : 1 + params.na_dim])
        # the scale goes into q once: scores come out scaled, dK = dS^T (scale q)
        self.q = heads_first(q, self.heads_kv, self.dtype, self.groups, params.scale)
        self.k = self.first(k)
        self.v = self.first(v)
        self.boxes = boxes

    def first(self, x, groups=None):
        return heads_first(x, self.heads_kv, self.dtype, groups)

    def rows(self, x, idx):
        """``x [B, H_kv, N, G, w]`` at box rows ``idx [C, R]`` -> ``[B, H_kv, C, R * G, w]``."""
        return box_rows(x, idx).flatten(3, 4)

    def keys(self, x, idx):
        """``x [B, H_kv, N, w]`` at the boxes' keys ``idx [C, U]`` -> ``[B, H_kv, C, U, w]``."""
        return x[:, :, idx]  # (advanced indexing: 2-3x index_select's speed here, CPU)

    def scores(self, qb, kb, mask, rpb_idx, rpb):
        """Masked scaled logits ``[B, H_kv, C, R, G, U]`` of the boxes' queries and keys;
        ``rpb`` is the bias table transposed with a row of -inf appended (``_bias_table``),
        which the masked scores' bias index points at: the bias then masks too."""
        b, c = qb.shape[0], qb.shape[2]
        r, u = mask.shape[1], mask.shape[2]
        s = torch.matmul(qb, kb.transpose(-1, -2)).view(b, self.heads_kv, c, r, self.groups, u)
        if rpb is not None:
            bias = rpb.index_select(0, rpb_idx.reshape(-1)).view(c, r, u, self.heads_kv, self.groups)
            return s.add_(bias.permute(3, 0, 1, 4, 2))
        return s.masked_fill_(~mask[:, :, None, :], float("-inf"))


def store_heads_first(x: torch.Tensor, dst: torch.Tensor, count) -> None:
    """A heads-first result ``x [B * prod(count), H_kv, N (+ 1 padding), G, w]`` into ``dst``,
    a class view ``[B, *count, *grid, H, w]`` (dilation_fold.class_view): one strided copy."""
    b, grid, heads, width = dst.shape[0], dst.shape[1 + len(count) : -2], dst.shape[-2], dst.shape[-1]
    hk, g = x.shape[1], x.shape[3]
    n = math.prod(grid)
    src = x[:, :, :n].view(b, *count, hk, *grid, g, width)
    na, nc = len(grid), len(count)
    order = [0, *range(1, 1 + nc), *range(2 + nc, 2 + nc + na), 1 + nc, 2 + nc + na, 3 + nc + na]
    dst.view(b, *count, *grid, hk, heads // hk, width).copy_(src.permute(order))


# Elements of one block of KV heads' heads-first copies and result buffers (float32: 32 MiB).
HEAD_BLOCK_ELEMENTS = 1 << 23


def _kv_head_blocks(q, k, v, rpb, params: NAParams):
    """Blocks of KV heads: their slices of the heads (query heads, KV heads, RPB rows) and
    the boxes, planned once for all of them. A block's copies and buffers stay within
    HEAD_BLOCK_ELEMENTS (one KV head at least), so large problems run a head at a time and
    small ones in one go (fewer, larger products)."""
    hk = k.shape[-2]
    g = q.shape[-2] // hk
    tokens = q[..., 0, 0].numel()  # batch x grid
    # a KV head's copies (q, k, v, dO) and results (dq, dk, dv or out), ~2 of each
    per_head = tokens * 2 * (g * q.shape[-1] + k.shape[-1] + g * v.shape[-1] + v.shape[-1])
    block = max(1, min(hk, HEAD_BLOCK_ELEMENTS // max(1, per_head)))
    boxes = boxes_for(tuple(q.shape[1 : 1 + params.na_dim]), params.kernel_size, params.stride, params.is_causal,
                      g, rpb is not None, q.device)
    for h in range(0, hk, block):
        e = min(hk, h + block)
        yield slice(h * g, e * g), slice(h, e), boxes


def _forward(q, k, v, rpb, params: NAParams, out, lse, count, drop):
    """Undilated NA on a class of dilation groups (``q`` etc. folded), written into its views
    of ``out`` and ``lse`` (``count`` groups per axis); ``drop`` its dropout or None."""
    for qh, kh, boxes in _kv_head_blocks(q, k, v, rpb, params):
        o_pad, l_pad = _forward_heads_first(q[..., qh, :], k[..., kh, :], v[..., kh, :],
                                            None if rpb is None else rpb[qh], params, boxes, drop, qh.start)
        store_heads_first(o_pad, out[..., qh, :], count)  # the inputs' copies are freed by now
        store_heads_first(l_pad, lse[..., qh, None], count)


def _bias_table(rpb, dtype):
    """``rpb [H, ...]`` as ``[entries + 1, H]`` in ``dtype``, the last row -inf (the masked
    scores' entry, tiled_plan.Boxes), or None."""
    if rpb is None:
        return None
    table = rpb.to(dtype).flatten(1).t()
    return torch.cat([table, table.new_full((1, table.shape[1]), float("-inf"))])


def _scores_per_box(pr: "_Problem", drop) -> int:
    per = pr.batch * pr.heads * pr.boxes.rows * pr.boxes.keys
    return per * (1 + drop.ELEMENTS_PER_WEIGHT) if drop is not None else per


def _forward_heads_first(q, k, v, rpb, params: NAParams, boxes, drop, first_head):
    pr = _Problem(q, k, v, params, boxes)
    table = _bias_table(rpb, pr.dtype)
    b, hk, g, n = pr.batch, pr.heads_kv, pr.groups, pr.boxes.tokens
    o_pad = torch.empty(b, hk, n + 1, g, pr.dim_v, dtype=pr.dtype, device=q.device)
    l_pad = torch.empty(b, hk, n + 1, g, 1, dtype=pr.dtype, device=q.device)
    for q_gather, q_scatter, k_idx, mask, rpb_idx in pr.boxes.chunks(_scores_per_box(pr, drop)):
        c, r, u = mask.shape
        s = pr.scores(pr.rows(pr.q, q_gather), pr.keys(pr.k, k_idx), mask, rpb_idx, table)
        lse_c = torch.logsumexp(s, -1, keepdim=True)  # -inf: a row without keys (padding)
        rows = q_scatter.reshape(-1)  # padded rows all land on the extra token N
        l_pad.index_copy_(2, rows, lse_c.view(b, hk, c * r, g, 1))
        s.sub_(lse_c.masked_fill_(lse_c == float("-inf"), 0)).exp_()  # probabilities (0 without keys)
        if drop is not None:  # the dropped weights meet V; the LSE stays the undropped one
            s.mul_(drop.factor(q_gather, k_idx, first_head, hk, g, s.dtype))
        o = torch.matmul(s.view(b, hk, c, r * g, u), pr.keys(pr.v, k_idx))
        o_pad.index_copy_(2, rows, o.view(b, hk, c * r, g, pr.dim_v))
    return o_pad, l_pad


def _backward(q, k, v, rpb, delta, lse, grad_out, params: NAParams, drpb, grads, count, drop):
    """Undilated NA backward on a class of dilation groups: dq, dk, dv into its views
    ``grads``; the bias gradient added into ``drpb`` (``[H, table]``, or None). ``delta`` is
    rowsum(dO * O) minus the LSE's gradient, ``[B, *grid, H]``."""
    dq, dk, dv = grads
    for qh, kh, boxes in _kv_head_blocks(q, k, v, rpb, params):
        results = _backward_heads_first(
            q[..., qh, :], k[..., kh, :], v[..., kh, :], None if rpb is None else rpb[qh], delta[..., qh],
            lse[..., qh], grad_out[..., qh, :], params, None if drpb is None else drpb[qh], boxes, drop, qh.start)
        for x, dst in zip(results, (dq[..., qh, :], dk[..., kh, :], dv[..., kh, :])):
            store_heads_first(x, dst, count)  # the inputs' copies are freed by now


def token_major(x: torch.Tensor) -> torch.Tensor:
    """``[B, H_kv, C, U, w]`` per-box key gradients -> ``[C * U, B, H_kv, w]``."""
    b, hk, c, u, w = x.shape
    return x.permute(2, 3, 0, 1, 4).reshape(c * u, b, hk, w)


def _backward_heads_first(q, k, v, rpb, delta, lse, grad_out, params: NAParams, drpb, boxes, drop,
                          first_head):
    pr = _Problem(q, k, v, params, boxes)
    table = _bias_table(rpb, pr.dtype)
    b, hk, g, n, cd = pr.batch, pr.heads_kv, pr.groups, pr.boxes.tokens, pr.dtype
    d_out = pr.first(grad_out, g)
    delta = pr.first(delta[..., None], g)[..., 0]  # [B, H_kv, N, G]
    lse_g = pr.first(lse[..., None], g)[..., 0]
    lse_g.masked_fill_(lse_g == float("-inf"), 0)
    dq_pad = torch.empty(b, hk, n + 1, g, pr.dim, dtype=cd, device=q.device)
    # dK and dV token-major: index_add_ along dim 0 runs ~5x faster than along a later dim
    dk = torch.zeros(n, b, hk, pr.dim, dtype=cd, device=q.device)
    dv = torch.zeros(n, b, hk, pr.dim_v, dtype=cd, device=q.device)
    for q_gather, q_scatter, k_idx, mask, rpb_idx in pr.boxes.chunks(_scores_per_box(pr, drop)):
        c, r, u = mask.shape
        qb, kb, vb = pr.rows(pr.q, q_gather), pr.keys(pr.k, k_idx), pr.keys(pr.v, k_idx)
        dob = pr.rows(d_out, q_gather)
        s = pr.scores(qb, kb, mask, rpb_idx, table)
        rows_lse = lse_g.index_select(2, q_gather.reshape(-1)).view(b, hk, c, r, g, 1)
        p = s.sub_(rows_lse).exp_().view(b, hk, c, r * g, u)  # probabilities
        ds = torch.matmul(dob, vb.transpose(-1, -2))  # dP
        kept = p
        if drop is not None:  # dP and the weights that met dO carry the forward's mask
            factor = drop.factor(q_gather, k_idx, first_head, hk, g, p.dtype).view(p.shape)
            ds.mul_(factor)
            kept = p * factor
        ds.sub_(delta.index_select(2, q_gather.reshape(-1)).view(b, hk, c, r * g, 1)).mul_(p)  # d logits
        dq = torch.matmul(ds, kb).mul_(params.scale)  # (the logits' scale is in q: dK needs none)
        dq_pad.index_copy_(2, q_scatter.reshape(-1), dq.view(b, hk, c * r, g, pr.dim))
        flat = k_idx.reshape(-1)
        dk.index_add_(0, flat, token_major(torch.matmul(ds.transpose(-1, -2), qb)))
        dv.index_add_(0, flat, token_major(torch.matmul(kept.transpose(-1, -2), dob)))
        if drpb is not None:
            ds_h = ds.sum(0).view(hk, c, r, g, u).permute(0, 3, 1, 2, 4).reshape(pr.heads, -1)
            drpb.index_add_(1, rpb_idx.reshape(-1).long(), ds_h)  # (an int32 index: 25x slower)
    return dq_pad, dk.permute(1, 2, 0, 3)[:, :, :, None], dv.permute(1, 2, 0, 3)[:, :, :, None]


def _dropout(rng, params: NAParams, q, spatial, cls):
    if params.dropout_p == 0:
        return None
    if rng is None:
        raise ValueError(f"dropout_p={params.dropout_p} needs the call's rng tensor [seed, offset]")
    return BoxDropout(rng, params.dropout_p, q.shape[0], spatial, params.dilation, cls)


def forward(q, k, v, rpb, params: NAParams, rng=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, *spatial, H, D_v], lse [B, *spatial, H])``: undilated NA on every class of
    equally long dilation groups, the groups folded into the batch (backends/dilation_fold.py);
    ``rng`` ``[seed, offset]`` with attention dropout."""
    spatial, dil = tuple(q.shape[1 : 1 + params.na_dim]), params.dilation
    plain = undilated(params)
    out = q.new_empty(padded_shape(q, spatial, dil)[:-1] + (v.shape[-1],))
    lse = torch.empty(out.shape[:-1], dtype=lse_dtype(q.dtype), device=q.device)

    def run(cls, ins, views):
        _forward(*ins, rpb, plain, *views, cls.count, _dropout(rng, params, q, spatial, cls))

    out, lse = each_class(spatial, dil, [q, k, v], [out, lse], run)
    return out, lse


def backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params: NAParams, rng=None):
    """``(dq, dk, dv, drpb-or-None)`` from the saved LSE; ``grad_lse`` (may be None) is the
    gradient into the LSE output (d lse / d logits = probabilities); ``rng`` the forward's
    with dropout (delta = rowsum(dO * O) holds with the dropped O)."""
    spatial, dil = tuple(q.shape[1 : 1 + params.na_dim]), params.dilation
    plain = undilated(params)
    cd = compute_dtype(q.dtype)
    # rowsum(dO * O) as one product per query (no [.., D_v] temporary)
    delta = torch.einsum("...d,...d->...", grad_out.to(cd), out.to(cd))
    if grad_lse is not None:
        delta = delta - grad_lse.to(cd)
    grads = [x.new_empty(padded_shape(x, spatial, dil)) for x in (q, k, v)]
    # one more column: the masked scores' entry (their gradient is zero)
    drpb = None if rpb is None else torch.zeros(rpb.shape[0], rpb[0].numel() + 1, dtype=cd, device=q.device)

    def run(cls, ins, views):
        _backward(*ins[:3], rpb, *ins[3:], plain, drpb, views, cls.count, _dropout(rng, params, q, spatial, cls))

    dq, dk, dv = each_class(spatial, dil, [q, k, v, delta, lse, grad_out], grads, run)
    if drpb is not None:  # without the masked scores' column, contiguous as the op's fake result
        drpb = drpb[:, :-1].to(rpb.dtype).contiguous().view(rpb.shape)
    return dq, dk, dv, drpb


class TiledBackend(Backend):
    name = "tiled"
    supports_dropout = True  # the same keep mask as every backend (nattn/dropout.py)

    def na_not_supported_reasons(self, q, k, v, rpb, params, explicit):
        device = q.device.type
        if device == "meta":
            return ["tiled does not run meta tensors (the reference backend gives their shapes)"]
        if device != "cpu" and not explicit:
            return [f"tiled runs automatically on CPU tensors only, got {device} (backend='tiled' runs it there)"]
        return []

    def na_forward(self, q, k, v, rpb, params, rng=None):
        return forward(q, k, v, rpb, params, rng)

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params, rng=None):
        return backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params, rng)


register_backend(TiledBackend())
