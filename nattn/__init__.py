"""nattn: fast neighborhood attention for PyTorch (1-D/2-D/3-D, heads-last layout)."""

import importlib.util as _importlib_util

from . import flops, nn  # noqa: F401  (flops registers FlopCounterMode formulas for nattn's ops)
from .functional import attention, merge_attentions, na1d, na2d, na3d, neighborhood_attention
from .params import NAParams

if _importlib_util.find_spec("timm") is not None:  # register NAT/DiNAT/... with timm
    from . import models  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "na1d", "na2d", "na3d", "neighborhood_attention", "attention", "merge_attentions", "NAParams",
]
