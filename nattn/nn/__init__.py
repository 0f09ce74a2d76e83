"""Neighborhood-attention layers: ``NeighborhoodAttention1D/2D/3D``."""

from .neighborhood_attention import (
    NeighborhoodAttention1D,
    NeighborhoodAttention2D,
    NeighborhoodAttention3D,
    NeighborhoodAttentionND,
)
from .unfused import na_explicit

__all__ = [
    "NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D",
    "NeighborhoodAttentionND", "na_explicit",
]
