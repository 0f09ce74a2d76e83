"""Spatial halo neighborhood attention: every rank keeps its heads and its shard of the
queries, and receives only the keys and values its queries' windows reach (the halo) from
the ranks that own them; the backward returns the halo's dK and dV to their owners.

The local attention runs on the region of the axis that holds the rank's queries and their
windows, widened to whole stride x dilation blocks so that every window, dilation group and
stride leader is the one of the unsharded problem; the region's other queries are zeros and
their outputs are dropped. Where the cuda backend runs the region (no extra keys/values), it
is told the rank's query range: the Hopper kernels then compute only the query boxes that
hold the rank's queries, not the halo's (other backends compute the whole region); the
traffic is the halo alone either way.

With ``overlap=True`` the exchange runs while the rank computes its interior queries (those
whose windows lie in its own shard: :func:`interior`) on its own keys and values; the
queries next to the shard's ends follow once the halo has arrived."""

from __future__ import annotations

from functools import lru_cache
from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .._eager import _functorch_active, _no_autocast, eager_ok, na_backward_saved
from ..backends import get as get_backend
from ..functional import _checked_and_chosen, neighborhood_attention
from ..params import BoolOrTuple, IntOrTuple, normalize_window_args
from ..windows import axis_window
from .ulysses import _all_sizes, _check_shards, _exchange, _pad_to, _world


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


@lru_cache(maxsize=1024)
def interior(start: int, stop: int, length: int, k: int, s: int, d: int, causal: bool) -> Optional[Tuple[int, int]]:
    """Queries [a, b) inside the shard [start, stop) whose region (:func:`region`) lies inside
    the shard too, so that NA on the shard's own keys and values gives their exact windows:
    the shard with a and b moved inwards one query at a time until that holds. None when no
    query qualifies."""
    a, b = start, stop
    while a < b:
        lo, hi = region(a, b, length, k, s, d, causal)
        if lo >= start and hi <= stop:
            return a, b
        a, b = a + (lo < start), b - (hi > stop)
    return None


def _pack(tensors, send, axis_dim: int, longest: int) -> torch.Tensor:
    """The exchange's send buffer [P, ...]: for rank r the piece ``send[r]`` (local offset,
    length along the axis) of every tensor, heads x channels side by side in a token's row,
    padded to ``longest``."""
    flat = [t.flatten(-2) for t in tensors]
    return torch.stack([_pad_to(torch.cat([t.narrow(axis_dim, a, n) for t in flat], dim=-1), axis_dim, longest)
                        for a, n in send])


def _add_pieces(grads, back: torch.Tensor, send, axis_dim: int, copy: bool = True) -> list:
    """``grads`` (one per tensor; added into in place unless ``copy``) plus the pieces'
    gradients ``back`` [P, ...] that the other ranks returned, at the offsets the pieces were
    sent from."""
    out, offset = [], 0
    for g in grads:
        g = g.clone() if copy else g
        flat, width = g.flatten(-2), g.shape[-2] * g.shape[-1]
        for r, (a, n) in enumerate(send):
            if n:
                flat.narrow(axis_dim, a, n).add_(back[r].narrow(axis_dim, 0, n).narrow(-1, offset, width))
        out.append(g)
        offset += width
    return out


class _HaloGather(torch.autograd.Function):
    """This rank's shards of ``tensors`` [B, *spatial, heads, channels] -> the pieces of other
    ranks' shards it needs (one all-to-all of :func:`_pack`'s buffer; :func:`_region_of`
    joins them into the region [lo, hi)); backward: the pieces' gradients back to their
    owners, summed."""

    @staticmethod
    def forward(ctx, axis_dim, send, longest, group, *tensors):
        ctx.axis_dim, ctx.send, ctx.group = axis_dim, send, group
        got = _exchange(_pack(tensors, send, axis_dim, longest), group)[0]
        ctx.shapes = [t.shape for t in tensors]
        return got

    @staticmethod
    def backward(ctx, grad):
        back = _exchange(grad, ctx.group)[0]
        zeros = [grad.new_zeros(shape) for shape in ctx.shapes]
        return (None, None, None, None, *_add_pieces(zeros, back, ctx.send, ctx.axis_dim, copy=False))


# The overlapped exchange (na_halo(overlap=True)), forward and backward. Forward: _HaloEnd
# marks k and v, the exchange starts outside autograd, the interior's NA runs, then
# _HaloWait waits and hands the pieces to autograd. Backward (autograd runs nodes created
# later first): _HaloWait's backward starts the pieces' gradients back to their owners
# without waiting, the interior's NA backward runs meanwhile, and _HaloEnd's backward (its
# inputs' last consumer) waits and adds what came back.
class _HaloEnd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, state, *tensors):
        ctx.state = state
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        work, back, send, axis_dim = ctx.state.pop("returning")
        work.wait()
        return (None, *_add_pieces(grads, back, send, axis_dim))


class _HaloWait(torch.autograd.Function):
    @staticmethod
    def forward(ctx, state, *tensors):
        ctx.state = state
        work, got = state.pop("arriving")
        work.wait()
        return got

    @staticmethod
    def backward(ctx, grad):
        back, work = _exchange(grad, ctx.state["group"], async_op=True)
        ctx.state["returning"] = (work, back, ctx.state["send"], ctx.state["axis_dim"])
        return (None, *(None for _ in ctx.needs_input_grad[1:]))


