"""Which backend to try first for a problem: the one place dispatch heuristics live.

Every backend still answers its own capability check; this only orders the candidates.
Numbers come from the H200 runs logged in docs/dev/PERF.md.
"""

from __future__ import annotations

from typing import List, Sequence

from ..params import NAParams

# Measured (docs/dev/PERF.md, "Anchors, all backends"): the SIMT kernels beat nattn's flex
# backend up to 245 keys (7x7: 2-3x; 13x13 and 5x7x7: 15-25x, where flex evaluates its
# mask on nearly every block) and lose badly from 2048 keys on (1-D 2048: 33x slower; flux
# and hunyuan windows take the SIMT kernels 0.5-1.5 s), where flex's tensor cores win.
SIMT_MAX_WINDOW = 1024


def na_auto_order(order: Sequence[str], q, params: NAParams) -> List[str]:
    """The registered automatic order, adjusted for this problem (fastest first)."""
    order = list(order)
    if q.device.type == "cuda" and "cuda" in order and "flex" in order:
        if params.window_size > SIMT_MAX_WINDOW:
            order.remove("flex")
            order.insert(order.index("cuda"), "flex")
    return order
