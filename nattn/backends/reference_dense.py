"""Reference dense attention with LSE, chunked over queries (never Nq x Nk at once).

Used by :func:`nattn.attention` and for the additional keys/values of NA, whose
partial result is merged through the LSE.
"""

from __future__ import annotations

import torch

from .reference_math import CHUNK_ELEMENTS, compute_dtype, lse_dtype


def _split(q, k, v):
    b, nq, h, d = q.shape
    hk = k.shape[2]
    dt = compute_dtype(q.dtype)
    return (
        q.reshape(b, nq, hk, h // hk, d).to(dt),
        k.to(dt),
        v.to(dt),
        max(1, CHUNK_ELEMENTS // (b * k.shape[1] * h * 3)),
    )


def _logits(q_c, k, scale, start, causal):
    s = torch.einsum("bchgd,bnhd->bchgn", q_c, k) * scale
    if causal:
        rows = torch.arange(start, start + q_c.shape[1], device=k.device)
        cols = torch.arange(k.shape[1], device=k.device)
        s = s.masked_fill((cols[None, :] > rows[:, None])[None, :, None, None, :], float("-inf"))
    return s


def forward(q, k, v, is_causal: bool, scale: float):
    """Dense forward: ``(out [B, Nq, H, D_v], lse [B, Nq, H])``."""
    b, nq, h, _ = q.shape
    qf, kf, vf, chunk = _split(q, k, v)
    out = torch.empty(*qf.shape[:-1], v.shape[-1], dtype=qf.dtype, device=q.device)
    lse = torch.empty(qf.shape[:-1], dtype=qf.dtype, device=q.device)
    for start in range(0, nq, chunk):
        stop = min(start + chunk, nq)
        s = _logits(qf[:, start:stop], kf, scale, start, is_causal)
        lse_c = torch.logsumexp(s, dim=-1)
        out[:, start:stop] = torch.einsum("bchgn,bnhe->bchge", torch.exp(s - lse_c[..., None]), vf)
        lse[:, start:stop] = lse_c
    return out.reshape(b, nq, h, -1).to(q.dtype), lse.reshape(b, nq, h).to(lse_dtype(q.dtype))


def backward(q, k, v, out, lse, grad_out, grad_lse, is_causal: bool, scale: float):
    """Dense backward from the saved LSE: ``(dq, dk, dv)``."""
    b, nq, h, _ = q.shape
    qf, kf, vf, chunk = _split(q, k, v)
    shape = qf.shape[:-1]
    d_out = grad_out.reshape(*shape, -1).to(qf.dtype)
    delta = (d_out * out.reshape(*shape, -1).to(qf.dtype)).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse.reshape(shape).to(qf.dtype)
    lse_f = lse.reshape(shape).to(qf.dtype)
    dq = torch.empty_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    for start in range(0, nq, chunk):
        stop = min(start + chunk, nq)
        q_c, do_c = qf[:, start:stop], d_out[:, start:stop]
        probs = torch.exp(_logits(q_c, kf, scale, start, is_causal) - lse_f[:, start:stop, ..., None])
        dp = torch.einsum("bchge,bnhe->bchgn", do_c, vf)
        ds = probs * (dp - delta[:, start:stop, ..., None])
        dq[:, start:stop] = torch.einsum("bchgn,bnhd->bchgd", ds, kf) * scale
        dk += torch.einsum("bchgn,bchgd->bnhd", ds, q_c) * scale
        dv += torch.einsum("bchgn,bchge->bnhe", probs, do_c)
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
