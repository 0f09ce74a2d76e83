"""The unfused QK and AV products (nattn/qk_av.py) on the tiled backend's boxes: what CPU
tensors run.

A box of queries multiplies the one range of keys their windows span (backends/tiled.py),
and each query's window slots are picked out of (QK) or spread into (AV) that range: the
products run as matrix products instead of gathering every query's window, 5-20x faster
on a CPU. Dilation groups fold into the batch as in the fused backend. Math in float32
(float64 for float64 inputs), results in the input dtype; slots a causal window does not
hold give 0 (QK) and are ignored (AV), as nattn/qk_av_math.py's functions.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .backends.dilation_fold import each_class, padded_shape, undilated
from .backends.reference_math import compute_dtype
from .backends.tiled_plan import boxes_for
from .backends.tiled_rows import TokenRows, each_head, heads_first, store, token_rows
from .params import NAParams


class _Boxed(TokenRows):
    """One class's problem: the boxes with their window slots, rows in the compute dtype."""

    def __init__(self, x, other, params: NAParams, heads: int, width_rows: int):
        super().__init__(x.shape[0], compute_dtype(x.dtype), x.device)
        self.heads, self.heads_kv = heads, other.shape[-2]
        self.groups = heads // self.heads_kv
        lengths = tuple(x.shape[1 : 1 + params.na_dim])
        self.tokens = math.prod(lengths)
        self.boxes = boxes_for(lengths, params.kernel_size, params.stride, params.is_causal, False, x.device)
        self.per_box = self.batch * heads * self.boxes.rows * max(self.boxes.keys, width_rows)

    def chunks(self):
        return self.boxes.chunks(self.per_box, slots=True)

    def slots(self, ch):
        """The chunk's window slots against ``[H, B, C, R, U]`` scores: (index, holds a key)."""
        c, r, w = ch.slot.shape
        return ch.slot.view(1, 1, c, r, w).expand(self.heads, self.batch, c, r, w), ch.slot_ok.view(1, 1, c, r, w)

    def window_rows(self, name, x, idx, ok):
        """Per-query window values ``x [B, N, H * W]`` at the rows ``idx [C, R]``, 0 in slots
        without a key: ``[H, B, C, R, W]``."""
        (c, r), b = idx.shape, self.batch
        rows = self.rows(name, x, idx, self.heads).view(b, c, r, self.heads, -1).permute(3, 0, 1, 2, 4)
        return rows.masked_fill_(~ok, 0)

    def spread(self, weights, idx, keys):
        """Window-slot values ``[H, B, C, R, W]`` onto the box's keys: ``[H, B * C, R, U]``."""
        h, b, c, r, _ = weights.shape
        out = self.new("spread", h, b, c, r, keys).zero_()
        return out.scatter_add_(-1, idx, weights).view(h, b * c, r, keys)

    def pick(self, scores, idx, ok):
        """Each query's window slots out of ``scores [H, B * C, R, U]`` (0 in slots without a
        key): ``[H, B * C, R, W]``."""
        h, bc, r, u = scores.shape
        w = idx.shape[-1]
        out = self.new("picked", h, self.batch, bc // self.batch, r, w)
        torch.gather(scores.view(h, self.batch, -1, r, u), -1, idx, out=out)
        return out.masked_fill_(~ok, 0).view(h, bc, r, w)


def _qk_forward(q, k, params: NAParams):
    heads, w = q.shape[-2], params.window_size
    out = q.new_empty(padded_shape(q, q.shape[1:-2], params.dilation)[:-1] + (w,))
    plain = undilated(params)

    def run(cls, ins, outs):
        qf, kf = ins
        pr = _Boxed(qf, kf, plain, heads, w)
        h, hk, g = pr.heads, pr.heads_kv, pr.groups
        q_rows, k_rows = token_rows(qf, pr.dtype), token_rows(kf, pr.dtype)
        logits = pr.new("logits", pr.batch, pr.tokens + 1, h, w)
        for ch in pr.chunks():
            (c, r), u = ch.q_gather.shape, ch.k_idx.shape[1]
            qb, kb = pr.rows("qb", q_rows, ch.q_gather, h), pr.rows("kb", k_rows, ch.k_idx, hk)
            s = pr.new("s", h, pr.batch * c, r, u)
            each_head(s, heads_first(qb), heads_first(kb, True), g)
            pr.scatter_rows(logits, ch.q_scatter, pr.pick(s, *pr.slots(ch)))
        store(logits, outs[0], cls.count)

    return each_class(q.shape[1:-2], params.dilation, [q, k], [out], run)[0]


def _qk_backward(q, k, grad, params: NAParams):
    heads = q.shape[-2]
    dq = q.new_empty(padded_shape(q, q.shape[1:-2], params.dilation))
    dk = k.new_empty(padded_shape(k, k.shape[1:-2], params.dilation))
    plain = undilated(params)

    def run(cls, ins, outs):
        qf, kf, gf = ins
        pr = _Boxed(qf, kf, plain, heads, params.window_size)
        h, hk, g, d = pr.heads, pr.heads_kv, pr.groups, qf.shape[-1]
        q_rows, k_rows, g_rows = (token_rows(x, pr.dtype) for x in (qf, kf, gf))
        dq_pad = pr.new("dq_pad", pr.batch, pr.tokens + 1, h, d)
        dk_acc = pr.new("dk_acc", pr.tokens, pr.batch, hk * d).zero_()
        for ch in pr.chunks():
            (c, r), u = ch.q_gather.shape, ch.k_idx.shape[1]
            idx, ok = pr.slots(ch)
            ds = pr.spread(pr.window_rows("gb", g_rows, ch.q_gather, ok), idx, u)  # d scores
            qb, kb = pr.rows("qb", q_rows, ch.q_gather, h), pr.rows("kb", k_rows, ch.k_idx, hk)
            dqb = pr.new("dq", h, pr.batch * c, r, d)
            each_head(dqb, ds, heads_first(kb), g)
            pr.scatter_rows(dq_pad, ch.q_scatter, dqb)
            pr.add_key_products(dk_acc, ds.transpose(2, 3), heads_first(qb), ch.k_idx, g)
        store(dq_pad, outs[0], cls.count)
        pr.store_token_major(dk_acc, outs[1], cls.count)

    return each_class(q.shape[1:-2], params.dilation, [q, k, grad], [dq, dk], run)


def _av_forward(a, v, params: NAParams):
    heads = a.shape[-2]
    out = v.new_empty(padded_shape(a, a.shape[1:-2], params.dilation)[:-1] + (v.shape[-1],))
    plain = undilated(params)

    def run(cls, ins, outs):
        af, vf = ins
        pr = _Boxed(vf, vf, plain, heads, params.window_size)
        h, hk, g, dv = pr.heads, pr.heads_kv, pr.groups, vf.shape[-1]
        a_rows, v_rows = token_rows(af, pr.dtype), token_rows(vf, pr.dtype)
        o_pad = pr.new("o_pad", pr.batch, pr.tokens + 1, h, dv)
        for ch in pr.chunks():
            (c, r), u = ch.q_gather.shape, ch.k_idx.shape[1]
            idx, ok = pr.slots(ch)
            p = pr.spread(pr.window_rows("ab", a_rows, ch.q_gather, ok), idx, u)
            vb = pr.rows("vb", v_rows, ch.k_idx, hk)
            o = pr.new("o", h, pr.batch * c, r, dv)
            each_head(o, p, heads_first(vb), g)
            pr.scatter_rows(o_pad, ch.q_scatter, o)
        store(o_pad, outs[0], cls.count)

    return each_class(a.shape[1:-2], params.dilation, [a, v], [out], run)[0]


def _av_backward(a, v, grad, params: NAParams):
    heads, w = a.shape[-2], params.window_size
    da = a.new_empty(padded_shape(a, a.shape[1:-2], params.dilation))
    dv = v.new_empty(padded_shape(v, v.shape[1:-2], params.dilation))
    plain = undilated(params)

    def run(cls, ins, outs):
        af, vf, gf = ins
        pr = _Boxed(vf, vf, plain, heads, w)
        h, hk, g, d_v = pr.heads, pr.heads_kv, pr.groups, vf.shape[-1]
        a_rows, v_rows, g_rows = (token_rows(x, pr.dtype) for x in (af, vf, gf))
        da_pad = pr.new("da_pad", pr.batch, pr.tokens + 1, h, w)
        dv_acc = pr.new("dv_acc", pr.tokens, pr.batch, hk * d_v).zero_()
        for ch in pr.chunks():
            (c, r), u = ch.q_gather.shape, ch.k_idx.shape[1]
            idx, ok = pr.slots(ch)
            gb, vb = pr.rows("gb", g_rows, ch.q_gather, h), pr.rows("vb", v_rows, ch.k_idx, hk)
            dp = pr.new("s", h, pr.batch * c, r, u)
            each_head(dp, heads_first(gb), heads_first(vb, True), g)
            pr.scatter_rows(da_pad, ch.q_scatter, pr.pick(dp, idx, ok))
            p = pr.spread(pr.window_rows("ab", a_rows, ch.q_gather, ok), idx, u)
            pr.add_key_products(dv_acc, p.transpose(2, 3), heads_first(gb), ch.k_idx, g)
        store(da_pad, outs[0], cls.count)
        pr.store_token_major(dv_acc, outs[1], cls.count)

    return each_class(a.shape[1:-2], params.dilation, [a, v, grad], [da, dv], run)


def _product(name: str, doc: str, forward, backward):
    """An autograd Function ``(x, y, params) -> forward(x, y, params)`` whose backward is
    ``backward(x, y, grad, params) -> (dx, dy)`` (first derivatives)."""

    def fwd(ctx, x, y, params: NAParams):
        ctx.save_for_backward(x, y)
        ctx.params = params
        return forward(x, y, params)

    @once_differentiable
    def bwd(ctx, grad):
        x, y = ctx.saved_tensors
        return (*backward(x, y, grad, ctx.params), None)

    return type(name, (torch.autograd.Function,), {"__doc__": doc, "forward": staticmethod(fwd),
                                                    "backward": staticmethod(bwd)})


TiledQK = _product("TiledQK", """``q [B, *spatial, H, D]``, ``k [B, *spatial, H_kv, D]`` -> ``[B, *spatial, H, W]``
    (0 in the slots a causal window does not hold).""", _qk_forward, _qk_backward)
TiledAV = _product("TiledAV", """``a [B, *spatial, H, W]``, ``v [B, *spatial, H_kv, D_v]`` -> ``[B, *spatial, H, D_v]``
    (slots a causal window does not hold ignored, whatever ``a`` holds there).""", _av_forward, _av_backward)
