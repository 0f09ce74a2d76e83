"""nattn: fast neighborhood attention for PyTorch (1-D/2-D/3-D, heads-last layout)."""

from .functional import attention, merge_attentions, na1d, na2d, na3d, neighborhood_attention
from .params import NAParams

__version__ = "0.1.0"

__all__ = [
    "na1d", "na2d", "na3d", "neighborhood_attention", "attention", "merge_attentions", "NAParams",
]
