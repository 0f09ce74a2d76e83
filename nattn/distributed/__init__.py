"""Neighborhood attention across processes (context parallelism) over ``torch.distributed``.

:func:`na_ulysses` (head-parallel, "Ulysses"): the inputs are sharded along one spatial
axis; an all-to-all regroups them to the full grid with a slice of the heads on each rank,
every rank runs ordinary NA on its heads, and a second all-to-all returns the output to the
spatial shards. Every NA feature works, forward and backward; the heads (and KV heads) must
divide by the group size. NCCL on GPUs, gloo on CPUs (docs/distributed.md).
"""

from dataclasses import dataclass
from typing import Any, Optional

from .ulysses import na_ulysses, shard, shard_sizes, unshard

__all__ = ["ContextParallel", "na_ulysses", "shard", "shard_sizes", "unshard"]


@dataclass(frozen=True)
class ContextParallel:
    """How a module's input is sharded: contiguous shards along spatial ``axis``, one per
    rank of ``group`` (None: the default group), in rank order. Pass it as
    ``NeighborhoodAttention3D(..., context_parallel=ContextParallel(group, axis=0))``; the
    module then runs :func:`na_ulysses` on its shard."""

    group: Optional[Any] = None
    axis: int = 0
