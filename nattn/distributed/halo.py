"""Spatial halo neighborhood attention: every rank keeps its heads and its shard of the
queries, and receives only the keys and values its queries' windows reach (the halo) from
the ranks that own them; the backward returns the halo's dK and dV to their owners.

The local attention runs on the region of the axis that holds the rank's queries and their
windows, widened to whole stride x dilation blocks so that every window, dilation group and
stride leader is the one of the unsharded problem; the region's other queries are zeros and
their outputs are dropped. Where the cuda backend runs the region (no extra keys/values), it
is told the rank's query range: the Hopper kernels then compute only the query boxes that
hold the rank's queries, not the halo's (other backends compute the whole region); the
traffic is the halo alone either way."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist

from .._eager import _functorch_active, _no_autocast, eager_ok, na_backward_saved
from ..backends import get as get_backend
from ..functional import _checked_and_chosen, neighborhood_attention
from ..params import BoolOrTuple, IntOrTuple, normalize_window_args
from ..windows import axis_window
from .ulysses import _AllToAll, _all_sizes, _check_shards, _pad_to, _world


def region(start: int, stop: int, length: int, k: int, s: int, d: int, causal: bool) -> Tuple[int, int]:
    """The [lo, hi) of the axis (real coordinates) on which NA of queries [start, stop)
    gives exactly their windows in the whole axis of ``length``."""
    # windows are monotone within a dilation group: its first and last query decide
    ends = {q for g in range(d) for q in (start + (g - start) % d, stop - 1 - (stop - 1 - g) % d)
            if start <= q < stop}
    keys, valid, _ = axis_window(length, k, s, d, causal, queries=sorted(ends))
    lo, hi = min(start, int(keys[valid].min())), max(stop, int(keys[valid].max()) + 1)
    block = s * d  # whole stride blocks of every group, on a group-aligned origin
    lo = lo // block * block
    hi = min(length, -(-hi // block) * block)
    while hi - lo < k * d and (hi < length or lo > 0):  # NA needs kernel * dilation tokens
        hi, lo = (min(length, hi + block), lo) if hi < length else (hi, max(0, lo - block))
    return lo, hi


class _HaloGather(torch.autograd.Function):
    """This rank's shard -> the region [lo, hi) of the axis it needs (pieces from the ranks
    that own them, one all-to-all); backward: the region's gradient back to its owners, summed."""

    @staticmethod
    def forward(ctx, x, axis_dim, send, recv, longest, group):
        ctx.axis_dim, ctx.send, ctx.recv, ctx.longest, ctx.group = axis_dim, send, recv, longest, group
        ctx.local_len = x.shape[axis_dim]
        blocks = [_pad_to(x.narrow(axis_dim, a, n), axis_dim, longest) for a, n in send]
        got = _AllToAll.apply(torch.stack(blocks), group)
        return torch.cat([got[j].narrow(axis_dim, 0, n) for j, n in enumerate(recv) if n], dim=axis_dim)

    @staticmethod
    def backward(ctx, grad):
        axis_dim, longest = ctx.axis_dim, ctx.longest
        pieces, offset = [], 0
        for n in ctx.recv:
            pieces.append(_pad_to(grad.narrow(axis_dim, offset, n), axis_dim, longest))
            offset += n
        back = torch.empty_like(torch.stack(pieces))
        dist.all_to_all_single(back, torch.stack(pieces).contiguous(), group=ctx.group)
        shape = list(grad.shape)
        shape[axis_dim] = ctx.local_len
        out = grad.new_zeros(shape)
        for r, (a, n) in enumerate(ctx.send):
            if n:
                out.narrow(axis_dim, a, n).add_(back[r].narrow(axis_dim, 0, n))
        return out, None, None, None, None, None


class _RangedNA(torch.autograd.Function):
    """NA of the region through the cuda backend with only ``query_range``'s queries needed
    (the caller uses no other row: their output gradient is zero): the rows the forward leaves
    out hold output 0 and LSE +inf, and the backward walks the range's queries only."""

    @staticmethod
    def forward(ctx, q, k, v, rpb, params, name, query_range):
        impl = get_backend(name)
        with _no_autocast(q, impl):
            out, lse = impl.na_forward(q, k, v, rpb, params, query_range=query_range)
        ctx.save_for_backward(q, k, v, rpb, out, lse)
        ctx.params, ctx.backend, ctx.query_range = params, name, query_range
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return (*na_backward_saved(ctx, grad_out, grad_lse, query_range=ctx.query_range), None, None, None)


