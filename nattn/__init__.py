"""nattn: fast neighborhood attention for PyTorch (1-D/2-D/3-D, heads-last layout)."""

import importlib.util as _importlib_util
import warnings as _warnings

from . import flops, nn  # noqa: F401  (flops registers FlopCounterMode formulas for nattn's ops)
from .functional import attention, merge_attentions, na1d, na2d, na3d, neighborhood_attention
from .params import NAParams

if _importlib_util.find_spec("timm") is not None:  # register NAT/DiNAT/... with timm
    try:
        from . import models  # noqa: F401
    except ImportError as _e:  # a broken timm/torchvision install must not break nattn itself
        _warnings.warn(f"nattn.models were not registered with timm: {_e}", ImportWarning, stacklevel=2)

__version__ = "0.1.0"

__all__ = [
    "na1d", "na2d", "na3d", "neighborhood_attention", "attention", "merge_attentions", "NAParams",
]
