"""NATTEN 0.14-0.17 compatibility: the old unfused op names (heads-first) and module signatures.

``from nattn.compat import natten2dqkrpb, natten2dav, NeighborhoodAttention2D``; or call
:func:`install_natten_alias` so that unmodified code's ``import natten`` gets this module
(docs/porting-from-natten.md). Nothing here is imported by ``import nattn``.
"""

from . import functional
from .alias import install_natten_alias, uninstall_natten_alias
from .functional import (
    natten1dav, natten1dqk, natten1dqkrpb, natten2dav, natten2dqk, natten2dqkrpb,
    natten3dav, natten3dqk, natten3dqkrpb,
)
from .modules import NeighborhoodAttention1D, NeighborhoodAttention2D, NeighborhoodAttention3D

__all__ = [
    "functional", "install_natten_alias", "uninstall_natten_alias",
    "natten1dqkrpb", "natten2dqkrpb", "natten3dqkrpb", "natten1dqk", "natten2dqk", "natten3dqk",
    "natten1dav", "natten2dav", "natten3dav",
    "NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D",
]