def _region_na(q, k, v, kernel_size, stride, dilation, is_causal, scale, additional_keys, additional_values,
               rpb, backend, na_dim, query_range):
    """(out, lse) of NA on the region: through _RangedNA where the cuda backend runs it, else
    the plain functional call (every row computed)."""
    # nothing watching the call (compile, FLOP counters, functorch: the op path below)
    if additional_keys is None and additional_values is None and q.is_cuda and eager_ok(q, k, v, rpb) \
            and not _functorch_active():
        params, name = _checked_and_chosen(q, k, v, na_dim, kernel_size, stride, dilation, is_causal, scale,
                                           rpb, None, None, backend, None, None)
        if name.split(":")[0] == "cuda":
            return _RangedNA.apply(q, k, v, rpb, params, name, query_range)
    return neighborhood_attention(q, k, v, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                                  additional_values, rpb, backend, True, na_dim=na_dim)


def na_halo(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kernel_size: IntOrTuple,
    stride: IntOrTuple = 1, dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False,
    scale: Optional[float] = None, additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None, rpb: Optional[torch.Tensor] = None,
    backend: Optional[str] = None, return_lse: bool = False, *, na_dim: int, axis: int = 0, group=None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Neighborhood attention of inputs sharded along spatial ``axis`` over ``group``, moving
    only the key/value halo.

    Same arguments, inputs and results as :func:`na_ulysses` (contiguous shards in rank
    order, uneven allowed; this rank's shard of the output and LSE); no condition on the
    heads. Each rank computes the region of the axis its queries' windows need
    (:func:`region`), receives the keys and values of that region it does not own, and runs
    NA there; the backward sends the region's key/value gradients back to their owners.
    ``rpb`` and the extra keys/values are used whole on every rank: their gradients on a
    rank are that rank's queries' share; sum them over the group.
    """
    world, rank = _world(group)
    _check_shards(query, key, value, na_dim, axis)
    kernel, strides, dilations, causal = normalize_window_args(na_dim, kernel_size, stride, dilation, is_causal)
    axis_dim = 1 + axis
    sizes = _all_sizes(query.shape[axis_dim], group, query.device)
    if min(sizes) < 1:
        raise ValueError(f"every rank needs a non-empty shard along axis {axis}, got shard sizes {sizes}")
    starts = [sum(sizes[:r]) for r in range(world)]
    length = sum(sizes)
    lo, hi = region(starts[rank], starts[rank] + sizes[rank], length, kernel[axis], strides[axis],
                    dilations[axis], causal[axis])
    # every rank's region, so that each knows what to send to whom
    mine = torch.tensor([lo, hi], dtype=torch.int64, device=query.device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    regions = [tuple(int(x) for x in t.tolist()) for t in every]

    def overlap(a0, a1, b0, b1):
        return max(a0, b0), max(0, min(a1, b1) - max(a0, b0))
    own0, own1 = starts[rank], starts[rank] + sizes[rank]
    send = []  # (local offset, length) of my shard in rank r's region
    for r0, r1 in regions:
        a, n = overlap(own0, own1, r0, r1)
        send.append((a - own0 if n else 0, n))
    recv = [overlap(starts[j], starts[j] + sizes[j], lo, hi)[1] for j in range(world)]
    longest = max([1] + [overlap(starts[j], starts[j] + sizes[j], r0, r1)[1]
                         for j in range(world) for r0, r1 in regions])
    k_region = _HaloGather.apply(key, axis_dim, send, recv, longest, group)
    v_region = _HaloGather.apply(value, axis_dim, send, recv, longest, group)
    def zeros(n):
        shape = list(query.shape)
        shape[axis_dim] = n
        return query.new_zeros(shape)
    q_region = torch.cat([zeros(own0 - lo), query, zeros(hi - own1)], dim=axis_dim)  # others' queries: 0
    query_range = [(0, n) for n in query.shape[1 : 1 + na_dim]]
    query_range[axis] = (own0 - lo, own1 - lo)  # this rank's queries in the region
    out, lse = _region_na(q_region, k_region, v_region, kernel_size, stride, dilation, is_causal, scale,
                          additional_keys, additional_values, rpb, backend, na_dim, tuple(query_range))
    out = out.narrow(axis_dim, own0 - lo, sizes[rank])
    if not return_lse:
        return out
    return out, lse.narrow(axis_dim, own0 - lo, sizes[rank])
