"""nattn's benchmark and profiler: ``python -m nattn.bench --suite anchors --backprop``.

Rows per problem: nattn's automatic backend (and any ``--backend``), torch's dense SDPA and
the plain flex_attention recipe, with the FLOP and memory floors (nattn/bench/floors.py) measured
on the machine it runs on. See docs/performance.md.
"""

from .problems import ANCHORS, SMOKE, SUITES, Problem

__all__ = ["ANCHORS", "SMOKE", "SUITES", "Problem"]
