"""Which backend to try first for a problem: the one place dispatch heuristics live.

Every backend still answers its own capability check; this only orders the candidates.
Numbers come from the H200 runs logged in docs/dev/PERF.md.
"""

from __future__ import annotations

from typing import List, Sequence

from ..params import NAParams

# Measured on the H200 (docs/dev/PERF.md): the SIMT kernels win at 49 keys (DiNAT 7x7:
# 0.34 ms vs 1.2 ms flex forward); flex with its arithmetic mask wins from 169 keys on
# (13x13 at D=64: 1.77 / 5.2 ms vs 2.16 / 9.6 ms fwd / fwd+bwd; 5x7x7 video: fwd+bwd 6.9 vs
# 7.8 ms, forward 2.5 vs 1.7 ms) and by 30x or more at 2048+ keys, where the SIMT kernels'
# fixed cost per key dominates and flex runs tensor cores. 100 splits the measured crossover.
SIMT_MAX_WINDOW = 100


def na_auto_order(order: Sequence[str], q, params: NAParams) -> List[str]:
    """The registered automatic order, adjusted for this problem (fastest first)."""
    order = list(order)
    if q.device.type == "cuda" and "cuda" in order and "flex" in order:
        if params.window_size > SIMT_MAX_WINDOW:
            order.remove("flex")
            order.insert(order.index("cuda"), "flex")
    return order
