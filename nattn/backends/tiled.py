"""The tiled backend: NA as dense products over boxes of queries, in plain PyTorch.

The reference backend gathers every query's own window and multiplies it vector by vector;
this one cuts the queries into boxes (backends/tiled_plan.py), multiplies each box's
queries with the one range of keys their windows span (matrix products), and masks the
scores outside each query's window before the softmax. It computes more scores than the
windows hold (``prod(U)`` per query, see tiled_plan) and wins by doing them in matrix
products: on a CPU it runs NA several times faster than the reference.

Tensors are token rows and the products run per head on strided views
(backends/tiled_rows.py); the probabilities come from ``torch.softmax``, the LSE from their
largest value. Automatic dispatch runs it on CPU tensors (``backend="tiled"`` runs it on any
device). Same numbers as the reference: float32 math (float64 for float64 inputs), outputs
in the input dtype, LSE in float32 (float64); an explicit backward, recomputing the
probabilities, whose key, value and bias gradients are summed back with ``index_add_``
(deterministic on the CPU). Memory is bounded by the chunk of boxes plus the problem's own
size, never N x N; temporaries live in per-thread scratch buffers (backends/scratch.py).
Attention dropout draws the reference's keep mask (backends/tiled_dropout.py).
"""

from __future__ import annotations

from typing import Tuple

import torch

from ..params import NAParams
from . import register_backend
from .base import Backend
from .dilation_fold import each_class, padded_shape, undilated
from .reference_math import compute_dtype, lse_dtype
from .tiled_dropout import BoxDropout
from .tiled_plan import Boxes, boxes_for
from .tiled_rows import TokenRows, each_head, heads_first, store, token_rows


