"""Neighborhood attention across processes (context parallelism) over ``torch.distributed``.

:func:`na_ulysses` (head-parallel, "Ulysses"): the inputs are sharded along one spatial
axis; an all-to-all regroups them to the full grid with a slice of the heads on each rank,
every rank runs ordinary NA on its heads, and a second all-to-all returns the output to the
spatial shards. Every NA feature works, forward and backward; the heads (and KV heads) must
divide by the group size. :func:`na_halo` (spatial halo): each rank keeps its heads and
receives only the keys and values its queries' windows reach from its neighbours. NCCL on
GPUs, gloo on CPUs (docs/distributed.md).
"""

from dataclasses import dataclass
from typing import Any, Optional

from .halo import na_halo
from .ulysses import na_ulysses, shard, shard_sizes, unshard

__all__ = ["ContextParallel", "na_halo", "na_ulysses", "shard", "shard_sizes", "unshard"]


@dataclass(frozen=True)
class ContextParallel:
    """How a module's input is sharded: contiguous shards along spatial ``axis``, one per
    rank of ``group`` (None: the default group), in rank order, and the scheme: ``"ulysses"``
    (:func:`na_ulysses`, heads divisible by the group size) or ``"halo"`` (:func:`na_halo`;
    ``overlap=True`` computes the interior queries while the halo is exchanged).
    Pass it as ``NeighborhoodAttention3D(..., context_parallel=ContextParallel(group, axis=0))``."""

    group: Optional[Any] = None
    axis: int = 0
    scheme: str = "ulysses"
    chunks: int = 1  # Ulysses: the heads in this many rounds, communication overlapping NA
    overlap: bool = False  # halo: the exchange overlapping the interior queries' NA

    def __post_init__(self):
        if self.scheme not in ("ulysses", "halo"):
            raise ValueError(f"scheme must be 'ulysses' or 'halo', got {self.scheme!r}")
        if not isinstance(self.chunks, int) or self.chunks < 1:
            raise ValueError(f"chunks must be a positive int, got {self.chunks!r}")
        if self.chunks > 1 and self.scheme != "ulysses":
            raise ValueError("chunks applies to the 'ulysses' scheme only")
        if not isinstance(self.overlap, bool):
            raise TypeError(f"overlap must be a bool, got {self.overlap!r}")
        if self.overlap and self.scheme != "halo":
            raise ValueError("overlap applies to the 'halo' scheme only (Ulysses overlaps through chunks)")
