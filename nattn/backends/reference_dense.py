"""Reference dense attention with LSE, chunked over queries (never Nq x Nk at once).

Used by :func:`nattn.attention` and for the additional keys/values of NA, whose
partial result is merged through the LSE.

Causal chunks keep out-of-window keys out by selection, never by a zero probability
times a value (``0 * NaN = NaN``): a chunk of queries ``[start, stop)`` reads no key at or
past ``stop``; keys before ``start`` are seen by every query of the chunk (plain matmul);
the diagonal block ``[start, stop)`` goes through :func:`_masked_mix`, which zeroes each
query's out-of-window rows with ``torch.where`` before multiplying.

Attention dropout (``dropout_p > 0`` with the call's ``rng``) masks the probabilities where
they meet V and dP in the backward, as reference_math.py does for NA; query ``i`` and key
``j`` are elements ``(i, key_offset + j)`` of nattn/dropout.py's mask (an NA call's extra keys
pass the number of spatial tokens as ``key_offset``).
"""

from __future__ import annotations

import math

import torch

from .. import dropout
from .reference_math import CHUNK_ELEMENTS, compute_dtype, lse_dtype, softmax_shift

# Queries per causal chunk. Small, so the diagonal block (selection, batched tiny matmuls)
# stays cheap: on the 2-core CPU, N=6144, H=4, D=32, one thread, fwd+bwd took 2.2 s at 16,
# 2.9 s at 48, and 4.1 s before causal chunks skipped their future keys.
CAUSAL_CHUNK = 16


