"""Reference NA math in plain PyTorch: gather each query's window, chunk by chunk.

Written to be read: forward is softmax(q K_w^T * scale + bias) V_w over the window
``K_w`` of each query; backward is the textbook attention backward on the same gathered
windows, with the key/value/bias gradients scattered back through ``index_add_``.
With attention dropout (``params.dropout_p > 0``, the call's ``rng`` tensor) the
probabilities are multiplied by the keep mask of nattn/dropout.py over ``1 - p`` where they
meet V only: the LSE is the one without dropout, the backward masks dP the same way, and
``delta = rowsum(dO * O)`` holds with the dropped O (docs/semantics.md).
Memory is bounded by the chunk size, never by N x N. Computes in float32 (float64 for
float64 inputs) and returns outputs in the input dtype; LSE is float32 (float64 for
float64 inputs, which the tests use as the exact oracle).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import dropout
from ..params import NAParams
from ..windows import WindowTable

# Elements of gathered keys/values + logits held per chunk (~16 MiB in float32).
CHUNK_ELEMENTS = 1 << 22


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def softmax_shift(lse: torch.Tensor) -> torch.Tensor:
    """The LSE to subtract from the logits: 0 where it is -inf (no finite logit, no key).

    Such a query gets zero probabilities, hence output 0 with LSE -inf and zero gradients,
    instead of ``exp(-inf - -inf) = NaN``.
    """
    return lse.masked_fill(lse == float("-inf"), 0)


def softmax_or_zero(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Differentiable softmax whose rows without a finite logit are 0 (not NaN), with
    finite gradients there (``torch.softmax`` gives NaN for an all ``-inf`` row)."""
    top = softmax_shift(s.detach().amax(dim, keepdim=True))
    e = torch.exp(s - top)
    total = e.sum(dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def _chunk_len(batch, window, heads, heads_kv, dim, dim_v, with_dropout=False) -> int:
    per_weight = 3 + (dropout.ELEMENTS_PER_WEIGHT if with_dropout else 0)  # logits, probs, grads (+ mask)
    per_query = batch * window * (heads_kv * (dim + dim_v) * 2 + heads * per_weight)
    return max(1, CHUNK_ELEMENTS // per_query)


class _Problem:
    """Flattened views shared by forward and backward: tokens on dim 1, heads split for GQA."""

    def __init__(self, q, k, v, params: NAParams):
        self.params = params
        na_dim = params.na_dim
        self.spatial = tuple(q.shape[1 : 1 + na_dim])
        self.batch, self.heads, self.dim = q.shape[0], q.shape[-2], q.shape[-1]
        self.heads_kv, self.dim_v = k.shape[-2], v.shape[-1]
        self.groups = self.heads // self.heads_kv
        self.dtype = compute_dtype(q.dtype)
        b, hk, g = self.batch, self.heads_kv, self.groups
        self.q = q.reshape(b, -1, hk, g, self.dim).to(self.dtype)
        self.k = k.reshape(b, -1, hk, self.dim).to(self.dtype)
        self.v = v.reshape(b, -1, hk, self.dim_v).to(self.dtype)
        self.table = WindowTable(
            self.spatial, params.kernel_size, params.stride, params.dilation,
            params.is_causal, device=q.device,
        )
        self.tokens = self.table.num_tokens
        # Only causal windows near the start hold fewer than k keys (invalid slots).
        self.has_invalid_slots = any(params.is_causal)
        self.chunk = _chunk_len(
            b, self.table.window_size, self.heads, hk, self.dim, self.dim_v, params.dropout_p > 0
        )

    def chunks(self):
        for start in range(0, self.tokens, self.chunk):
            stop = min(start + self.chunk, self.tokens)
            yield (start, stop) + self.table.chunk(start, stop)

    def select(self, x, valid):
        """``x [B, C, W, ...]`` with invalid window slots set to 0 (``torch.where``, not a product)."""
        if not self.has_invalid_slots:
            return x
        return torch.where(valid.reshape(1, *valid.shape, *(1,) * (x.dim() - 3)), x, 0)

    def logits(self, start, stop, key_idx, valid, rpb_idx, rpb):
        """Masked logits ``[B, C, H_kv, G, W]`` and the gathered keys/values.

        Invalid slots gather a real token (clamped index); they are zeroed by selection,
        so that a NaN/Inf there cannot reach the query through ``0 * NaN``.
        """
        k_w = self.select(self.k[:, key_idx], valid)  # [B, C, W, H_kv, D]
        v_w = self.select(self.v[:, key_idx], valid)  # [B, C, W, H_kv, D_v]
        q_c = self.q[:, start:stop]  # [B, C, H_kv, G, D]
        s = torch.einsum("bchgd,bcwhd->bchgw", q_c, k_w) * self.params.scale
        if rpb is not None:
            bias = rpb.to(self.dtype).flatten(1)[:, rpb_idx]  # [H, C, W]
            bias = bias.reshape(self.heads_kv, self.groups, *bias.shape[1:])
            s = s + bias.permute(2, 0, 1, 3)[None]
        s = s.masked_fill(~valid[None, :, None, None, :], float("-inf"))
        return s, q_c, k_w, v_w

    def dropout_factor(self, start, stop, key_idx, rng):
        """``[B, C, H_kv, G, W]``: the keep mask over ``1 - p`` of queries ``start..stop-1`` at
        their window slots (an invalid slot's clamped key gets a factor too; its probability
        is 0)."""
        queries = torch.arange(start, stop, device=key_idx.device)
        return dropout.weight_factor(rng, self.params.dropout_p, self.batch, self.heads_kv, self.groups,
                                     queries, key_idx, self.dtype)


def _dropout_rng(params: NAParams, rng):
    """The call's rng tensor when it has dropout (None without), or an error when it is missing."""
    if params.dropout_p == 0:
        return None
    if rng is None:
        raise ValueError(f"dropout_p={params.dropout_p} needs the call's rng tensor [seed, offset]")
    return rng


def forward(q, k, v, rpb: Optional[torch.Tensor], params: NAParams,
            rng: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """NA forward: ``(out [B, *spatial, H, D_v], lse [B, *spatial, H])``; ``rng`` ``[seed,
    offset]`` with dropout (``params.dropout_p > 0``)."""
    rng = _dropout_rng(params, rng)
    p = _Problem(q, k, v, params)
    out = torch.empty(p.batch, p.tokens, p.heads_kv, p.groups, p.dim_v, dtype=p.dtype, device=q.device)
    lse = torch.empty(p.batch, p.tokens, p.heads_kv, p.groups, dtype=p.dtype, device=q.device)
    for start, stop, key_idx, valid, rpb_idx in p.chunks():
        s, _, _, v_w = p.logits(start, stop, key_idx, valid, rpb_idx, rpb)
        lse_c = torch.logsumexp(s, dim=-1)
        probs = torch.exp(s - softmax_shift(lse_c)[..., None])
        if rng is not None:  # dropout: the dropped weights meet V; the LSE stays unmasked
            probs = probs * p.dropout_factor(start, stop, key_idx, rng)
        out[:, start:stop] = torch.einsum("bchgw,bcwhe->bchge", probs, v_w)
        lse[:, start:stop] = lse_c
    out = out.reshape(p.batch, *p.spatial, p.heads, p.dim_v).to(q.dtype)
    lse = lse.reshape(p.batch, *p.spatial, p.heads).to(lse_dtype(q.dtype))
    return out, lse


def backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params: NAParams, rng: Optional[torch.Tensor] = None):
    """NA backward from the saved LSE: ``(dq, dk, dv, drpb-or-None)``.

    ``grad_lse`` (may be None) is the gradient flowing into the LSE output, as when
    the LSE feeds a merge with extra keys/values: d lse / d logits = probs. With dropout
    ``rng`` is the forward's: the same mask multiplies dP and the probabilities that meet dO.
    """
    rng = _dropout_rng(params, rng)
    p = _Problem(q, k, v, params)
    b, hk, g = p.batch, p.heads_kv, p.groups
    d_out = grad_out.reshape(b, -1, hk, g, p.dim_v).to(p.dtype)
    o = out.reshape(b, -1, hk, g, p.dim_v).to(p.dtype)
    lse_f = softmax_shift(lse.reshape(b, -1, hk, g).to(p.dtype))
    delta = (d_out * o).sum(-1)  # rowsum(dO * O) = sum_w P * dP
    if grad_lse is not None:
        delta = delta - grad_lse.reshape(b, -1, hk, g).to(p.dtype)
    dq = torch.zeros_like(p.q)
    dk = torch.zeros_like(p.k)
    dv = torch.zeros_like(p.v)
    drpb = torch.zeros(rpb.shape, dtype=p.dtype, device=q.device).flatten(1) if rpb is not None else None
    for start, stop, key_idx, valid, rpb_idx in p.chunks():
        s, q_c, k_w, v_w = p.logits(start, stop, key_idx, valid, rpb_idx, rpb)
        probs = torch.exp(s - lse_f[:, start:stop, ..., None])
        do_c = d_out[:, start:stop]
        dp = torch.einsum("bchge,bcwhe->bchgw", do_c, v_w)
        kept = probs
        if rng is not None:
            factor = p.dropout_factor(start, stop, key_idx, rng)
            dp = dp * factor
            kept = probs * factor
        ds = probs * (dp - delta[:, start:stop, ..., None])  # d logits
        dq[:, start:stop] = torch.einsum("bchgw,bcwhd->bchgd", ds, k_w) * params.scale
        flat_idx = key_idx.reshape(-1)
        dk_w = p.select(torch.einsum("bchgw,bchgd->bcwhd", ds, q_c) * params.scale, valid)
        dv_w = p.select(torch.einsum("bchgw,bchge->bcwhe", kept, do_c), valid)
        dk.index_add_(1, flat_idx, dk_w.reshape(b, -1, hk, p.dim))
        dv.index_add_(1, flat_idx, dv_w.reshape(b, -1, hk, p.dim_v))
        if drpb is not None:
            ds_h = ds.sum(0).permute(1, 2, 0, 3).reshape(p.heads, -1)  # [H, C * W]
            drpb.index_add_(1, rpb_idx.reshape(-1), ds_h)
    dq = dq.reshape(q.shape).to(q.dtype)
    dk = dk.reshape(k.shape).to(k.dtype)
    dv = dv.reshape(v.shape).to(v.dtype)
    if drpb is not None:
        drpb = drpb.reshape(rpb.shape).to(rpb.dtype)
    return dq, dk, dv, drpb
