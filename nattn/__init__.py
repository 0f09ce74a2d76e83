"""nattn: fast neighborhood attention for PyTorch (1-D/2-D/3-D, heads-last layout)."""

import warnings as _warnings

from . import flops, nn  # noqa: F401  (flops registers FlopCounterMode formulas for nattn's ops)
from .functional import attention, merge_attentions, na1d, na2d, na3d, neighborhood_attention
from .params import NAParams

try:  # with timm installed, register NAT/DiNAT/... so timm.create_model finds them
    import timm as _timm  # noqa: F401
except ImportError:
    _timm = None
if _timm is not None:
    try:
        from . import models  # noqa: F401
    except ImportError as _e:  # a broken timm/torchvision install must not break nattn itself
        _warnings.warn(f"nattn.models were not registered with timm: {_e}", ImportWarning, stacklevel=2)

__version__ = "0.1.0"

__all__ = [
    "na1d", "na2d", "na3d", "neighborhood_attention", "attention", "merge_attentions", "NAParams",
]
