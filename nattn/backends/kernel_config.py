"""Kernel configurations as backend-name suffixes: ``"cuda:q8x16_k8x16+dq=atomic"``.

A configured call names its kernel configuration in the backend string that nattn's custom
ops receive, so a torch.compile graph records it as a constant, the autograd context carries
it to the backward, and every backend keeps its plain interface. The forms after ``cuda:``,
joined by ``+``:

* a Hopper tile pair's name, ``q<query box>_k<key box>`` (extents joined by ``x``, one per
  NA axis), as ``python -m nattn.bench ... --dry-run`` lists them;
* ``dq=pass`` (the backward's deterministic dQ pass) or ``dq=atomic`` (dQ accumulated by the
  dK/dV pass in fp32: KV-parallel, not bitwise reproducible; head dims up to 128, at 256 the
  backward runs its dQ pass either way);
* ``kv=<n>`` (the Hopper forward's split-KV: n CTAs per query box over slices of its key
  boxes, merged through their LSE; 1 <= n <= 64, 1 meaning no split: without it the library
  splits small problems by itself, docs/kernels.md).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional, Tuple

_TILE = re.compile(r"^q(\d+(?:x\d+){0,2})_k(\d+(?:x\d+){0,2})$")
DQ_MODES = {"pass": 1, "atomic": 2}
ACCEPTED = ("a tile pair such as 'q8x16_k8x16'", "'dq=pass'", "'dq=atomic'", "'kv=<1..64>'")


@dataclass(frozen=True)
class KernelConfig:
    tile: Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]] = None  # (query box, key box)
    dq_mode: int = 0  # 0: the library's default, 1: deterministic pass, 2: KV-parallel
    kv_splits: int = 0  # 0: the library's default (split where the GPU is not filled), 1: none

    def fields(self) -> Tuple[int, ...]:
        """The problem struct's ``tile`` (6), ``dq_mode`` and ``kv_splits`` fields."""
        if self.tile is None:
            tile = (0,) * 6
        else:
            q, k = (tuple(box) + (1,) * (3 - len(box)) for box in self.tile)
            tile = q + k
        return tile + (self.dq_mode, self.kv_splits)

    def with_dq(self, dq_mode: int) -> "KernelConfig":
        """The same configuration with another backward dQ mode."""
        return dataclasses.replace(self, dq_mode=dq_mode)

    @property
    def text(self) -> str:
        parts = []
        if self.tile is not None:
            q, k = self.tile
            parts.append(f"q{'x'.join(map(str, q))}_k{'x'.join(map(str, k))}")
        if self.dq_mode:
            parts.append("dq=" + next(n for n, m in DQ_MODES.items() if m == self.dq_mode))
        if self.kv_splits:
            parts.append(f"kv={self.kv_splits}")
        return "+".join(parts)


DEFAULT = KernelConfig()


def split(name: str) -> Tuple[str, str]:
    """``"cuda:q8x16_k8x16"`` -> ``("cuda", "q8x16_k8x16")``; a plain name has ``""``."""
    base, _, config = name.partition(":")
    return base, config


def parse(text: str) -> KernelConfig:
    """The configuration a suffix names; ValueError naming the accepted forms otherwise."""
    tile, dq_mode, kv = None, 0, 0
    for part in filter(None, text.split("+")):
        m = _TILE.match(part)
        if m and tile is None:
            q, k = (tuple(int(x) for x in g.split("x")) for g in m.groups())
            if len(q) != len(k) or not all(q) or not all(k):
                raise ValueError(f"tile pair {part!r}: query and key boxes need the same number of axes, "
                                 "each extent positive")
            tile = (q, k)
        elif part.startswith("dq=") and part[3:] in DQ_MODES and not dq_mode:
            dq_mode = DQ_MODES[part[3:]]
        elif part.startswith("kv=") and part[3:].isdigit() and 1 <= int(part[3:]) <= 64 and not kv:
            kv = int(part[3:])
        else:
            raise ValueError(f"unknown kernel configuration {part!r} in {text!r}; accepted, joined by '+': "
                             + ", ".join(ACCEPTED))
    return KernelConfig(tile, dq_mode, kv)


def join(base: str, config: KernelConfig) -> str:
    """The backend name that carries ``config`` (the base name for the default)."""
    return f"{base}:{config.text}" if config.text else base
