"""NA with explicit attention weights, for attention dropout during training.

The fused op never materializes the softmax, so dropout on the attention weights
needs the weights: this path gathers each query's window (the same
:class:`~nattn.windows.WindowTable` the reference backend uses) and lets autograd do
the backward. Memory is ``B * N * H * W`` weights plus the gathered windows (the keys in
fp32 for the logits); the modules use it only while training with ``attn_drop > 0``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..backends.reference_math import softmax_or_zero
from ..params import NAParams
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
        bias = rpb.flatten(1)[:, rpb_idx].to(acc)  # [H, N, W]
        logits = logits + bias.reshape(heads_kv, groups, *bias.shape[1:]).permute(2, 0, 1, 3)[None]
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
