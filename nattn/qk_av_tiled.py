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
from .params import NAParams


# The heads-first layout these products use: [B, H_kv, N, (G,) w]
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


def token_major(x: torch.Tensor) -> torch.Tensor:
    """``[B, H_kv, C, U, w]`` per-box key gradients -> ``[C * U, B, H_kv, w]``."""
    b, hk, c, u, w = x.shape
    return x.permute(2, 3, 0, 1, 4).reshape(c * u, b, hk, w)


class _Boxed:
    """One class's problem: heads-first copies and the boxes with their window slots."""

    def __init__(self, x, other, params: NAParams, heads: int, width_rows: int):
        self.batch, self.heads_kv = x.shape[0], other.shape[-2]
        self.groups = heads // self.heads_kv
        self.dtype = compute_dtype(x.dtype)
        lengths = tuple(x.shape[1 : 1 + params.na_dim])
        self.tokens = math.prod(lengths)
        self.boxes = boxes_for(lengths, params.kernel_size, params.stride, params.is_causal, self.groups, False,
                               x.device)
        self.per_box = self.batch * heads * self.boxes.rows * max(self.boxes.keys, width_rows)

    def first(self, x, groups=None):
        return heads_first(x, self.heads_kv, self.dtype, groups)

    def chunks(self):
        return self.boxes.chunks(self.per_box, slots=True)

    def pad(self, width):
        return torch.empty(self.batch, self.heads_kv, self.tokens + 1, self.groups, width, dtype=self.dtype,
                           device=self.boxes.device)

    def slots(self, slot, slot_ok):
        """The window slots ``[C, R, W]`` shaped against ``[B, H_kv, C, R, G, W]``."""
        c, r, w = slot.shape
        idx = slot.view(1, 1, c, r, 1, w).expand(self.batch, self.heads_kv, c, r, self.groups, w)
        return idx, slot_ok.view(1, 1, c, r, 1, w)

    def spread(self, weights, idx, keys):
        """Window-slot values ``[B, H_kv, C, R, G, W]`` onto the box's keys: ``[B, H_kv, C, R * G, U]``."""
        b, hk, c, r, g, _ = weights.shape
        out = weights.new_zeros(b, hk, c, r, g, keys)
        return out.scatter_add_(-1, idx, weights).view(b, hk, c, r * g, keys)


def _qk_forward(q, k, params: NAParams):
    heads, w = q.shape[-2], params.window_size
    out = q.new_empty(padded_shape(q, q.shape[1:-2], params.dilation)[:-1] + (w,))
    plain = undilated(params)

    def run(cls, ins, outs):
        count = cls.count
        qf, kf = ins
        pr = _Boxed(qf, kf, plain, heads, w)
        qh, kh = pr.first(qf, pr.groups), pr.first(kf)
        logits = pr.pad(w)
        for ch in pr.chunks():
            q_gather, q_scatter, k_idx, slot, slot_ok = ch.q_gather, ch.q_scatter, ch.k_idx, ch.slot, ch.slot_ok
            (c, r), u = q_gather.shape, k_idx.shape[1]
            qb = box_rows(qh, q_gather).flatten(3, 4)
            s = torch.matmul(qb, kh[:, :, k_idx].transpose(-1, -2)).view(pr.batch, pr.heads_kv, c, r, pr.groups, u)
            idx, ok = pr.slots(slot, slot_ok)
            picked = s.gather(-1, idx).masked_fill_(~ok, 0)
            logits.index_copy_(2, q_scatter.reshape(-1), picked.flatten(2, 3))
        store_heads_first(logits, outs[0], count)

    return each_class(q.shape[1:-2], params.dilation, [q, k], [out], run)[0]