def _split(q, k, v, is_causal, with_dropout=False):
    b, nq, h, d = q.shape
    hk = k.shape[2]
    dt = compute_dtype(q.dtype)
    per_weight = 3 + (dropout.ELEMENTS_PER_WEIGHT if with_dropout else 0)
    chunk = max(1, CHUNK_ELEMENTS // (b * k.shape[1] * h * per_weight))
    if is_causal:  # the diagonal block materializes [B, C, H, C, max(D, D_v)]
        chunk = min(chunk, CAUSAL_CHUNK, max(1, math.isqrt(CHUNK_ELEMENTS // (b * h * max(d, v.shape[-1])))))
    return q.reshape(b, nq, hk, h // hk, d).to(dt), k.to(dt), v.to(dt), chunk


def _future(start, stop, device):
    """``[C, C]``: True where query ``start + i`` must not see key ``start + j`` (j > i)."""
    return torch.ones(stop - start, stop - start, dtype=torch.bool, device=device).triu(1)


def _logits(q_c, k, scale, start, causal):
    s = torch.einsum("bchgd,bnhd->bchgn", q_c, k) * scale
    if causal:  # k holds keys [0, stop): only the diagonal block has future keys
        stop = start + q_c.shape[1]
        hidden = torch.zeros(stop - start, k.shape[1], dtype=torch.bool, device=k.device)
        hidden[:, start:] = _future(start, stop, k.device)
        s = s.masked_fill(hidden[None, :, None, None, :], float("-inf"))
    return s


def _masked_mix(w, x, hidden):
    """``out[b,i,h,g] = sum_j w[b,i,h,g,j] * x[b,j,h]`` over the keys ``j`` that ``hidden[i, j]``
    does not hide, selected out of ``x`` per query (a NaN in a hidden row never enters)."""
    xs = x.permute(0, 2, 1, 3)[:, None]  # [B, 1, H_kv, C, E]
    xs = torch.where(hidden[None, :, None, :, None], 0, xs)  # [B, C, H_kv, C, E]
    return torch.einsum("bchgn,bchne->bchge", w, xs)


def _masked_mix_t(w, y, hidden):
    """The transposed mix, per key: ``sum_i w[b,i,h,g,j] * y[b,i,h,g]`` over queries ``i``
    that see key ``j``, selected out of ``y`` per key."""
    ys = torch.where(hidden.T[None, :, None, None, :, None], 0, y.permute(0, 2, 3, 1, 4)[:, None])
    return torch.einsum("bihgj,bjhgie->bjhe", w, ys)  # ys: [B, C_j, H_kv, G, C_i, E]


def _dropout_factor(qf, start, stop, n_keys, dropout_p, rng, key_offset):
    """``[B, C, H_kv, G, n_keys]``: keep mask over ``1 - p`` of queries ``start..stop-1`` and
    keys ``0..n_keys-1`` (elements ``(i, key_offset + j)``)."""
    b, _, hk, g, _ = qf.shape
    queries = torch.arange(start, stop, device=qf.device)
    keys = torch.arange(key_offset, key_offset + n_keys, device=qf.device)
    return dropout.weight_factor(rng, dropout_p, b, hk, g, queries, keys, qf.dtype)


def _check_rng(dropout_p, rng):
    if dropout_p and rng is None:
        raise ValueError(f"dropout_p={dropout_p} needs the call's rng tensor [seed, offset]")


def forward(q, k, v, is_causal: bool, scale: float, dropout_p: float = 0.0, rng=None, key_offset: int = 0):
    """Dense forward: ``(out [B, Nq, H, D_v], lse [B, Nq, H])``; with ``dropout_p > 0`` the
    call's ``rng`` ``[seed, offset]`` and the global index of key 0 (``key_offset``)."""
    _check_rng(dropout_p, rng)
    b, nq, h, _ = q.shape
    qf, kf, vf, chunk = _split(q, k, v, is_causal, dropout_p > 0)
    out = torch.empty(*qf.shape[:-1], v.shape[-1], dtype=qf.dtype, device=q.device)
    lse = torch.empty(qf.shape[:-1], dtype=qf.dtype, device=q.device)
    for start in range(0, nq, chunk):
        stop = min(start + chunk, nq)
        keys = kf[:, :stop] if is_causal else kf
        s = _logits(qf[:, start:stop], keys, scale, start, is_causal)
        lse_c = torch.logsumexp(s, dim=-1)
        probs = torch.exp(s - softmax_shift(lse_c)[..., None])
        if dropout_p:  # the dropped weights meet V; the LSE stays unmasked
            probs = probs * _dropout_factor(qf, start, stop, keys.shape[1], dropout_p, rng, key_offset)
        if is_causal:
            out[:, start:stop] = (
                torch.einsum("bchgn,bnhe->bchge", probs[..., :start], vf[:, :start])
                + _masked_mix(probs[..., start:], vf[:, start:stop], _future(start, stop, q.device))
            )
        else:
            out[:, start:stop] = torch.einsum("bchgn,bnhe->bchge", probs, vf)
        lse[:, start:stop] = lse_c
    return out.reshape(b, nq, h, -1).to(q.dtype), lse.reshape(b, nq, h).to(lse_dtype(q.dtype))


def backward(q, k, v, out, lse, grad_out, grad_lse, is_causal: bool, scale: float, dropout_p: float = 0.0,
             rng=None, key_offset: int = 0):
    """Dense backward from the saved LSE: ``(dq, dk, dv)`` (dropout arguments: the forward's)."""
    _check_rng(dropout_p, rng)
    b, nq, h, _ = q.shape
    qf, kf, vf, chunk = _split(q, k, v, is_causal, dropout_p > 0)
    shape = qf.shape[:-1]
    d_out = grad_out.reshape(*shape, -1).to(qf.dtype)
    delta = (d_out * out.reshape(*shape, -1).to(qf.dtype)).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse.reshape(shape).to(qf.dtype)
    lse_f = softmax_shift(lse.reshape(shape).to(qf.dtype))
    dq = torch.empty_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    for start in range(0, nq, chunk):
        stop = min(start + chunk, nq)
        q_c, do_c = qf[:, start:stop], d_out[:, start:stop]
        keys, values = (kf[:, :stop], vf[:, :stop]) if is_causal else (kf, vf)
        s = _logits(q_c, keys, scale, start, is_causal)
        probs = torch.exp(s - lse_f[:, start:stop, ..., None])
        # dp[i, j] reads value j only: a hidden entry is replaced, not multiplied by 0.
        dp = torch.einsum("bchge,bnhe->bchgn", do_c, values).masked_fill(s == float("-inf"), 0)
        kept = probs
        if dropout_p:
            factor = _dropout_factor(qf, start, stop, keys.shape[1], dropout_p, rng, key_offset)
            dp = dp * factor
            kept = probs * factor
        ds = probs * (dp - delta[:, start:stop, ..., None])
        if not is_causal:
            dq[:, start:stop] = torch.einsum("bchgn,bnhd->bchgd", ds, kf) * scale
            dk += torch.einsum("bchgn,bchgd->bnhd", ds, q_c) * scale
            dv += torch.einsum("bchgn,bchge->bnhe", kept, do_c)
            continue
        future = _future(start, stop, q.device)
        dq[:, start:stop] = (torch.einsum("bchgn,bnhd->bchgd", ds[..., :start], kf[:, :start])
                             + _masked_mix(ds[..., start:], kf[:, start:stop], future)) * scale
        dk[:, :start] += torch.einsum("bchgn,bchgd->bnhd", ds[..., :start], q_c) * scale
        dv[:, :start] += torch.einsum("bchgn,bchge->bnhe", kept[..., :start], do_c)
        dk[:, start:stop] += _masked_mix_t(ds[..., start:], q_c, future) * scale
        dv[:, start:stop] += _masked_mix_t(kept[..., start:], do_c, future)
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
