"""Dilation groups folded into the batch, for backends that run undilated NA only.

With dilation ``d`` along an axis of ``L`` tokens, the tokens ``g, g + d, g + 2d, ...`` (group
``g``) form an undilated axis of their own: NA with dilation is undilated NA on every group
(docs/semantics.md). Groups ``0 .. L % d - 1`` hold ``ceil(L / d)`` tokens, the others
``L // d``: per axis at most two lengths, so at most ``2 ** na_dim`` classes of groups of
equal lengths. :func:`fold` turns a class into extra batch entries (``[B * groups, *lengths,
...]``); results go into :func:`class_view`'s views (:func:`each_class` runs both).
Tensors are first padded along the axes where ``L % d != 0`` (:func:`padded`; a view where
none is), so that every class is a strided view of one tensor.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch


@dataclass(frozen=True)
class FoldClass:
    lengths: Tuple[int, ...]  # per axis: tokens of each group in the class
    first: Tuple[int, ...]  # per axis: the class's first group
    count: Tuple[int, ...]  # per axis: its number of groups


def fold_classes(spatial: Sequence[int], dilation: Sequence[int]) -> List[FoldClass]:
    per_axis = []
    for n, d in zip(spatial, dilation):
        long = n % d
        options = [(-(-n // d), 0, long)] if long else []
        options += [(n // d, long, d - long)]
        per_axis.append(options)
    return [FoldClass(*map(tuple, zip(*combo))) for combo in itertools.product(*per_axis)]


def padded_shape(x: torch.Tensor, spatial: Sequence[int], dilation: Sequence[int]) -> Tuple[int, ...]:
    return (x.shape[0], *[-(-n // d) * d for n, d in zip(spatial, dilation)], *x.shape[1 + len(spatial):])


def padded(x: torch.Tensor, spatial: Sequence[int], dilation: Sequence[int]) -> torch.Tensor:
    """``x [B, *spatial, ...]`` zero-padded along each axis to a multiple of its dilation."""
    shape = padded_shape(x, spatial, dilation)
    if tuple(shape) == tuple(x.shape):
        return x
    out = x.new_zeros(shape)
    out[(slice(None),) + tuple(slice(0, n) for n in spatial)] = x
    return out


def unpadded(x: torch.Tensor, spatial: Sequence[int]) -> torch.Tensor:
    """:func:`padded`'s inverse: ``x`` cut back to ``spatial`` (contiguous; ``x`` itself when
    nothing was padded)."""
    if tuple(x.shape[1 : 1 + len(spatial)]) == tuple(spatial):
        return x
    return x[(slice(None),) + tuple(slice(0, n) for n in spatial)].contiguous()


def class_view(x: torch.Tensor, cls: FoldClass, dilation: Sequence[int]) -> torch.Tensor:
    """The class's tokens of padded ``x``: a view ``[B, *count, *lengths, ...]``."""
    na = len(cls.lengths)
    for a in reversed(range(na)):  # last axis first: the earlier axes' dims stay put
        dim, m, d = 1 + a, cls.lengths[a], dilation[a]
        x = x.narrow(dim, 0, m * d).unflatten(dim, (m, d)).narrow(dim + 1, cls.first[a], cls.count[a])
    # dims now [B, m0, c0, m1, c1, ...]: the group counts first
    order = [0] + [2 + 2 * a for a in range(na)] + [1 + 2 * a for a in range(na)]
    return x.permute(*order, *range(1 + 2 * na, x.dim()))


def fold(x: torch.Tensor, cls: FoldClass, dilation: Sequence[int]) -> torch.Tensor:
    """``[B * prod(count), *lengths, ...]``: the class's groups as batch entries (a view when
    the class is the whole undilated tensor, else a copy)."""
    v = class_view(x, cls, dilation)
    return v.reshape(x.shape[0] * math.prod(cls.count), *cls.lengths, *x.shape[1 + len(cls.lengths):])


def undilated(params):
    """``params`` (an NAParams) with dilation 1 on every axis: what each folded class runs."""
    return dataclasses.replace(params, dilation=(1,) * len(params.dilation))


def each_class(spatial: Sequence[int], dilation: Sequence[int], inputs, outputs, run) -> list:
    """``run(cls, folded inputs, the class's views of outputs)`` for every class; ``outputs``
    are allocated padded (:func:`padded_shape`) by the caller and returned unpadded."""
    if all(d == 1 for d in dilation):  # one class, the tensors themselves (no views to build)
        cls = FoldClass(tuple(spatial), (0,) * len(spatial), (1,) * len(spatial))
        ones = (1,) * len(spatial)
        run(cls, list(inputs), [o.view(o.shape[0], *ones, *o.shape[1:]) for o in outputs])
        return list(outputs)
    padded_in = [padded(x, spatial, dilation) for x in inputs]
    for cls in fold_classes(spatial, dilation):
        run(cls, [fold(x, cls, dilation) for x in padded_in], [class_view(o, cls, dilation) for o in outputs])
    return [unpadded(o, spatial) for o in outputs]