def _region_of(got: torch.Tensor, recv: List[int], axis_dim: int, rank: int, own: List[torch.Tensor],
               widths: List[int]) -> List[torch.Tensor]:
    """The region [lo, hi) of each gathered tensor (``widths``: their heads x channels in
    _HaloGather's rows): the other ranks' pieces (rank order is axis order) around this
    rank's own part ``own`` (a list of the tensors' slices), which never travels. Empty
    pieces are kept: every rank's region then depends on ``got``, so every rank runs the
    gather's backward collective, even one whose region is its own shard."""
    out, offset = [], 0
    for i, width in enumerate(widths):
        pieces = [own[i] if j == rank else got[j].narrow(axis_dim, 0, n).narrow(-1, offset, width).unflatten(
            -1, own[i].shape[-2:]) for j, n in enumerate(recv)]
        out.append(torch.cat(pieces, dim=axis_dim))
        offset += width
    return out


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
    overlap: bool = False,
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

    ``overlap=True``: the key/value exchange runs while the rank computes its interior
    queries (:func:`interior`) from its own keys and values; the queries at the shard's ends
    follow on their regions once the halo has arrived (three NA calls instead of one; the
    same results). In the backward the halo's key/value gradients travel back while the
    interior's NA backward runs.
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

    def meet(a0, a1, b0, b1):
        return max(a0, b0), max(0, min(a1, b1) - max(a0, b0))
    own0, own1 = starts[rank], starts[rank] + sizes[rank]
    send = []  # (local offset, length) of my shard in rank r's region; nothing to myself
    for r, (r0, r1) in enumerate(regions):
        a, n = meet(own0, own1, r0, r1)
        send.append((a - own0, n) if n and r != rank else (0, 0))
    recv = [meet(starts[j], starts[j] + sizes[j], lo, hi)[1] for j in range(world)]
    # the longest piece that travels (a rank's own part of its region stays where it is)
    longest = max([1] + [meet(starts[j], starts[j] + sizes[j], r0, r1)[1]
                         for j in range(world) for r, (r0, r1) in enumerate(regions) if r != j])
    window = (kernel[axis], strides[axis], dilations[axis], causal[axis])
    inner = interior(own0, own1, length, *window) if overlap else None
    if inner == (own0, own1):  # no query would wait for the halo: the plain path
        inner = None

    def part(q, k, v, first, start, stop):
        """(out, lse) of queries [start, stop) (axis coordinates) from q, k, v holding the
        axis from ``first`` on."""
        query_range = [(0, n) for n in q.shape[1 : 1 + na_dim]]
        query_range[axis] = (start - first, stop - first)
        out, lse = _region_na(q, k, v, kernel_size, stride, dilation, is_causal, scale, additional_keys,
                              additional_values, rpb, backend, na_dim, tuple(query_range))
        return out.narrow(axis_dim, start - first, stop - start), lse.narrow(axis_dim, start - first, stop - start)

    # keys and values in one exchange (one collective each way: every rank issues the same ones
    # in the same order, whatever its part of the graph)
    parts = []
    if inner is None:
        kv_got = _HaloGather.apply(axis_dim, send, longest, group, key, value)
    else:  # the interior from this rank's own shard while the exchange runs (and in backward)
        state = dict(group=group, send=send, axis_dim=axis_dim)
        key, value = _HaloEnd.apply(state, key, value)
        with torch.no_grad():
            got, work = _exchange(_pack((key, value), send, axis_dim, longest), group, async_op=True)
            state["arriving"] = (work, got)
        i0, i1 = region(*inner, length, *window)
        own = [t.narrow(axis_dim, i0 - own0, i1 - i0) for t in (query, key, value)]
        parts.append(part(*own, i0, *inner))
        kv_got = _HaloWait.apply(state, key, value)
    mine = meet(own0, own1, lo, hi)
    own_part = [t.narrow(axis_dim, mine[0] - own0, mine[1]) for t in (key, value)]
    k_region, v_region = _region_of(kv_got, recv, axis_dim, rank, own_part,
                                    [t.shape[-2] * t.shape[-1] for t in (key, value)])

    def zeros(n):
        shape = list(query.shape)
        shape[axis_dim] = n
        return query.new_zeros(shape)
    q_region = torch.cat([zeros(own0 - lo), query, zeros(hi - own1)], dim=axis_dim)  # others' queries: 0
    region_tensors = (q_region, k_region, v_region)
    if inner is None:
        out, lse = part(*region_tensors, lo, own0, own1)
    else:  # the shard's ends, each on its own (smaller) region where that lies in [lo, hi)
        for start, stop in ((own0, inner[0]), (inner[1], own1)):
            if start == stop:
                continue
            r0, r1 = region(start, stop, length, *window)
            if not (lo <= r0 and r1 <= hi):
                r0, r1 = lo, hi
            sub = [t.narrow(axis_dim, r0 - lo, r1 - r0) for t in region_tensors]
            parts.insert(0 if start == own0 else len(parts), part(*sub, r0, start, stop))
        out = torch.cat([o for o, _ in parts], dim=axis_dim)
        lse = torch.cat([x for _, x in parts], dim=axis_dim)
    return (out, lse) if return_lse else out
