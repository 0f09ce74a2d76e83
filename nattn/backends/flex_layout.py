"""Token order for the flex backend: multi-dimensional tiles instead of row-major order.

flex_attention skips work per block of 128 queries x 128 keys. In row-major order a
block of 128 queries of a 2-D image is one thin row, and the union of its windows spans
many rows; permuted into tiles (8x8 in 2-D, 4x4x4 in 3-D) a block is a compact box and
its windows' union is a compact box too, so the block mask is dense where the windows are.

Each axis is first reordered by dilation group (``i mod d`` major, ``i div d`` minor), so
that a tile holds neighbours *inside* one group, then padded to a multiple of the tile.
Padded tokens are zero rows whose keys the mask removes and whose outputs are dropped.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch


def choose_tile(spatial: Sequence[int], dilation: Sequence[int]) -> Tuple[int, ...]:
    """Tile shape per axis (the one place this heuristic lives).

    1-D: no tiles (row-major already keeps windows contiguous). 2-D: 8x8, 3-D: 4x4x4, so two
    tiles fill one 128-query flex block. An axis whose padding would add more than 1/8 of
    its tokens gets a halved tile instead (28 -> tile 4, not 32 tokens); an axis shorter
    than the tile gets a tile of its own length.
    """
    if len(spatial) == 1:
        return (1,)
    base = 8 if len(spatial) == 2 else 4
    tile = []
    for n in spatial:
        t = min(base, n)
        while t > 1 and math.ceil(n / t) * t > n * 9 / 8:
            t //= 2
        tile.append(max(t, 1))
    return tuple(tile)


class TileLayout:
    """Index tables between row-major tokens and tiled (padded) positions.

    ``src[p]``: the row-major token at position ``p`` (``N`` for padding: a zero row).
    ``dst[n]``: the position of row-major token ``n``. ``coords[a][p]``: the original
    coordinate along axis ``a`` of position ``p`` (0 for padding). ``real[p]``: not padding.
    """

    def __init__(self, spatial, tile, dilation, group_by_dilation: bool = True, device=None):
        self.spatial = tuple(spatial)
        self.tile = tuple(tile)
        n_axes = len(self.spatial)
        padded = [math.ceil(n / t) * t for n, t in zip(self.spatial, self.tile)]
        self.num_tokens = math.prod(self.spatial)
        self.num_positions = math.prod(padded)
        # Per axis: axis position u -> original coordinate (dilation groups contiguous).
        axis_coord = []
        for n, d in zip(self.spatial, dilation):
            i = torch.arange(n)
            order = torch.argsort(i % d * n + i // d) if group_by_dilation and d > 1 else i
            axis_coord.append(order)
        # Positions enumerate (tile index per axis, offset per axis) in row-major order.
        tiles = [p // t for p, t in zip(padded, self.tile)]
        grids = torch.meshgrid(
            *[torch.arange(m) for m in tiles], *[torch.arange(t) for t in self.tile], indexing="ij"
        )
        real = torch.ones(self.num_positions, dtype=torch.bool)
        coords, flat = [], torch.zeros(self.num_positions, dtype=torch.long)
        for a in range(n_axes):
            u = (grids[a] * self.tile[a] + grids[n_axes + a]).reshape(-1)
            inside = u < self.spatial[a]
            c = axis_coord[a][u.clamp(max=self.spatial[a] - 1)]
            c = torch.where(inside, c, torch.zeros_like(c))
            real &= inside
            coords.append(c)
            flat = flat * self.spatial[a] + c
        src = torch.where(real, flat, torch.full_like(flat, self.num_tokens))
        dst = torch.empty(self.num_tokens, dtype=torch.long)
        dst[src[real]] = torch.arange(self.num_positions)[real]
        self.identity = self.num_positions == self.num_tokens and bool(
            (src == torch.arange(self.num_tokens)).all()
        )
        self.src, self.dst, self.real = src.to(device), dst.to(device), real.to(device)
        self.coords = [c.to(device) for c in coords]

    def to_positions(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, *spatial, H, D]`` -> ``[B, H, P, D]`` in tiled order (differentiable)."""
        b, h, d = x.shape[0], x.shape[-2], x.shape[-1]
        flat = x.reshape(b, self.num_tokens, h, d)
        if self.num_positions > self.num_tokens:  # a zero row for the padded positions
            flat = torch.cat([flat, flat.new_zeros(b, 1, h, d)], dim=1).index_select(1, self.src)
        elif not self.identity:
            flat = flat.index_select(1, self.src)
        return flat.transpose(1, 2)

    def from_positions(self, y: torch.Tensor) -> torch.Tensor:
        """``[B, H, P, *rest]`` -> ``[B, *spatial, H, *rest]`` (drops padding)."""
        y = y.transpose(1, 2)
        if not self.identity:
            y = y.index_select(1, self.dst)
        return y.reshape(y.shape[0], *self.spatial, *y.shape[2:])
