"""The neighborhood as a flex ``mask_mod`` (and RPB as a ``score_mod``), with a block-mask cache.

flex evaluates the mask_mod for every (query, key) pair of every partially masked block,
inside its kernel. Gathers from index tables there cost more than the attention itself
on mid-size windows, so both modifiers are pure integer arithmetic on ``q_idx``/``kv_idx``:
the layout decodes a position into per-axis (group coordinate, dilation group)
(:meth:`.TileLayout.decode`) and :func:`axis_in_window` applies docs/semantics.md's rule.
The only tensor read is the RPB table itself. Everything else is a Python int constant
baked into the compiled kernel.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Tuple

import torch

from .flex_layout import TileLayout, divmod_index

BLOCK_MASK_CACHE_SIZE = 32


def axis_in_window(qc, kc, group_len, kernel: int, stride: int, causal: bool):
    """Is group coordinate ``kc`` in the window of the query at group coordinate ``qc``?

    docs/semantics.md, steps 2-4, for one axis; ``group_len`` (the query's group length ``L_g``)
    is an int or a tensor. ``qc`` may lie past its group's end (clamped padding): the leader
    is always capped at ``L_g - 1``.
    """
    last = group_len - 1
    block = qc - divmod_index(qc, stride)[1] if stride > 1 else qc  # first query of the stride block
    if causal:
        leader = _minimum(block + (stride - 1), last)
        return (kc <= qc) & (leader - kc < kernel)
    leader = block + stride // 2
    left, right = kernel // 2, kernel // 2 + kernel % 2 - 1
    # k * d <= L makes L_g >= k, so left <= L_g - 1 - right: min then max is the clamp.
    centre = _minimum(leader, last - right).clamp(min=left)
    if left == right:
        return (kc - centre).abs() <= left
    return (kc >= centre - left) & (kc <= centre + right)


def _minimum(x, bound):
    return torch.minimum(x, bound) if isinstance(bound, torch.Tensor) else x.clamp(max=bound)


def neighborhood_mask_mod(layout: TileLayout, kernel, stride, causal) -> Callable:
    """flex ``mask_mod`` of the neighborhood over ``layout``'s positions (arithmetic only)."""
    kernel, stride, causal = tuple(kernel), tuple(stride), tuple(causal)

    def neighborhood(b, h, q_idx, kv_idx):
        qs, ks = layout.decode(q_idx, clamp=True), layout.decode(kv_idx)
        ok = None
        for qa, ka, k, s, c in zip(qs, ks, kernel, stride, causal):
            axis = axis_in_window(qa.coord, ka.coord, qa.group_len, k, s, c)
            if qa.group is not None:  # dilation: same group only
                axis = axis & (ka.group == qa.group)
            if ka.real is not None:  # padded keys are never attended
                axis = axis & ka.real
            ok = axis if ok is None else ok & axis
        return ok

    return neighborhood


def rpb_score_mod(layout: TileLayout, kernel, holder: list) -> Callable:
    """``score + table[h, (k'_a - q'_a) + k_a - 1 ...]`` in group coordinates (docs/semantics.md).

    The table ``[H, prod(2k - 1)]`` is read through ``holder[0]``; offsets are clamped so
    that masked pairs (which flex also scores) stay in bounds.
    """
    kernel = tuple(kernel)

    def bias(score, b, h, q_idx, kv_idx):
        qs, ks = layout.decode(q_idx, clamp=True), layout.decode(kv_idx, clamp=True)
        flat = None
        for qa, ka, k in zip(qs, ks, kernel):
            off = (ka.coord - qa.coord + (k - 1)).clamp(0, 2 * k - 2)
            flat = off if flat is None else flat * (2 * k - 1) + off
        return score + holder[0][h, flat].to(score.dtype)

    return bias


class NeighborhoodMask:
    """Layout, mask/score modifiers and block mask of one problem signature.

    ``tile=(1,) * n`` with ``group_by_dilation=False`` is plain row-major order: the recipe
    a user writes by hand (the bench's "flex (row-major)" row).
    """

    def __init__(self, spatial, kernel, stride, dilation, causal, device, tile=None, group_by_dilation=True):
        if tile is None:  # tiled or row-major, whichever flex should run faster
            from .flex_layout_choice import choose_layout_tile

            tile = choose_layout_tile(spatial, kernel, stride, dilation, causal)
        tile = tuple(tile)
        self.layout = TileLayout(spatial, tile, dilation, group_by_dilation, device)
        self.kernel, self.stride, self.causal = tuple(kernel), tuple(stride), tuple(causal)
        self.dilation = tuple(dilation)
        self.block_mask = None
        self.flex = None  # the flex call for this signature, set by the backend
        self._rpb_holder: list = [None]
        self._bias = None

    def mask_mod(self) -> Callable:
        return neighborhood_mask_mod(self.layout, self.kernel, self.stride, self.causal)

    def rpb_score_mod(self, rpb: torch.Tensor) -> Callable:
        """The RPB score_mod, one function object per problem signature.

        torch.compile guards a function argument by identity, so a fresh closure per call
        would recompile flex on every call; the table travels through a holder instead.
        :meth:`release_rpb` empties it.
        """
        self._rpb_holder[0] = rpb.flatten(1)  # [H, prod(2k - 1)]
        if self._bias is None:
            self._bias = rpb_score_mod(self.layout, self.kernel, self._rpb_holder)
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
