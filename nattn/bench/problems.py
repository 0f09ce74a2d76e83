"""Benchmark problems: the canonical anchor problems (defined here), the CPU
smoke suite, custom problems from flags, and the smaller copies used for verification."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Tuple


@dataclass(frozen=True)
class Problem:
    name: str
    spatial: Tuple[int, ...]
    batch: int
    heads: int
    dim: int
    kernel: Tuple[int, ...]
    dilation: Tuple[int, ...] = ()
    stride: Tuple[int, ...] = ()
    causal: Tuple[bool, ...] = ()
    heads_kv: int = 0  # 0: same as heads
    dim_v: int = 0  # 0: same as dim
    extra: int = 0  # additional keys/values attended by every query
    rpb: bool = False
    dropout: float = 0.0  # attention dropout (nattn's dropout_p; the dense row's too)

    def __post_init__(self):
        n = len(self.spatial)
        fill = {"dilation": 1, "stride": 1, "causal": False}
        for name, default in fill.items():
            value = getattr(self, name)
            if len(value) == 0:
                object.__setattr__(self, name, (default,) * n)
            elif len(value) == 1 and n > 1:
                object.__setattr__(self, name, tuple(value) * n)
        if len(self.kernel) == 1 and n > 1:
            object.__setattr__(self, "kernel", tuple(self.kernel) * n)
        if self.heads_kv == 0:
            object.__setattr__(self, "heads_kv", self.heads)
        if self.dim_v == 0:
            object.__setattr__(self, "dim_v", self.dim)
        for name in ("kernel", "dilation", "stride", "causal"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have 1 or {n} values (one per spatial axis), got {getattr(self, name)}")

    # ---------------------------------------------------------------- sizes
    @property
    def na_dim(self) -> int:
        return len(self.spatial)

    @property
    def tokens(self) -> int:
        return math.prod(self.spatial)

    @property
    def window(self) -> int:
        return math.prod(self.kernel)

    def na_flops(self) -> int:
        """docs/semantics.md's count (the two matrix products; causal masking not discounted)."""
        return 2 * self.batch * self.heads * self.tokens * (self.window + self.extra) * (self.dim + self.dim_v)

    def dense_flops(self) -> int:
        """The same count for dense attention over every token (plus the extra ones)."""
        return 2 * self.batch * self.heads * self.tokens * (self.tokens + self.extra) * (self.dim + self.dim_v)

    def io_elements(self) -> Tuple[int, int]:
        """(input elements q+k+v (+extra), output elements)."""
        b, n = self.batch, self.tokens + 0
        q = b * n * self.heads * self.dim
        kv = b * (n + self.extra) * self.heads_kv * (self.dim + self.dim_v)
        return q + kv, b * n * self.heads * self.dim_v

    def describe(self) -> str:
        x = "x".join
        parts = [x(map(str, self.spatial)), f"B{self.batch}",
                 f"H{self.heads}" + (f"/{self.heads_kv}" if self.heads_kv != self.heads else ""),
                 f"D{self.dim}" + (f"/{self.dim_v}" if self.dim_v != self.dim else ""),
                 "k" + x(map(str, self.kernel))]
        if any(d != 1 for d in self.dilation):
            parts.append("dil" + x(map(str, self.dilation)))
        if any(s != 1 for s in self.stride):
            parts.append("s" + x(map(str, self.stride)))
        if any(self.causal):
            parts.append("causal" + "".join("1" if c else "0" for c in self.causal))
        if self.extra:
            parts.append(f"+{self.extra}kv")
        if self.rpb:
            parts.append("rpb")
        if self.dropout:
            parts.append(f"drop{self.dropout:g}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


# The anchor problems: (spatial, batch, heads, head_dim, kernel, dilation), stride 1, non-causal.
ANCHORS = (
    Problem("dinat-s1-2d", (56, 56), 32, 4, 32, (7, 7)),
    Problem("dinat-s2-dil4", (28, 28), 32, 8, 32, (7, 7), dilation=(4, 4)),
    Problem("mid-2d-k13", (128, 128), 4, 8, 64, (13, 13)),
    Problem("video-3d", (16, 32, 32), 2, 8, 64, (5, 7, 7)),
    Problem("1d-32k-w2048", (32768,), 1, 8, 128, (2048,)),
    Problem("flux-2d-w80", (256, 256), 1, 24, 128, (80, 80)),
    Problem("hunyuan-3d", (30, 48, 80), 1, 24, 128, (18, 24, 24)),
    # GNA (strided) variants: groups of queries share one window, so whole tiles are dense.
    Problem("flux-2d-w80-s16", (256, 256), 1, 24, 128, (80, 80), stride=(16, 16)),
    Problem("hunyuan-3d-s16", (30, 48, 80), 1, 24, 128, (18, 24, 24), stride=(16, 8, 8)),
)

# Tiny problems that run in seconds on a CPU (CI runs this suite end to end).
SMOKE = (
    Problem("smoke-1d", (64,), 1, 2, 16, (7,)),
    Problem("smoke-2d-dil-gqa", (12, 10), 1, 4, 16, (3, 4), dilation=(2, 1), heads_kv=2),
    Problem("smoke-3d-causal", (6, 6, 5), 1, 2, 16, (3, 3, 2), causal=(True, False, False), stride=(1, 2, 1)),
)

# The anchors plus ten shapes the defaults were not modelled on (small batch, B=1 video, odd
# head counts, GQA, head dim 32 at large windows): the auto-tuner's table (--optimize).
TUNING = ANCHORS + (
    Problem("dinat-s1-b1", (56, 56), 1, 4, 32, (7, 7)),
    Problem("nat-14-k7-h12", (14, 14), 64, 12, 32, (7, 7)),
    Problem("2d-96-k21-gqa", (96, 96), 2, 12, 64, (21, 21), heads_kv=4),
    Problem("2d-64-k33-d32", (64, 64), 8, 6, 32, (33, 33)),
    Problem("video-b1-k7", (16, 48, 48), 1, 6, 64, (7, 9, 9)),
    Problem("video-b1-gqa", (12, 40, 40), 1, 16, 128, (9, 15, 15), heads_kv=2),
    Problem("1d-4k-w2048-b1", (4096,), 1, 2, 128, (2048,)),
    Problem("1d-16k-w512-h5", (16384,), 2, 5, 64, (512,)),
    Problem("flux-2d-w48-b2", (128, 128), 2, 24, 128, (48, 48)),
    Problem("3d-causal-t", (24, 32, 32), 1, 8, 128, (8, 17, 17), causal=(True, False, False)),
)

SUITES = {"anchors": ANCHORS, "smoke": SMOKE, "tuning": TUNING}


def shrink(p: Problem, max_tokens: int, name_suffix: str = "") -> Problem:
    """A smaller copy with the same features: spatial scaled down (never below kernel x
    dilation), batch 1, one KV head keeping the GQA ratio (at most 4 query heads)."""
    scale = min(1.0, (max_tokens / p.tokens) ** (1.0 / p.na_dim))
    spatial = tuple(max(k * d, min(n, int(n * scale)))
                    for n, k, d in zip(p.spatial, p.kernel, p.dilation))
    ratio = min(p.heads // p.heads_kv, 4)
    return replace(p, name=p.name + name_suffix, spatial=spatial, batch=1, heads=ratio,
                   heads_kv=1, extra=min(p.extra, 16))


def cpu_copy(p: Problem) -> Problem:
    """What a CPU can run in seconds: kernels <= 5, dilation <= 2, <= 512 tokens, D <= 32."""
    kernel = tuple(min(k, 5) for k in p.kernel)
    dilation = tuple(min(d, 2) for d in p.dilation)
    stride = tuple(min(s, k) for s, k in zip(p.stride, kernel))
    small = replace(p, kernel=kernel, dilation=dilation, stride=stride,
                    dim=min(p.dim, 32), dim_v=min(p.dim_v, 32))
    out = shrink(small, 512, "(cpu-small)")
    return replace(out, heads=min(out.heads, 2))
