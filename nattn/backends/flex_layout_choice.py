"""Tiled or row-major? Pick the flex token order by an estimate of the blocks flex will run.

flex's cost is, roughly, one unit per fully visible 128x128 block and more for a partial
block, where the mask is evaluated per (query, key) pair; the tiled layout's position decode
makes that evaluation dearer than row-major's. Measured on the H200 (docs/dev/PERF.md,
flexfast): tiles win by far on large windows (flux 80x80: 47 full + 7 partial blocks per
query block vs 160 partial row-major) but lose on small ones (video-3d 5x7x7: 17.2 vs 13.8
partial blocks, and row-major flex ran 2.6x faster there).

The estimate samples query blocks: per axis, the union / intersection of the windows of the
block's query coordinates (exact per axis, a product over axes: an overestimate of the
union for query blocks that are not boxes), then counts key blocks touched / fully covered.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch

from .flex_layout import TileLayout, choose_tile

BLOCK = 128  # flex's default sparse block size
PARTIAL_COST = 2.0  # a partial block vs a full one (mask evaluated per pair); an assumption
TILED_DECODE_COST = 1.25  # tiled partial blocks: the position decode costs extra; an assumption
MAX_AXIS = 4096  # per-axis window tables are L x L booleans
SAMPLES = 24


def axis_window_table(length: int, kernel: int, stride: int, dilation: int, causal: bool) -> torch.Tensor:
    """``[L, L]`` booleans: is key ``j`` in the window of query ``i`` (docs/semantics.md)."""
    from .flex_mask import axis_in_window  # the same rule as the mask_mod

    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    g = i % dilation
    ok = axis_in_window(i // dilation, j // dilation, (length - 1 - g) // dilation + 1, kernel, stride, causal)
    return ok & (j % dilation == g)


def estimate_cost(layout: TileLayout, tables: Sequence[torch.Tensor], tiled: bool) -> float:
    """Estimated flex cost per query block (full blocks count 1, partial ones more)."""
    spatial, n_tokens, n_pos = layout.spatial, layout.num_tokens, layout.num_positions
    position = torch.empty(n_tokens, dtype=torch.long)
    position[layout.src[layout.real]] = torch.arange(n_pos)[layout.real]
    n_blocks = math.ceil(n_pos / BLOCK)
    picks = torch.linspace(0, n_blocks - 1, min(SAMPLES, n_blocks)).round().long().unique()
    strides = [math.prod(spatial[a + 1:]) for a in range(len(spatial))]
    full = partial = 0
    for qb in picks.tolist():
        tokens = layout.src[qb * BLOCK: min(n_pos, (qb + 1) * BLOCK)]
        tokens = tokens[tokens < n_tokens]
        if tokens.numel() == 0:
            continue
        coords = [(tokens // s) % n for s, n in zip(strides, spatial)]
        rows = [t[c] for t, c in zip(tables, coords)]
        touched = _key_blocks(rows, strides, position, lambda r: r.any(0))
        covered = _key_blocks(rows, strides, position, lambda r: r.all(0))
        nonempty = touched.nonzero().numel()
        n_full = int((covered == BLOCK).sum())
        full += n_full
        partial += nonempty - n_full
    cost = PARTIAL_COST * (TILED_DECODE_COST if tiled else 1.0)
    return (full + cost * partial) / max(len(picks), 1)


def _key_blocks(rows, strides, position, reduce) -> torch.Tensor:
    """Keys per key block in the product over axes of ``reduce(rows)`` (a bincount)."""
    flat = torch.zeros(1, dtype=torch.long)
    for r, s in zip(rows, strides):
        keys = reduce(r).nonzero()[:, 0]
        flat = (flat[:, None] + keys[None, :] * s).reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(1, dtype=torch.long)
    return torch.bincount(position[flat] // BLOCK)


def choose_layout_tile(spatial, kernel, stride, dilation, causal) -> Tuple[int, ...]:
    """:func:`choose_tile`'s tiles, or row-major (all 1) when its estimated cost is lower."""
    tile = choose_tile(spatial, dilation)
    row_major = (1,) * len(spatial)
    if tile == row_major or max(spatial) > MAX_AXIS:
        return tile
    tables = [axis_window_table(*args) for args in zip(spatial, kernel, stride, dilation, causal)]
    tiled_cost = estimate_cost(TileLayout(spatial, tile, dilation), tables, tiled=True)
    flat_cost = estimate_cost(TileLayout(spatial, row_major, dilation), tables, tiled=False)
    return row_major if flat_cost < tiled_cost else tile
