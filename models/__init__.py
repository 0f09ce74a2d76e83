"""NAT / DiNAT / DiNAT_s / isotropic / video models on nattn, registered with timm.

Installed as ``nattn.models``; ``import nattn`` imports it when timm is installed, so
that ``timm.create_model("dinat_tiny")`` works right after ``import nattn``.
"""

from . import dinat_s, isotropic, nat, video  # noqa: F401  (registers the models with timm)
from ._checkpoints import CheckpointMismatchError
from ._create import PretrainedWeightsError
from .dinat_s import DiNAT_s
from .isotropic import NATIsotropic
from .nat import NAT
from .video import VideoNAT

__all__ = ["NAT", "DiNAT_s", "NATIsotropic", "VideoNAT", "CheckpointMismatchError", "PretrainedWeightsError"]
