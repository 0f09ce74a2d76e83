"""nattn: fast neighborhood attention for PyTorch (1-D/2-D/3-D, heads-last layout)."""

from . import flops, nn  # noqa: F401  (flops registers FlopCounterMode formulas for nattn's ops)
from ._timm_registration import register_with_timm as _register_with_timm
from .functional import attention, merge_attentions, na1d, na2d, na3d, neighborhood_attention
from .backends.autotune import tuning as autotune
from .params import NAParams
from .qk_av import na1d_av, na1d_qk, na2d_av, na2d_qk, na3d_av, na3d_qk

# NAT/DiNAT/... become timm models as soon as timm is imported (now, if it already is);
# `import nattn` itself does not import timm (about a second, with torchvision).
_register_with_timm()

__version__ = "0.1.0"

__all__ = [
    "na1d", "na2d", "na3d", "neighborhood_attention", "attention", "merge_attentions", "NAParams",
    "na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av", "autotune",
]