class _Problem(TokenRows):
    """An undilated problem's tensors as token rows (backends/tiled_rows.py) in the compute
    dtype, the scale in the gathered query rows (scores come out scaled; dK = dS^T (scale q)
    needs none)."""

    def __init__(self, q, k, v, params: NAParams, boxes: Boxes):
        super().__init__(q.shape[0], compute_dtype(q.dtype), q.device)
        self.heads, self.dim = q.shape[-2], q.shape[-1]
        self.heads_kv, self.dim_v = k.shape[-2], v.shape[-1]
        self.groups = self.heads // self.heads_kv
        self.q = token_rows(q, self.dtype)
        self.scale = params.scale
        self.k = token_rows(k, self.dtype)
        self.v = token_rows(v, self.dtype)
        self.boxes = boxes

    def queries(self, idx):
        """The scaled query rows at ``idx``: ``[B * C, R, H, D]``."""
        return self.rows("qb", self.q, idx, self.heads).mul_(self.scale)

    def scores(self, qb, kb, ch, table):
        """Masked scaled logits ``[H, B * C, R, U]`` of the boxes' queries ``qb [B * C, R, H,
        D]`` and keys ``kb [B * C, U, H_kv, D]`` of chunk ``ch``: its additive mask, or with a
        bias ``table`` (``_bias_table``: a row of -inf appended) the bias of each box's
        pattern, the masked scores' entry being that row: the bias then masks too."""
        bc, r, u, g = qb.shape[0], qb.shape[1], kb.shape[1], self.groups
        s = self.new("s", self.heads, bc, r, u)
        each_head(s, heads_first(qb), heads_first(kb, True), g)
        per_box = s.view(self.heads, self.batch, bc // self.batch, r, u)
        if table is None:
            per_box.add_(ch.mask)
        else:  # the patterns' bias (few), then each box's rows of it (whole rows: fast)
            patterns = table.index_select(0, ch.rpb_idx.reshape(-1)).t().reshape(self.heads, -1, r * u)
            bias = patterns.index_select(1, ch.rpb_box).view(self.heads, 1, -1, r, u)
            per_box.add_(bias)
        return s

    def add_bias_gradient(self, drpb, ds, ch) -> None:
        """The logits' gradient ``ds [H, B * C, R, U]`` summed into ``drpb [H, table + 1]``:
        per box pattern first (one index_add_ of whole rows), then onto the table."""
        h, bc, r, u = ds.shape
        per_box = ds.view(h, self.batch, -1, r * u)
        per_box = per_box[:, 0] if self.batch == 1 else per_box.sum(1)
        per_pattern = ds.new_zeros(h, ch.rpb_idx.shape[0], r * u).index_add_(1, ch.rpb_box, per_box)
        drpb.index_add_(1, ch.rpb_idx.reshape(-1), per_pattern.view(h, -1))

    def softmax(self, s):
        """The scores' probabilities (torch's softmax, not exp(s - logsumexp(s)): torch.exp
        runs 3-10x slower on the tiny and -inf results most of a box's scores give, CPU)."""
        return torch._softmax(s, -1, False, out=self.new("p", *s.shape))

    def per_query_head(self, rows, idx):
        """``rows [B, N, H]`` (one value per query and head) at ``idx [C, R]`` -> ``[H, B * C,
        R, 1]``, against the scores."""
        c, r = idx.shape
        return rows.index_select(1, idx.reshape(-1)).permute(2, 0, 1).reshape(self.heads, -1, r, 1)


def _boxes(q, params: NAParams, rpb) -> Boxes:
    return boxes_for(tuple(q.shape[1 : 1 + params.na_dim]), params.kernel_size, params.stride, params.is_causal,
                     rpb is not None, q.device)


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


def _forward(q, k, v, rpb, params: NAParams, out, lse, count, drop):
    """Undilated NA on a class of dilation groups (``q`` etc. folded), written into its views
    of ``out`` and ``lse`` (``count`` groups per axis); ``drop`` its dropout or None."""
    pr = _Problem(q, k, v, params, _boxes(q, params, rpb))
    table = _bias_table(rpb, pr.dtype)
    b, h, hk, g, n, dv = pr.batch, pr.heads, pr.heads_kv, pr.groups, pr.boxes.tokens, pr.dim_v
    o_pad = pr.new("o_pad", b, n + 1, h, dv)  # padded query rows land on the spare token N
    l_pad = pr.new("l_pad", b, n + 1, h)
    for ch in pr.boxes.chunks(_scores_per_box(pr, drop)):
        (c, r), rows = ch.q_gather.shape, ch.q_scatter.reshape(-1)
        s = pr.scores(pr.queries(ch.q_gather), pr.rows("kb", pr.k, ch.k_idx, hk), ch, table)
        p = pr.softmax(s)
        lse_c = s.amax(-1, keepdim=True).sub_(p.amax(-1, keepdim=True).log_())  # exp(max - lse) = max p
        l_pad.index_copy_(1, rows, lse_c.view(h, b, c * r).permute(1, 2, 0))
        if drop is not None:  # the dropped weights meet V; the LSE stays the undropped one
            p.view(h, b, c, r, -1).mul_(drop.factor(ch.q_gather, ch.k_idx, h, p.dtype))
        vb = pr.rows("vb", pr.v, ch.k_idx, hk)
        o = pr.new("o", h, b * c, r, dv)
        each_head(o, p, heads_first(vb), g)
        pr.scatter_rows(o_pad, ch.q_scatter, o)
    store(o_pad, out, count)
    store(l_pad, lse, count)


def _backward(q, k, v, rpb, delta, grad_out, params: NAParams, drpb, grads, count, drop):
    """Undilated NA backward on a class of dilation groups: dq, dk, dv into its views
    ``grads``; the bias gradient added into ``drpb`` (``[H, table + 1]``, or None). ``delta``
    is rowsum(dO * O) minus the LSE's gradient, ``[B, *grid, H]``."""
    pr = _Problem(q, k, v, params, _boxes(q, params, rpb))
    table = _bias_table(rpb, pr.dtype)
    b, h, hk, g, n = pr.batch, pr.heads, pr.heads_kv, pr.groups, pr.boxes.tokens
    d, dv = pr.dim, pr.dim_v
    d_out = token_rows(grad_out, pr.dtype)
    delta = delta.reshape(b, n, h).to(pr.dtype)
    dq_pad = pr.new("dq_pad", b, n + 1, h, d)
    dk_acc = pr.new("dk_acc", n, b, hk * d).zero_()
    dv_acc = pr.new("dv_acc", n, b, hk * dv).zero_()
    for ch in pr.boxes.chunks(_scores_per_box(pr, drop)):
        (c, r), u = ch.q_gather.shape, ch.k_idx.shape[1]
        qb, dob = pr.queries(ch.q_gather), pr.rows("dob", d_out, ch.q_gather, h)
        kb, vb = pr.rows("kb", pr.k, ch.k_idx, hk), pr.rows("vb", pr.v, ch.k_idx, hk)
        p = pr.softmax(pr.scores(qb, kb, ch, table))  # the forward's probabilities
        if ch.row_ok is not None:  # padded rows (all keys unmasked there) take no part
            p.view(h, b, c, r, u).mul_(ch.row_ok)
        ds = pr.new("s", h, b * c, r, u)  # dP, then the logits' gradient in place (the scores' buffer)
        each_head(ds, heads_first(dob), heads_first(vb, True), g)
        kept = p
        if drop is not None:  # dP and the weights that met dO carry the forward's mask
            factor = drop.factor(ch.q_gather, ch.k_idx, h, p.dtype).view(p.shape)
            ds.mul_(factor)
            kept = torch.mul(p, factor, out=pr.new("kept", *p.shape))
        ds.sub_(pr.per_query_head(delta, ch.q_gather)).mul_(p)
        dq = pr.new("dq", h, b * c, r, d)
        each_head(dq, ds, heads_first(kb), g)
        dq.mul_(params.scale)  # (the logits' scale is in q: dK needs none)
        pr.scatter_rows(dq_pad, ch.q_scatter, dq)
        pr.add_key_products(dk_acc, ds.transpose(2, 3), heads_first(qb), ch.k_idx, g)
        pr.add_key_products(dv_acc, kept.transpose(2, 3), heads_first(dob), ch.k_idx, g)
        if drpb is not None:
            pr.add_bias_gradient(drpb, ds, ch)
    dq, dk, dv_out = grads
    store(dq_pad, dq, count)
    pr.store_token_major(dk_acc, dk, count)
    pr.store_token_major(dv_acc, dv_out, count)


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

    # (the saved LSE is not needed: the backward recomputes the probabilities with softmax)
    dq, dk, dv = each_class(spatial, dil, [q, k, v, delta, grad_out], grads, run)
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
