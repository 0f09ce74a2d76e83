"""Verify before timing: each NA row on a smaller copy of the problem against the reference.

The reference runs in float32 on the same (rounded) inputs; the error is
``|out - ref| / |ref|`` over the whole output; NaN never passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from nattn.backends import BACKENDS

from .problems import Problem
from .rows import FUNCS, Row, make_inputs

TOLERANCE = {torch.float32: 3e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float64: 1e-9}
# float32 through TF32 (10 mantissa bits, as fp16) when PyTorch's switch is on
TF32_TOLERANCE = 1e-2


@dataclass
class Check:
    ok: Optional[bool]  # None: not checked (not an NA row)
    rel_err: Optional[float] = None
    message: str = ""

    def to_dict(self):
        return {"ok": self.ok, "rel_err": self.rel_err, "message": self.message}


# With dropout the reference and the row draw their [seed, offset] after the same manual
# seed, so both apply the same mask (docs/semantics.md, "Attention dropout").
DROPOUT_SEED = 20261201


def reference_output(p: Problem, t) -> torch.Tensor:
    f = {n: x.detach().float() for n, x in t.items()}
    if p.dropout:
        torch.manual_seed(DROPOUT_SEED)
    with torch.no_grad():
        return FUNCS[p.na_dim](f["q"], f["k"], f["v"], p.kernel, stride=p.stride, dilation=p.dilation,
                               is_causal=p.causal, additional_keys=f.get("ek"), additional_values=f.get("ev"),
                               rpb=f.get("rpb"), backend="reference", dropout_p=p.dropout)


def check(row: Row, small: Problem, device, dtype, ref=None, inputs=None) -> Check:
    if not row.is_na:
        return Check(None, message="not NA")
    if "reference" not in BACKENDS:
        return Check(None, message="no reference backend")
    t = inputs if inputs is not None else make_inputs(small, device, dtype, False, seed=7)
    try:
        ref = reference_output(small, t) if ref is None else ref
        if small.dropout:
            torch.manual_seed(DROPOUT_SEED)
        with torch.no_grad():
            out = row.heads_last(row.forward(*row.prepare(small, t)), small).float()
    except Exception as e:  # a row that cannot even run the small copy is a failed check
        return Check(False, message=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    if out.shape != ref.shape:
        return Check(False, message=f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        return Check(False, message="non-finite values")
    err = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    tol = TOLERANCE.get(dtype, 3e-2)
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        tol = TF32_TOLERANCE
    return Check(err <= tol, err, "" if err <= tol else f"rel err {err:.2e} > {tol:.0e}")
