"""Token order for the flex backend: multi-dimensional tiles instead of row-major order.

flex_attention skips work per block of 128 queries x 128 keys. In row-major order a
block of 128 queries of a 2-D image is one thin row, and the union of its windows spans
many rows; permuted into tiles (8x8 in 2-D, 4x4x4 in 3-D) a block is a compact box and
its windows' union is a compact box too, so the block mask is dense where the windows are.

Each axis of length ``L`` with dilation ``d`` is first reordered by dilation group: padded
to ``d * M`` tokens (``M = ceil(L / d)``, the longest group), viewed as ``[M, d]`` and
transposed, so group ``g`` occupies axis positions ``g * M .. g * M + M - 1`` and a tile
holds neighbours *inside* one group. The axis is then padded to a multiple of its tile.
Everything is pad/reshape/permute (no index tables), and a position's group and group
coordinate are plain integer arithmetic, which is what the flex ``mask_mod`` needs
(:meth:`TileLayout.decode`). Padded tokens are zero rows whose keys the mask removes and
whose outputs are dropped. The position count is padded once more to a multiple of flex's
128-token block: torch's flex backward with a score_mod and a block mask has produced wrong
gradients on sequence lengths that are not (pytorch/pytorch#153799).
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

FLEX_BLOCK = 128  # positions are padded to a multiple of flex's block size


def _axis_extent(n: int, d: int, grouped: bool) -> int:
    """Axis length after the dilation-group reorder (before tile padding)."""
    return d * math.ceil(n / d) if grouped and d > 1 else n


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
    for n, d in zip(spatial, dilation):
        extent = _axis_extent(n, d, True)
        t = min(base, extent)
        while t > 1 and math.ceil(extent / t) * t > n * 9 / 8:
            t //= 2
        tile.append(max(t, 1))
    return tuple(tile)


def divmod_index(x, n: int):
    """``(x // n, x % n)`` of a non-negative integer tensor by a constant ``n``.

    Powers of two become a shift and a mask: inside flex's kernel this runs per (query, key)
    pair, where floor division costs several instructions and a select.
    """
    if n & (n - 1) == 0:
        return x >> (n.bit_length() - 1), x & (n - 1)
    return x // n, x % n


class AxisCoords:
    """One axis's group coordinate, dilation group and group length of a position, as tensors."""

    def __init__(self, coord, group, group_len, real):
        self.coord, self.group, self.group_len, self.real = coord, group, group_len, real


class TileLayout:
    """Row-major tokens <-> tiled (padded) positions, and the arithmetic inverse for masks.

    Positions enumerate (tile index per axis, offset inside the tile per axis) in row-major
    order. ``src[p]`` (the row-major token at position ``p``, ``N`` for padding) and
    ``real[p]`` are built once on the CPU for tests and inspection; the hot path never
    gathers through them.
    """

    def __init__(self, spatial, tile, dilation, group_by_dilation: bool = True, device=None,
                 multiple: int = FLEX_BLOCK):
        self.spatial = tuple(int(n) for n in spatial)
        self.tile = tuple(int(t) for t in tile)
        self.dilation = tuple(int(d) for d in dilation)
        self.grouped = tuple(bool(group_by_dilation) and d > 1 for d in self.dilation)
        self.extent = tuple(_axis_extent(n, d, g) for n, d, g in zip(self.spatial, self.dilation, self.grouped))
        self.padded = tuple(math.ceil(e / t) * t for e, t in zip(self.extent, self.tile))
        self.num_tiles = tuple(p // t for p, t in zip(self.padded, self.tile))
        self.num_tokens = math.prod(self.spatial)
        self.num_tiled = math.prod(self.padded)  # positions of the tiles; then the tail padding
        self.num_positions = math.ceil(self.num_tiled / multiple) * multiple
        self.identity = self.padded == self.spatial and all(t == 1 for t in self.tile[:-1]) and not any(self.grouped)
        tokens = torch.arange(1, self.num_tokens + 1).reshape(1, *self.spatial, 1, 1)
        src = self.to_positions(tokens).reshape(-1) - 1  # padding (zeros) -> -1
        self.real = src >= 0
        self.src = torch.where(self.real, src, torch.full_like(src, self.num_tokens))

    # ------------------------------------------------------------------ tensors
    def to_positions(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, *spatial, H, D]`` -> ``[B, H, P, D]`` in tiled order (differentiable)."""
        return _pad_dim(self._to_tiles(x), 2, self.num_positions - self.num_tiled)

    def _to_tiles(self, x: torch.Tensor) -> torch.Tensor:
        if self.identity:
            b, h, d = x.shape[0], x.shape[-2], x.shape[-1]
            return x.reshape(b, self.num_tokens, h, d).transpose(1, 2)
        n_axes = len(self.spatial)
        for a in range(n_axes):  # group reorder and tile padding, axis by axis (dim 1 + a)
            dim, n = 1 + a, self.spatial[a]
            if self.grouped[a]:
                d = self.dilation[a]
                x = _pad_dim(x, dim, self.extent[a] - n)
                shape = x.shape
                x = x.reshape(*shape[:dim], self.extent[a] // d, d, *shape[dim + 1:]).transpose(dim, dim + 1)
                x = x.reshape(shape)
            x = _pad_dim(x, dim, self.padded[a] - self.extent[a])
        b, h, d = x.shape[0], x.shape[-2], x.shape[-1]
        split = [s for pair in zip(self.num_tiles, self.tile) for s in pair]
        x = x.reshape(b, *split, h, d)
        # [B, T0, t0, T1, t1, ..., H, D] -> [B, H, T0, T1, ..., t0, t1, ..., D]
        order = [0, 2 * n_axes + 1] + [1 + 2 * a for a in range(n_axes)] + [2 + 2 * a for a in range(n_axes)]
        return x.permute(*order, 2 * n_axes + 2).reshape(b, h, self.num_tiled, d)

    def from_positions(self, y: torch.Tensor) -> torch.Tensor:
        """``[B, H, P, *rest]`` -> ``[B, *spatial, H, *rest]`` (drops padding)."""
        b, h, rest = y.shape[0], y.shape[1], tuple(y.shape[3:])
        y = y.narrow(2, 0, self.num_tiled)
        if self.identity:
            return y.transpose(1, 2).reshape(b, *self.spatial, h, *rest)
        n_axes = len(self.spatial)
        y = y.reshape(b, h, *self.num_tiles, *self.tile, *rest)
        # [B, H, T0.., t0.., *rest] -> [B, T0, t0, T1, t1, ..., H, *rest]
        order = [0] + [p for a in range(n_axes) for p in (2 + a, 2 + n_axes + a)] + [1]
        order += list(range(2 + 2 * n_axes, y.dim()))
        y = y.permute(*order).reshape(b, *self.padded, h, *rest)
        for a in range(n_axes):
            dim = 1 + a
            y = y.narrow(dim, 0, self.extent[a])
            if self.grouped[a]:
                d, shape = self.dilation[a], y.shape
                y = y.reshape(*shape[:dim], d, self.extent[a] // d, *shape[dim + 1:]).transpose(dim, dim + 1)
                y = y.reshape(shape)
            y = y.narrow(dim, 0, self.spatial[a])
        return y

    # ------------------------------------------------------------------ arithmetic
    def decode(self, p, clamp: bool = False) -> List[AxisCoords]:
        """Per axis, where position tensor ``p`` lies, by integer arithmetic only (for mask_mods).

        ``clamp`` maps padding positions onto the last real-group slot of each axis (used for
        queries, so that a padded query row is never empty and its gradient stays finite).
        ``real`` is None where an axis has no padding at all.
        """
        n_axes = len(self.spatial)
        tail = None  # positions past the tiles (block padding): clamped queries, unreal keys
        if self.num_positions > self.num_tiled:
            if clamp:
                p = p.clamp(max=self.num_tiled - 1)
            else:
                tail = p < self.num_tiled
        volume = math.prod(self.tile)
        tile_index, offset = divmod_index(p, volume) if volume > 1 else (p, None)
        u = [None] * n_axes
        for a in reversed(range(n_axes)):
            t, m = self.tile[a], self.num_tiles[a]
            if a > 0:
                tile_index, ti = divmod_index(tile_index, m)
            else:
                ti = tile_index
            if t > 1:
                if a > 0:
                    offset, within = divmod_index(offset, t)
                else:
                    within = offset
                u[a] = (ti << (t.bit_length() - 1) | within) if t & (t - 1) == 0 else ti * t + within
            else:
                u[a] = ti
        axes = []
        for a in range(n_axes):
            n, d, ua = self.spatial[a], self.dilation[a], u[a]
            if clamp and self.padded[a] > self.extent[a]:
                ua = ua.clamp(max=self.extent[a] - 1)
            if d == 1:
                real = None if self.padded[a] == n or clamp else ua < n
                axes.append(AxisCoords(ua, None, n, real))
                continue
            if self.grouped[a]:
                g, c = divmod_index(ua, self.extent[a] // d)
            else:
                c, g = divmod_index(ua, d)
            group_len = (n - 1 - g) // d + 1  # ceil((n - g) / d)
            real = None
            if not clamp and self.padded[a] > n:
                real = (c * d + g < n) & (ua < self.extent[a])
            axes.append(AxisCoords(c, g, group_len, real))
        if tail is not None:
            axes[0].real = tail if axes[0].real is None else axes[0].real & tail
        return axes


def _pad_dim(x: torch.Tensor, dim: int, amount: int) -> torch.Tensor:
    """Zero-pad ``amount`` entries at the end of dimension ``dim``."""
    if amount <= 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, amount]
    return F.pad(x, pad)
