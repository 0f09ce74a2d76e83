"""Exact merge of partial attentions through their logsumexps (SEMANTICS.md)."""

from __future__ import annotations

from typing import Sequence, Tuple

import torch


def merge_attentions(
    outputs: Sequence[torch.Tensor], lse_tensors: Sequence[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge attentions over disjoint key sets into one softmax over their union.

    ``outputs[i]`` is ``[B, *tokens, H, D_v]`` and ``lse_tensors[i]`` is ``[B, *tokens, H]``.
    Returns ``(output, lse)``: ``lse = logsumexp_i lse_i`` and
    ``output = sum_i exp(lse_i - lse) * output_i``. Gradients flow into every output
    and every LSE. Computed in float32 (float64 for float64 inputs).
    """
    if not isinstance(outputs, (list, tuple)) or not isinstance(lse_tensors, (list, tuple)):
        raise TypeError("outputs and lse_tensors must be lists or tuples of tensors")
    if len(outputs) < 2 or len(outputs) != len(lse_tensors):
        raise ValueError(
            "merge_attentions needs at least two outputs and one LSE per output, "
            f"got {len(outputs)} outputs and {len(lse_tensors)} LSEs"
        )
    ref_out, ref_lse = outputs[0], lse_tensors[0]
    for i, (o, l) in enumerate(zip(outputs, lse_tensors)):
        if o.shape != ref_out.shape or o.dtype != ref_out.dtype or o.device != ref_out.device:
            raise ValueError(f"outputs[{i}] shape/dtype/device {tuple(o.shape)}/{o.dtype}/{o.device} "
                             f"differs from outputs[0] {tuple(ref_out.shape)}/{ref_out.dtype}/{ref_out.device}")
        if l.shape != o.shape[:-1]:
            raise ValueError(f"lse_tensors[{i}] must have shape {tuple(o.shape[:-1])}, got {tuple(l.shape)}")
    acc = torch.float64 if ref_out.dtype == torch.float64 else torch.float32
    lses = torch.stack([l.to(acc) for l in lse_tensors])
    lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - lse)  # [n, B, *tokens, H]
    out = sum(w[..., None] * o.to(acc) for w, o in zip(weights, outputs))
    return out.to(ref_out.dtype), lse.to(ref_lse.dtype)
