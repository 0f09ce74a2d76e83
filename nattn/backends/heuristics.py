"""Which backend to try first for a problem: the one place dispatch heuristics live.

Every backend still answers its own capability check; this only orders the candidates.
Numbers come from the H200 runs logged in docs/dev/PERF.md.
"""

from __future__ import annotations

from typing import List, Sequence

from ..params import NAParams

# The SIMT kernels beat compiled flex where windows are small (DiNAT's 7x7: 2-3x faster)
# and lose where they are large (13x13 at D=64: 1.8x slower; 5x7x7 video: 1.3x slower):
# their cost per key is mostly fixed bookkeeping, while flex runs tensor cores over tiles.
# The crossover lies between 49 and 169 keys; 100 splits it until a faster family lands.
SIMT_MAX_WINDOW = 100


def na_auto_order(order: Sequence[str], q, params: NAParams) -> List[str]:
    """The registered automatic order, adjusted for this problem (fastest first)."""
    order = list(order)
    if q.device.type == "cuda" and "cuda" in order and "flex" in order:
        if params.window_size > SIMT_MAX_WINDOW:
            order.remove("flex")
            order.insert(order.index("cuda"), "flex")
    return order
