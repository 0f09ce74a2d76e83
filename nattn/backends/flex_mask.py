"""The neighborhood as a flex ``mask_mod`` (and RPB as a ``score_mod``), with a block-mask cache.

The per-axis windows come from :func:`nattn.windows.axis_window`, the same tables the
reference uses: along one axis a query's keys are the coordinates of its dilation group
between the first and last valid window slot. So the mask is, per axis,
``lo[q] <= key <= hi[q]`` and ``key mod d == q mod d``, looked up through index tables in
the original coordinates of each tiled position (see :mod:`.flex_layout`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, List, Tuple

import torch

from ..windows import axis_window
from .flex_layout import TileLayout, choose_tile

BLOCK_MASK_CACHE_SIZE = 32


class NeighborhoodMask:
    """Index tables and the mask/score modifiers of one problem signature."""

    def __init__(self, spatial, kernel, stride, dilation, causal, device, tile=None, group_by_dilation=True):
        tile = choose_tile(spatial, dilation) if tile is None else tuple(tile)
        self.layout = TileLayout(spatial, tile, dilation, group_by_dilation, device)
        self.kernel, self.dilation = tuple(kernel), tuple(dilation)
        # Per axis, indexed by tiled position: window bounds [lo, hi] of the query there,
        # its dilation group, and its group coordinate (for the RPB offset).
        self.lo: List[torch.Tensor] = []
        self.hi: List[torch.Tensor] = []
        self.group: List[torch.Tensor] = []
        self.group_coord: List[torch.Tensor] = []
        for a, (n, k, s, d, c) in enumerate(zip(spatial, kernel, stride, dilation, causal)):
            key, valid, _ = axis_window(n, k, s, d, c)
            lo = key.masked_fill(~valid, n).amin(1).to(device)
            hi = key.masked_fill(~valid, -1).amax(1).to(device)
            coord = self.layout.coords[a]
            self.lo.append(lo[coord])
            self.hi.append(hi[coord])
            self.group.append(coord % d)
            self.group_coord.append(coord // d)
        self.block_mask = None
        self.flex = None  # the flex call for this signature, set by the backend
        self._rpb_holder: list = [None]
        self._bias = None

    def mask_mod(self) -> Callable:
        coords, lo, hi, group, real = self.layout.coords, self.lo, self.hi, self.group, self.layout.real

        def neighborhood(b, h, q_idx, kv_idx):
            ok = real[kv_idx]  # padded keys are never attended
            for a in range(len(coords)):
                key = coords[a][kv_idx]
                ok = ok & (key >= lo[a][q_idx]) & (key <= hi[a][q_idx]) & (group[a][kv_idx] == group[a][q_idx])
            return ok

        return neighborhood

    def rpb_score_mod(self, rpb: torch.Tensor) -> Callable:
        """``score + rpb[h, (k'_a - q'_a) + k_a - 1 ...]`` in group coordinates (SEMANTICS.md).

        One function object per problem signature, reading the table through a holder:
        torch.compile guards a function argument by identity, so a fresh closure per call
        would recompile flex on every call. :meth:`release_rpb` empties the holder.
        """
        self._rpb_holder[0] = rpb.flatten(1)  # [H, prod(2k - 1)]
        if self._bias is None:
            holder, gc, kernel = self._rpb_holder, self.group_coord, self.kernel

            def bias(score, b, h, q_idx, kv_idx):
                flat = None
                for a in range(len(gc)):
                    off = (gc[a][kv_idx] - gc[a][q_idx] + (kernel[a] - 1)).clamp(0, 2 * kernel[a] - 2)
                    flat = off if flat is None else flat * (2 * kernel[a] - 1) + off
                return score + holder[0][h, flat].to(score.dtype)

            self._bias = bias
        return self._bias

    def release_rpb(self) -> None:
        self._rpb_holder[0] = None


class MaskCache:
    """Bounded LRU cache: problem signature -> :class:`NeighborhoodMask` with its block mask."""

    def __init__(self, size: int = BLOCK_MASK_CACHE_SIZE):
        self.size = size
        self._entries: "OrderedDict[Tuple, NeighborhoodMask]" = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, spatial, params, device, build_block_mask, tile=None, group_by_dilation=True) -> NeighborhoodMask:
        key = (tuple(spatial), params.kernel_size, params.stride, params.dilation, params.is_causal,
               str(device), tile, group_by_dilation)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        entry = NeighborhoodMask(spatial, params.kernel_size, params.stride, params.dilation,
                                 params.is_causal, device, tile, group_by_dilation)
        entry.block_mask = build_block_mask(entry)
        self._entries[key] = entry
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return entry
