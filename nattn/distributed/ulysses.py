"""Head-parallel (Ulysses) neighborhood attention: all-to-all to full grid / head shards,
local NA, all-to-all back. q, k and v travel in one all-to-all (packed per token); uneven
spatial shards are padded for the collective (equal-sized blocks) and the padding is dropped
on arrival; with even shards, batch 1 and the first axis the arrivals are views, no copy.
With ``chunks`` > 1 each rank's heads go in that many rounds, every round's all-to-all issued
before the first local NA, so that the exchange of round i + 1 overlaps the NA of round i and
the return of round i the NA of round i + 1 (NCCL runs collectives on its own stream)."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from ..functional import neighborhood_attention
from ..params import BoolOrTuple, IntOrTuple


def _world(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("nattn.distributed needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    return dist.get_world_size(group), dist.get_rank(group)


def shard_sizes(length: int, parts: int) -> List[int]:
    """The default split of ``length`` tokens into ``parts`` contiguous shards (the first
    ``length % parts`` one longer), as :func:`shard` cuts and :func:`na_ulysses` expects
    unless told otherwise."""
    base, extra = divmod(length, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


def shard(x: torch.Tensor, axis: int, group=None, sizes: Optional[Sequence[int]] = None) -> torch.Tensor:
    """This rank's slice of ``x`` ``[B, *spatial, ...]`` along spatial ``axis`` (0-based)."""
    world, rank = _world(group)
    sizes = list(sizes) if sizes is not None else shard_sizes(x.shape[1 + axis], world)
    start = sum(sizes[:rank])
    return x.narrow(1 + axis, start, sizes[rank])


def unshard(x: torch.Tensor, axis: int, group=None) -> torch.Tensor:
    """The whole tensor from every rank's shard along spatial ``axis`` (all-gather; no autograd)."""
    world, _ = _world(group)
    sizes = _all_sizes(x.shape[1 + axis], group, x.device)
    padded = _pad_to(x, 1 + axis, max(sizes))
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p.narrow(1 + axis, 0, n) for p, n in zip(parts, sizes)], dim=1 + axis)


def _all_sizes(local: int, group, device) -> List[int]:
    world, _ = _world(group)
    mine = torch.tensor([local], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return [int(t.item()) for t in every]


def _check_shards(query, key, value, na_dim: int, axis: int) -> None:
    """The checks both schemes make on their sharded inputs."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != na_dim + 3:
            raise ValueError(f"{name} must be a tensor [B, *spatial, H, D] with {na_dim} spatial axes")
    if not 0 <= axis < na_dim:
        raise ValueError(f"axis must be a spatial axis in [0, {na_dim}), got {axis}")


def _pad_to(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if x.shape[dim] == size:
        return x
    pad_shape = list(x.shape)
    pad_shape[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad_shape)], dim=dim)


def _exchange(x: torch.Tensor, group, async_op: bool = False):
    """``x [P, ...]``: block j to rank j; returns (the blocks received in rank order, the
    work handle, or None when it waited). Contiguous buffers on both sides: empty_like would
    copy a strided input's layout, while the collective reads and writes them in row-major
    order."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    work = dist.all_to_all_single(out, x.contiguous(), group=group, async_op=async_op)
    return out, work


class _AllToAll(torch.autograd.Function):
    """``x [P, ...]``: block j goes to rank j; returns the blocks received, in rank order
    (one ``all_to_all_single``). The backward sends the gradients back the same way. With a
    ``pending`` list the forward returns before the collective completes and appends its work
    handle there: wait on it (``.wait()``: on NCCL a stream wait, not a host one) before
    reading the output."""

    @staticmethod
    def forward(ctx, x, group, pending=None):
        ctx.group = group
        out, work = _exchange(x, group, pending is not None)
        if pending is not None:
            pending.append(work)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group)[0], None, None


class _SplitLast(torch.autograd.Function):
    """Views of ``x`` split along its last dim (widths ``widths``); the backward concatenates
    the parts' gradients once. Plain slicing would have autograd build a zero-filled gradient
    of the whole buffer per part and add them up: q, k and v arrive packed, so that was three
    receive-buffer-sized tensors at the backward's peak."""

    @staticmethod
    def forward(ctx, x, widths):
        return tuple(x.split(widths, dim=-1))

    @staticmethod
    def backward(ctx, *grads):  # unused parts arrive as zeros (materialised grads)
        return torch.cat(grads, dim=-1), None


