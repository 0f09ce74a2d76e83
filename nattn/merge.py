"""Exact merge of partial attentions through their logsumexps (docs/semantics.md)."""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from .params import FLOAT_DTYPES


def _check(outputs, lse_tensors) -> None:
    if not isinstance(outputs, (list, tuple)) or not isinstance(lse_tensors, (list, tuple)):
        raise TypeError("outputs and lse_tensors must be lists or tuples of tensors")
    if len(outputs) < 2 or len(outputs) != len(lse_tensors):
        raise ValueError(
            "merge_attentions needs at least two outputs and one LSE per output, "
            f"got {len(outputs)} outputs and {len(lse_tensors)} LSEs"
        )
    for name, tensors in (("outputs", outputs), ("lse_tensors", lse_tensors)):
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in FLOAT_DTYPES:
                raise TypeError(
                    f"{name}[{i}] must be float32, float16, bfloat16 or float64, got {t.dtype}"
                )
    ref_out, ref_lse = outputs[0], lse_tensors[0]
    for i, (o, l) in enumerate(zip(outputs, lse_tensors)):
        if o.shape != ref_out.shape or o.dtype != ref_out.dtype or o.device != ref_out.device:
            raise ValueError(f"outputs[{i}] shape/dtype/device {tuple(o.shape)}/{o.dtype}/{o.device} "
                             f"differs from outputs[0] {tuple(ref_out.shape)}/{ref_out.dtype}/{ref_out.device}")
        if l.shape != o.shape[:-1]:
            raise ValueError(f"lse_tensors[{i}] must have shape {tuple(o.shape[:-1])}, got {tuple(l.shape)}")
        if l.dtype != ref_lse.dtype or l.device != ref_out.device:
            raise ValueError(
                f"lse_tensors[{i}] dtype/device {l.dtype}/{l.device} must match lse_tensors[0]'s "
                f"dtype ({ref_lse.dtype}) and the outputs' device ({ref_out.device})"
            )


def merge_attentions(
    outputs: Sequence[torch.Tensor], lse_tensors: Sequence[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge attentions over disjoint key sets into one softmax over their union.

    With ``lse = logsumexp_i lse_i``, the result is ``output = sum_i exp(lse_i - lse) *
    output_i``: what one attention over all the keys together would give. Gradients flow
    into every output and every LSE. Computed in float32 (float64 for float64 outputs).

    Args:
        outputs: two or more attention outputs of the same queries, each
            ``[B, *tokens, H, D_v]``, all of one shape, dtype and device (any number of
            token axes, e.g. ``[B, X, Y, H, D_v]`` from ``na2d``).
        lse_tensors: their logsumexps, one per output, each ``[B, *tokens, H]`` (as
            returned with ``return_lse=True``).

    Returns:
        ``(output, lse)``, ``output`` in the dtype of ``outputs[0]`` and ``lse`` in the
            dtype of ``lse_tensors[0]``.

    Raises:
        TypeError: ``outputs`` or ``lse_tensors`` is not a list or tuple.
        ValueError: fewer than two outputs, not one LSE per output, outputs that differ
            in shape, dtype or device, or an LSE whose shape is not its output's without
            the last axis.
    """
    _check(outputs, lse_tensors)
    ref_out, ref_lse = outputs[0], lse_tensors[0]
    acc = torch.float64 if ref_out.dtype == torch.float64 else torch.float32
    lses = torch.stack([l.to(acc) for l in lse_tensors])  # [n, B, *tokens, H]
    # A part with LSE = -inf attended no key: weight 0, and its output (NaN or anything) is
    # selected away, not multiplied by 0. With every part empty the result is 0, LSE -inf.
    empty = lses == float("-inf")
    shift = lses.detach().amax(0)
    shift = shift.masked_fill(shift == float("-inf"), 0)
    exps = torch.exp(lses - shift)  # 0 for empty parts; the largest part gives 1
    total = exps.sum(0)
    some = total > 0
    total = torch.where(some, total, torch.ones_like(total))  # no log(0): finite gradients
    lse = torch.where(some, torch.log(total) + shift, torch.full_like(total, float("-inf")))
    weights = exps / total
    out = sum(w[..., None] * o.to(acc).masked_fill(e[..., None], 0)
              for w, o, e in zip(weights, outputs, empty))
    return out.to(ref_out.dtype), lse.to(ref_lse.dtype)