def _qk_backward(q, k, grad, params: NAParams):
    heads = q.shape[-2]
    dq = q.new_empty(padded_shape(q, q.shape[1:-2], params.dilation))
    dk = k.new_empty(padded_shape(k, k.shape[1:-2], params.dilation))
    plain = undilated(params)

    def run(cls, ins, outs):
        count = cls.count
        qf, kf, gf = ins
        pr = _Boxed(qf, kf, plain, heads, params.window_size)
        qh, kh, gh = pr.first(qf, pr.groups), pr.first(kf), pr.first(gf, pr.groups)
        dq_pad = pr.pad(qf.shape[-1])
        dk_t = torch.zeros(pr.tokens, pr.batch, pr.heads_kv, kf.shape[-1], dtype=pr.dtype, device=qf.device)
        for ch in pr.chunks():
            q_gather, q_scatter, k_idx, slot, slot_ok = ch.q_gather, ch.q_scatter, ch.k_idx, ch.slot, ch.slot_ok
            (c, r), u = q_gather.shape, k_idx.shape[1]
            idx, ok = pr.slots(slot, slot_ok)
            ds = pr.spread(box_rows(gh, q_gather).masked_fill_(~ok, 0), idx, u)  # d scores
            kb = kh[:, :, k_idx]
            dq_pad.index_copy_(2, q_scatter.reshape(-1), torch.matmul(ds, kb).view(*dq_pad.shape[:2], c * r,
                                                                                   pr.groups, -1))
            qb = box_rows(qh, q_gather).flatten(3, 4)
            dk_t.index_add_(0, k_idx.reshape(-1), token_major(torch.matmul(ds.transpose(-1, -2), qb)))
        store_heads_first(dq_pad, outs[0], count)
        store_heads_first(dk_t.permute(1, 2, 0, 3)[:, :, :, None], outs[1], count)

    return each_class(q.shape[1:-2], params.dilation, [q, k, grad], [dq, dk], run)


def _av_forward(a, v, params: NAParams):
    heads = a.shape[-2]
    out = v.new_empty(padded_shape(a, a.shape[1:-2], params.dilation)[:-1] + (v.shape[-1],))
    plain = undilated(params)

    def run(cls, ins, outs):
        count = cls.count
        af, vf = ins
        pr = _Boxed(vf, vf, plain, heads, params.window_size)
        ah, vh = pr.first(af, pr.groups), pr.first(vf)
        o_pad = pr.pad(vf.shape[-1])
        for ch in pr.chunks():
            q_gather, q_scatter, k_idx, slot, slot_ok = ch.q_gather, ch.q_scatter, ch.k_idx, ch.slot, ch.slot_ok
            (c, r), u = q_gather.shape, k_idx.shape[1]
            idx, ok = pr.slots(slot, slot_ok)
            p = pr.spread(box_rows(ah, q_gather).masked_fill_(~ok, 0), idx, u)
            o = torch.matmul(p, vh[:, :, k_idx])
            o_pad.index_copy_(2, q_scatter.reshape(-1), o.view(*o_pad.shape[:2], c * r, pr.groups, -1))
        store_heads_first(o_pad, outs[0], count)

    return each_class(a.shape[1:-2], params.dilation, [a, v], [out], run)[0]


def _av_backward(a, v, grad, params: NAParams):
    heads, w = a.shape[-2], params.window_size
    da = a.new_empty(padded_shape(a, a.shape[1:-2], params.dilation))
    dv = v.new_empty(padded_shape(v, v.shape[1:-2], params.dilation))
    plain = undilated(params)

    def run(cls, ins, outs):
        count = cls.count
        af, vf, gf = ins
        pr = _Boxed(vf, vf, plain, heads, w)
        ah, vh, gh = pr.first(af, pr.groups), pr.first(vf), pr.first(gf, pr.groups)
        da_pad = pr.pad(w)
        dv_t = torch.zeros(pr.tokens, pr.batch, pr.heads_kv, vf.shape[-1], dtype=pr.dtype, device=vf.device)
        for ch in pr.chunks():
            q_gather, q_scatter, k_idx, slot, slot_ok = ch.q_gather, ch.q_scatter, ch.k_idx, ch.slot, ch.slot_ok
            (c, r), u = q_gather.shape, k_idx.shape[1]
            idx, ok = pr.slots(slot, slot_ok)
            vb = vh[:, :, k_idx]
            gb = box_rows(gh, q_gather).flatten(3, 4)
            dp = torch.matmul(gb, vb.transpose(-1, -2)).view(pr.batch, pr.heads_kv, c, r, pr.groups, u)
            da_pad.index_copy_(2, q_scatter.reshape(-1), dp.gather(-1, idx).masked_fill_(~ok, 0).flatten(2, 3))
            p = pr.spread(box_rows(ah, q_gather).masked_fill_(~ok, 0), idx, u)
            dv_t.index_add_(0, k_idx.reshape(-1), token_major(torch.matmul(p.transpose(-1, -2), gb)))
        store_heads_first(da_pad, outs[0], count)
        store_heads_first(dv_t.permute(1, 2, 0, 3)[:, :, :, None], outs[1], count)

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