def _to_heads(tensors, axis_dim: int, sizes: List[int], group, pending=None):
    """``[B, ..., X_r, ..., H_t, D_t]`` (this rank's spatial shard, all heads) for each tensor
    -> ``[B, ..., X, ..., H_t / P, D_t]`` (the whole axis, this rank's slice of the heads),
    all tensors in one all-to-all: packed side by side per token, heads group j to rank j.
    Returns a function that unpacks the arrivals: with ``pending`` (see _AllToAll) call it
    once the collective is waited on."""
    world, longest = len(sizes), max(sizes)
    widths = [t.shape[-2] // world * t.shape[-1] for t in tensors]
    shapes = [(t.shape[-2] // world, t.shape[-1]) for t in tensors]
    # [P, B, ..., X_max, ..., sum of widths]: block j holds heads group j of every tensor
    send = torch.cat([_pad_to(t, axis_dim, longest).unflatten(-2, (world, -1)).flatten(-2).movedim(-2, 0)
                      for t in tensors], dim=-1)
    recv = _AllToAll.apply(send, group, pending)  # block i: rank i's shard for this rank's heads
    del send  # the collective's input is dead: free it before the local NA

    def unpack() -> List[torch.Tensor]:
        out = []
        for shape, packed in zip(shapes, _SplitLast.apply(recv, widths)):
            part = packed.unflatten(-1, shape)
            if all(n == longest for n in sizes):  # even shards: blocks are consecutive along the axis
                whole = part.movedim(0, axis_dim).flatten(axis_dim, axis_dim + 1)
            else:
                whole = torch.cat([part[i].narrow(axis_dim, 0, n) for i, n in enumerate(sizes)], dim=axis_dim)
            out.append(whole)
        return out

    return unpack


def _to_shards(y: torch.Tensor, axis_dim: int, sizes: List[int], rank: int, group, head_dim: int, pending=None):
    """Inverse of :func:`_to_heads` for one tensor: ``[B, ..., X, ..., H / P, ...]`` ->
    ``[B, ..., X_r, ..., H, ...]`` (``head_dim``: -2 for an output ``[..., H, D]``, -1 for an
    LSE ``[..., H]``), as a function to call once the collective is done (see _to_heads)."""
    longest = max(sizes)
    if all(n == longest for n in sizes):  # even shards: a view (no copy when the blocks are contiguous,
        send = y.unflatten(axis_dim, (len(sizes), longest)).movedim(axis_dim, 0)  # e.g. batch 1, axis 0)
    else:
        send = torch.stack([_pad_to(p, axis_dim, longest) for p in y.split(sizes, dim=axis_dim)])
    recv = _AllToAll.apply(send, group, pending)  # block j: rank j's heads group for this rank's shard

    def unpack() -> torch.Tensor:
        mine = recv.narrow(1 + axis_dim, 0, sizes[rank])  # [P, B, ..., X_r, ..., H / P (, D)]
        if head_dim == -2:
            return mine.movedim(0, -3).flatten(-3, -2)
        return mine.movedim(0, -2).flatten(-2, -1)

    return unpack


def _wait(pending) -> None:
    for work in pending:
        work.wait()
    pending.clear()


def _chunk_count(chunks: int, *heads_per_rank: int) -> int:
    """The largest round count <= ``chunks`` that divides every rank's head counts."""
    c = max(1, min([chunks, *heads_per_rank]))
    while any(h % c for h in heads_per_rank):
        c -= 1
    return c


def _heads_of_round(t: torch.Tensor, world: int, chunks: int, i: int) -> torch.Tensor:
    """``t [..., H, D]`` -> its heads of round ``i``: of every rank's H / P heads, the i-th of
    ``chunks`` equal slices ([..., H / chunks, D], heads in rank order: a strided view; ``t``'s
    own strides for one round)."""
    return t.unflatten(-2, (world, chunks, -1)).select(-3, i).flatten(-3, -2)


def _join_rounds(parts: List[torch.Tensor], world: int, head_dim: int) -> torch.Tensor:
    """Inverse of :func:`_heads_of_round` over all rounds: ``parts[i] [..., H / chunks (, D)]``
    -> ``[..., H (, D)]``."""
    split = [p.unflatten(head_dim, (world, -1)) for p in parts]  # [..., P, H / P / chunks (, D)]
    return torch.stack(split, dim=head_dim - 1 if head_dim == -2 else -2).flatten(head_dim - 2, head_dim)


def na_ulysses(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kernel_size: IntOrTuple,
    stride: IntOrTuple = 1, dilation: IntOrTuple = 1, is_causal: BoolOrTuple = False,
    scale: Optional[float] = None, additional_keys: Optional[torch.Tensor] = None,
    additional_values: Optional[torch.Tensor] = None, rpb: Optional[torch.Tensor] = None,
    backend: Optional[str] = None, return_lse: bool = False, *, na_dim: int, axis: int = 0, group=None,
    chunks: int = 1,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Neighborhood attention of inputs sharded along spatial ``axis`` over ``group``.

    Every rank passes its contiguous shard ``[B, *spatial_r, H, D]`` of the global problem
    (rank order = position along ``axis``; uneven shards allowed, e.g. :func:`shard`'s), and
    the same arguments as :func:`nattn.neighborhood_attention` otherwise. The result is this
    rank's shard of the global output (and LSE): equal to running NA on the whole tensors and
    slicing. Head-parallel: an all-to-all gives each rank the whole grid for ``H / P`` heads
    (``P`` the group size; ``H`` and the KV heads must divide by it), NA runs locally on any
    backend, an all-to-all brings the output back. ``additional_keys`` / ``additional_values``
    ``[B, N_extra, H_kv, D]`` and ``rpb`` ``[H, ...]`` are the same on every rank; each rank
    uses its heads' slice, so their gradients on a rank hold that slice only: sum them over
    the group, as for any parameter replicated across context-parallel ranks.

    ``chunks`` > 1 sends each rank's heads in that many rounds (reduced to the largest count
    that divides the rank's query and KV heads), all exchanges issued before the first local NA,
    so that communication overlaps the NA of earlier rounds; the results are the same.
    """
    world, rank = _world(group)
    _check_shards(query, key, value, na_dim, axis)
    heads, heads_kv = query.shape[-2], key.shape[-2]
    if heads % world or heads_kv % world:
        raise ValueError(f"heads ({heads}) and KV heads ({heads_kv}) must divide by the group size ({world}) "
                         "for head-parallel NA")
    if not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"chunks must be a positive int, got {chunks!r}")
    axis_dim = 1 + axis
    sizes = _all_sizes(query.shape[axis_dim], group, query.device)
    hq, hk = heads // world, heads_kv // world
    rounds = _chunk_count(chunks, hq, hk)
    hq, hk = hq // rounds, hk // rounds  # per rank and round
    # every round's exchange in flight before the first NA (see the module docstring)
    arrivals = []
    for i in range(rounds):
        pending = [] if rounds > 1 else None
        parts = [_heads_of_round(t, world, rounds, i) for t in (query, key, value)]
        arrivals.append((pending, _to_heads(parts, axis_dim, sizes, group, pending)))
    outs, lses = [], []
    for i, (pending, unpack) in enumerate(arrivals):
        if pending is not None:
            _wait(pending)
        q, k, v = unpack()
        h0, hk0 = rank * heads // world + i * hq, rank * heads_kv // world + i * hk
        ek = additional_keys[..., hk0:hk0 + hk, :] if additional_keys is not None else None
        ev = additional_values[..., hk0:hk0 + hk, :] if additional_values is not None else None
        bias = rpb[h0:h0 + hq] if rpb is not None else None
        out, lse = neighborhood_attention(q, k, v, kernel_size, stride, dilation, is_causal, scale, ek, ev, bias,
                                          backend, True, na_dim=na_dim)
        back = [] if rounds > 1 else None
        outs.append((back, _to_shards(out, axis_dim, sizes, rank, group, -2, back)))
        if return_lse:
            lses.append((back, _to_shards(lse, axis_dim, sizes, rank, group, -1, back)))
    done = []
    for back, unpack in outs + lses:
        if back is not None:
            _wait(back)
        done.append(unpack())
    out = done[0] if rounds == 1 else _join_rounds(done[:rounds], world, -2)
    if not return_lse:
        return out
    lse = done[rounds] if rounds == 1 else _join_rounds(done[rounds:], world, -1)
    return out, lse
