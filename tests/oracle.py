"""Brute-force NA oracle, written from docs/semantics.md independently of nattn's code.

Builds the full boolean mask (and RPB index) query by query with Python integers,
then runs dense masked attention in float64. Only for small sizes.
"""

import math

import torch


def axis_allowed(i, j, length, k, s, d, causal):
    """Is key coordinate j in the window of query coordinate i along one axis?"""
    g = i % d
    if j % d != g:
        return False
    ig, jg = i // d, j // d
    group_len = math.ceil((length - g) / d)
    if causal:
        leader = min((ig // s) * s + s - 1, group_len - 1)
        return jg <= ig and leader - jg < k
    leader = min((ig // s) * s + s // 2, group_len - 1)
    left, right = k // 2, k // 2 + k % 2 - 1
    centre = min(max(leader, left), group_len - 1 - right)
    return centre - left <= jg <= centre + right


def mask_and_bias_index(spatial, kernel, stride, dilation, causal):
    """Boolean mask [N, N] and, per (query, key), the RPB table offset per axis [N, N, n_axes].

    The mask of the product window is the AND of per-axis masks over row-major tokens.
    """
    n_axes = len(spatial)
    mask = torch.ones((1, 1), dtype=torch.bool)
    offsets = torch.zeros((1, 1, 0), dtype=torch.long)
    for x in range(n_axes):
        length = spatial[x]
        ax = torch.tensor([[axis_allowed(i, j, length, kernel[x], stride[x], dilation[x], causal[x])
                            for j in range(length)] for i in range(length)])
        off = torch.tensor([[j // dilation[x] - i // dilation[x] + kernel[x] - 1
                             for j in range(length)] for i in range(length)])
        n = mask.shape[0]
        mask = (mask[:, None, :, None] & ax[None, :, None, :]).reshape(n * length, n * length)
        offsets = torch.cat([
            offsets[:, None, :, None, :].expand(n, length, n, length, x),
            off[None, :, None, :, None].expand(n, length, n, length, 1),
        ], dim=-1).reshape(n * length, n * length, x + 1)
    return mask, offsets


def oracle(q, k, v, kernel, stride, dilation, causal, scale=None, rpb=None, extra_k=None, extra_v=None):
    """Float64 dense masked attention: returns (out, lse) in the heads-last layout."""
    b, *spatial, h, d = q.shape
    hk, dv = k.shape[-2], v.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    mask, offsets = mask_and_bias_index(spatial, kernel, stride, dilation, causal)
    qf = q.double().reshape(b, -1, h, d)
    kf = k.double().reshape(b, -1, hk, d).repeat_interleave(h // hk, dim=2)
    vf = v.double().reshape(b, -1, hk, dv).repeat_interleave(h // hk, dim=2)
    logits = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    if rpb is not None:
        idx = [o.clamp(0, 2 * kernel[x] - 2) for x, o in enumerate(offsets.unbind(-1))]
        bias = rpb.double()[(slice(None),) + tuple(idx)]  # [H, N, N]
        logits = logits + torch.where(mask, bias, torch.zeros((), dtype=torch.float64))[None]
    logits = logits.masked_fill(~mask, float("-inf"))
    if extra_k is not None:
        ek = extra_k.double().repeat_interleave(h // hk, dim=2)
        ev = extra_v.double().repeat_interleave(h // hk, dim=2)
        logits = torch.cat([logits, torch.einsum("bqhd,bkhd->bhqk", qf, ek) * scale], dim=-1)
        vf = torch.cat([vf, ev], dim=1)
    lse = torch.logsumexp(logits, dim=-1)  # [B, H, N]
    out = torch.einsum("bhqk,bkhe->bqhe", torch.softmax(logits, dim=-1), vf)
    return out.reshape(b, *spatial, h, dv), lse.permute(0, 2, 1).reshape(b, *spatial, h)
