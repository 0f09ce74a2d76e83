"""Attention dropout for the tiled backend: the keep mask of a chunk of boxes, drawn in the
call's global indices (nattn/dropout.py: batch, query head, query token, key token of the
unfolded problem), so that every backend drops the same weights for the same ``rng``.

The tiled backend runs a class of dilation groups as extra batch entries on each group's own
token grid (backends/dilation_fold.py). A folded batch entry ``b'`` is batch ``b' // groups``
and group ``b' % groups``; a token at group coordinates ``j`` is the real token
``sum_a (first_a + group_a + j_a * dilation_a) * stride_a``: a per-entry base plus a
per-token offset, both precomputed here.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .. import dropout
from .dilation_fold import FoldClass
from .tiled_plan import outer


def _outer_sum(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every sum of one entry per axis, axis 0 slowest: ``[prod(len)]``."""
    return outer([v.view(1, -1) for v in values], torch.add).view(-1)


class BoxDropout:
    """The dropout factor (``1 / (1 - p)`` kept, 0 dropped) of one class's boxes."""

    # int64 temporaries per score while drawing (nattn/dropout.py): chunks shrink by it
    ELEMENTS_PER_WEIGHT = dropout.ELEMENTS_PER_WEIGHT

    def __init__(self, rng: torch.Tensor, p: float, batch: int, spatial: Sequence[int],
                 dilation: Sequence[int], cls: FoldClass):
        dev = rng.device
        strides = [math.prod(spatial[a + 1:]) for a in range(len(spatial))]
        groups = math.prod(cls.count)
        base = _outer_sum([(f + torch.arange(c)) * s for f, c, s in zip(cls.first, cls.count, strides)])
        self.base = base.repeat(batch).to(dev)  # [B * groups]: the folded entries' first token
        self.batch = torch.arange(batch).repeat_interleave(groups).to(dev)
        self.offset = _outer_sum([torch.arange(m) * d * s for m, d, s in zip(cls.lengths, dilation, strides)]).to(dev)
        self.rng, self.p = rng, p

    def factor(self, q_rows: torch.Tensor, k_idx: torch.Tensor, heads: int, dtype) -> torch.Tensor:
        """``[H, B', C, R, U]`` for the query rows ``q_rows [C, R]`` and keys ``k_idx [C, U]``
        (group-local token indices) of every query head."""
        c, r, u = q_rows.shape[0], q_rows.shape[1], k_idx.shape[1]
        base = self.base.view(1, -1, 1, 1, 1)
        query = base + self.offset[q_rows].view(1, 1, c, r, 1)
        key = base + self.offset[k_idx].view(1, 1, c, 1, u)
        head = torch.arange(heads, device=base.device).view(-1, 1, 1, 1, 1)
        keep = dropout.keep_mask(self.rng, self.p, self.batch.view(1, -1, 1, 1, 1), head, query, key)
        return keep.to(dtype) * (1.0 / (1.0 - self.p))
