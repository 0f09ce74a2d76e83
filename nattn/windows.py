"""The neighborhood of each query, axis by axis, exactly as docs/semantics.md defines it.

For one axis, :func:`axis_window` returns, for every query coordinate ``i`` and every
window slot ``t`` in ``0..k-1``, the key coordinate, whether that slot is a real key
(causal windows near the start hold fewer than ``k``), and the RPB table offset. A query
attends to the Cartesian product of its per-axis slots; :func:`window_indices` combines
the axes into flat token indices for any chunk of queries, so no caller ever needs an
N x N structure.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import torch


def _window_base(ig, group_len, kernel: int, stride: int, causal: bool):
    """Group coordinate of window slot 0 for queries at group coordinates ``ig`` (negative
    for causal windows near the start, whose first slots hold no key)."""
    block = (ig // stride) * stride
    if causal:
        leader = torch.minimum(block + stride - 1, group_len - 1)
        return leader - kernel + 1  # the window ends at the leader
    leader = torch.minimum(block + stride // 2, group_len - 1)
    left = kernel // 2
    right = kernel // 2 + kernel % 2 - 1
    centre = torch.maximum(torch.minimum(leader, group_len - 1 - right), torch.full_like(leader, left))
    return centre - left


def axis_window(
    length: int, kernel: int, stride: int, dilation: int, causal: bool, device=None, queries=None
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-axis window: ``(key_coord, valid, rpb_offset)``, each ``[length, kernel]``, or
    ``[len(queries), kernel]`` for just the query coordinates ``queries`` of the axis."""
    i = torch.arange(length, device=device) if queries is None else torch.as_tensor(queries, device=device)
    group = i % dilation  # dilation group of the query
    ig = i // dilation  # coordinate inside the group
    group_len = (length - group + dilation - 1) // dilation  # ceil((L - g) / d)
    t = torch.arange(kernel, device=device)
    jg = _window_base(ig, group_len, kernel, stride, causal)[:, None] + t[None, :]
    if causal:
        valid = (jg >= 0) & (jg <= ig[:, None])
    else:
        valid = torch.ones(i.shape[0], kernel, dtype=torch.bool, device=device)
    key_coord = jg.clamp(min=0) * dilation + group[:, None]
    rpb_offset = jg - ig[:, None] + kernel - 1
    return key_coord, valid, rpb_offset


def axis_window_start(length: int, kernel: int, stride: int, causal: bool) -> torch.Tensor:
    """``[length]``: the coordinate of window slot 0 of every query of an undilated axis (slot
    ``t`` is that plus ``t``; negative for causal windows near the start, whose first slots
    hold no key)."""
    ig = torch.arange(length)
    return _window_base(ig, torch.full_like(ig, length), kernel, stride, causal)


def axis_key_interval(length: int, kernel: int, stride: int, causal: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(first, last)``, each ``[length]``: the keys every query of an undilated axis of
    ``length`` attends to are ``first..last`` (inclusive; contiguous, as in
    :func:`axis_window`: a dilated axis is this per dilation group). Costs O(length), where
    :func:`axis_window` builds ``[length, kernel]`` tables."""
    ig = torch.arange(length)
    base = axis_window_start(length, kernel, stride, causal)
    if causal:
        return base.clamp(min=0), ig
    return base, base + kernel - 1


class WindowTable:
    """Per-axis windows of one problem, combined on demand for a chunk of queries."""

    def __init__(self, spatial: Sequence[int], kernel, stride, dilation, causal, device=None):
        self.spatial = tuple(spatial)
        self.kernel = tuple(kernel)
        self.axes = [
            axis_window(n, k, s, d, c, device)
            for n, k, s, d, c in zip(spatial, kernel, stride, dilation, causal)
        ]
        self.rpb_sizes = tuple(2 * k - 1 for k in kernel)

    @property
    def num_tokens(self) -> int:
        return math.prod(self.spatial)

    @property
    def window_size(self) -> int:
        return math.prod(self.kernel)

    def bias(self, rpb: torch.Tensor, dtype: torch.dtype, rpb_idx=None) -> torch.Tensor:
        """``rpb`` ``[H, 2k-1, ...]`` at every query's window slots: ``[N, H, W]`` in ``dtype``
        (heads before slots, as the logits hold them); ``rpb_idx`` the flat RPB index of
        :meth:`chunk` over all queries when the caller already has it."""
        idx = self.chunk(0, self.num_tokens)[2] if rpb_idx is None else rpb_idx
        # rows of the transposed table: a gather along dim 1 runs ~15x slower (CPU)
        rows = rpb.flatten(1).t().contiguous().index_select(0, idx.reshape(-1))
        return rows.view(*idx.shape, -1).to(dtype).permute(0, 2, 1)

    def chunk(self, start: int, stop: int):
        """Flat key index, validity and flat RPB index of queries ``start..stop-1``.

        Each is ``[stop - start, W]``; the window slot order is row-major over the
        per-axis slots. Invalid slots point at a real token (index clamped) so that a
        gather is always in bounds; callers mask them.
        """
        q = torch.arange(start, stop, device=self.axes[0][0].device)
        coords = []
        for n in reversed(self.spatial):  # unravel the flat query index, row-major
            coords.append(q % n)
            q = q // n
        coords.reverse()
        key = valid = rpb = None
        for axis, (c, (kc, vm, ro)) in enumerate(zip(coords, self.axes)):
            k_ax, v_ax, r_ax = kc[c], vm[c], ro[c]  # [C, k_axis]
            if key is None:
                key, valid, rpb = k_ax, v_ax, r_ax
                continue
            # Cartesian product with the slots seen so far (row-major: new axis last).
            n, size = self.spatial[axis], self.rpb_sizes[axis]
            key = (key[:, :, None] * n + k_ax[:, None, :]).flatten(1)
            valid = (valid[:, :, None] & v_ax[:, None, :]).flatten(1)
            rpb = (rpb[:, :, None] * size + r_ax[:, None, :]).flatten(1)
        return key, valid, rpb
