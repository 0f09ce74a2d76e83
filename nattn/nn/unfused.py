"""NA with explicit attention weights, for attention dropout during training.

The fused op never materializes the softmax, so dropout on the attention weights
needs the weights: on CUDA this path runs libnattn's window kernels (fp32 logits, the
weighted sum accumulated in fp32; nattn/qk_av_kernels.py), elsewhere it gathers each
query's window (the same :class:`~nattn.windows.WindowTable` the reference backend uses);
autograd does the backward. Memory is ``B * N * H * W`` weights plus the gathered windows (the keys in
fp32 for the logits); the modules use it only while training with ``attn_drop > 0``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import qk_av
from ..backends.reference_math import softmax_or_zero
from ..params import NAParams
from ..qk_av_kernels import KernelAV, KernelQK
from ..windows import WindowTable


def na_explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: NAParams,
    rpb: Optional[torch.Tensor] = None,
    additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None,
    weights_hook: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> torch.Tensor:
    """softmax(q K_w^T * scale + bias) V_w with ``weights_hook`` applied to the weights."""
    b, heads, dim = q.shape[0], q.shape[-2], q.shape[-1]
    spatial = tuple(q.shape[1:-2])
    heads_kv, dim_v = k.shape[-2], v.shape[-1]
    groups = heads // heads_kv
    table = WindowTable(spatial, params.kernel_size, params.stride, params.dilation,
                        params.is_causal, device=q.device)
    if _window_kernels(q, v, len(spatial)):
        return _with_window_kernels(q, k, v, params, rpb, additional_keys, additional_values, weights_hook, table)
    key_idx, valid, rpb_idx = table.chunk(0, table.num_tokens)  # [N, W] each
    window = key_idx.shape[1]
    qf = q.reshape(b, -1, heads_kv, groups, dim)
    k_w = k.reshape(b, -1, heads_kv, dim)[:, key_idx]  # [B, N, W, H_kv, D]
    v_w = v.reshape(b, -1, heads_kv, dim_v)[:, key_idx]
    if any(params.is_causal):  # invalid (clamped) slots: selected away, never 0 * NaN
        slot = valid[None, :, :, None, None]
        k_w, v_w = torch.where(slot, k_w, 0), torch.where(slot, v_w, 0)
    # Scaled before the product (unscaled q.k of 16-bit inputs overflows at 65504 long before
    # the softmax's logits do) and accumulated in fp32 (the fused kernels' precision).
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qs = qf.to(acc) * params.scale
    logits = torch.einsum("bnhgd,bnwhd->bnhgw", qs, k_w.to(acc))
    if rpb is not None:
        logits = logits + table.bias(rpb, acc, rpb_idx).reshape(1, -1, heads_kv, groups, window)
    logits = logits.masked_fill(~valid[None, :, None, None, :], float("-inf"))
    if additional_keys is not None:
        extra = torch.einsum("bnhgd,bmhd->bnhgm", qs, additional_keys.to(acc))
        logits = torch.cat([logits, extra], dim=-1)
    weights = softmax_or_zero(logits, dim=-1).to(q.dtype)  # fp32 softmax; no finite logit: zeros
    if weights_hook is not None:
        weights = weights_hook(weights)
    out = torch.einsum("bnhgw,bnwhe->bnhge", weights[..., :window], v_w)
    if additional_values is not None:
        out = out + torch.einsum("bnhgm,bmhe->bnhge", weights[..., window:], additional_values)
    return out.reshape(b, *spatial, heads, dim_v)


def _window_kernels(q: torch.Tensor, v: torch.Tensor, na_dim: int) -> bool:
    """CUDA tensors that libnattn's window kernels take (fp32 logits from fp32 copies of q and k)."""
    return (q.dtype != torch.float64 and qk_av._kernels(q, na_dim, q.shape[-1], torch.float32)
            and qk_av._kernels(v, na_dim, v.shape[-1]))


def _with_window_kernels(q, k, v, params, rpb, additional_keys, additional_values, weights_hook, table):
    """The same on CUDA with the window kernels: fp32 logits (scaled query and keys as fp32:
    the product accumulates in fp32 and the logits keep fp32 for the softmax), weights in
    the input dtype into the fp32-accumulating weighted sum."""
    b, heads, window = q.shape[0], q.shape[-2], table.window_size
    spatial = tuple(q.shape[1:-2])
    qs = q.float() * params.scale
    logits = KernelQK.apply(qs, k.float(), params)  # [B, *spatial, H, W], -inf outside causal windows
    if rpb is not None:
        logits = logits + table.bias(rpb, torch.float32).reshape(1, *spatial, heads, window)
    if additional_keys is not None:
        heads_kv = additional_keys.shape[-2]
        qf = qs.reshape(b, -1, heads_kv, heads // heads_kv, q.shape[-1])
        extra = torch.einsum("bnhgd,bmhd->bnhgm", qf, additional_keys.float())
        logits = torch.cat([logits, extra.reshape(*logits.shape[:-1], -1)], dim=-1)
    weights = softmax_or_zero(logits, dim=-1).to(q.dtype)
    if weights_hook is not None:
        weights = weights_hook(weights)
    out = KernelAV.apply(weights[..., :window].contiguous(), v, params)
    if additional_values is not None:
        heads_kv = additional_values.shape[-2]
        w_extra = weights[..., window:].reshape(b, -1, heads_kv, heads // heads_kv, additional_values.shape[1])
        extra_out = torch.einsum("bnhgm,bmhe->bnhge", w_extra, additional_values)
        out = out + extra_out.reshape(out.shape)
    return out
