"""PyTorch's switch for TF32 in float32 matrix products, read on every call.

libnattn runs float32 NA calls on its tensor-core family's TF32 instances (SM80+) only when
this says so, and on its SIMT family's exact fp32 otherwise (docs/backends.md). The switch is
``torch.backends.cuda.matmul``'s: ``allow_tf32 = True``, ``fp32_precision = "tf32"`` (the API
of torch >= 2.9, which also follows ``torch.backends.fp32_precision``) and
``torch.set_float32_matmul_precision("high")`` or ``("medium")`` all turn it on; PyTorch's
default is off. On torch 2.14 ``matmul.fp32_precision`` reflects every one of those, while
reading ``allow_tf32`` raises once the newer API has set the precision, so that is read first.
"""

from __future__ import annotations

import torch

# torch >= 2.9: the resolved precision of CUDA matmuls ("tf32", "ieee", or "none": never set).
# The raw getter costs ~0.1 us, the public attribute ~0.5 us (it goes through __getattr__).
_precision = getattr(torch._C, "_get_fp32_precision_getter", None)
# allow_tf32's own getter (what ``torch.backends.cuda.matmul.allow_tf32`` returns, ~10x cheaper).
_allow_tf32 = getattr(torch._C, "_get_cublas_allow_tf32", None)


def _legacy() -> bool:
    try:
        if _allow_tf32 is not None:
            return bool(_allow_tf32())
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except (RuntimeError, AttributeError):  # a mix of the two APIs that torch refuses to resolve
        return False


def allowed() -> bool:
    """Whether nattn's float32 calls use TF32 tensor cores now: PyTorch's switch."""
    if _precision is not None:
        try:
            precision = _precision("cuda", "matmul")
        except (RuntimeError, TypeError):
            precision = None
        if precision == "tf32":
            return True
        if precision == "ieee":
            return False
    return _legacy()  # "none" (nothing set: off) or a torch without the newer API
