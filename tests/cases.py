"""Seeded random NA problems that combine every feature, for sweeps against the oracle."""

import random
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass
class Problem:
    """The fields every sweep case has (the CPU sweeps' Case, the GPU tier's GpuCase)."""
    spatial: Tuple[int, ...]
    kernel: Tuple[int, ...]
    stride: Tuple[int, ...]
    dilation: Tuple[int, ...]
    causal: Tuple[bool, ...]
    batch: int
    heads: int
    heads_kv: int
    dim: int
    dim_v: int
    extra: int  # number of additional keys/values (0: none)
    rpb: bool


@dataclass
class Case(Problem):
    scale: Optional[float] = None
    seed: int = 0

    def __str__(self):
        return (f"sp{self.spatial}-k{self.kernel}-s{self.stride}-d{self.dilation}-c{self.causal}"
                f"-b{self.batch}h{self.heads}/{self.heads_kv}-d{self.dim}/{self.dim_v}"
                f"-x{self.extra}-rpb{int(self.rpb)}")


def random_window(rng: random.Random, na_dim: int, max_tokens: int, max_kernel: int,
                  dilations, size_of, causal_p: float, rpb_p: float):
    """Random per-axis window arguments that satisfy docs/semantics.md's constraints.

    Returns ``(spatial, kernel, stride, dilation, causal, rpb)``; with ``rpb`` the kernels
    are made odd and stride/causal dropped, as an RPB table requires.
    """
    while True:
        kernel, dilation, spatial, stride, causal = [], [], [], [], []
        for _ in range(na_dim):
            k = rng.randint(2, max_kernel)
            d = rng.choice(dilations)
            n = size_of(rng, k * d)  # at least k * d
            kernel.append(k); dilation.append(d); spatial.append(n)
            stride.append(rng.choice([1, 1, rng.randint(1, k)]))
            causal.append(rng.random() < causal_p)
        tokens = 1
        for n in spatial:
            tokens *= n
        if tokens <= max_tokens:
            break
    rpb = rng.random() < rpb_p
    if rpb:  # RPB needs odd kernels, stride 1, non-causal
        kernel = [k if k % 2 else k + 1 for k in kernel]
        spatial = [max(n, k * d) for n, k, d in zip(spatial, kernel, dilation)]
        stride = [1] * na_dim
        causal = [False] * na_dim
    return tuple(spatial), tuple(kernel), tuple(stride), tuple(dilation), tuple(causal), rpb


def random_case(rng: random.Random, na_dim: int, max_tokens: int = 160) -> Case:
    spatial, kernel, stride, dilation, causal, rpb = random_window(
        rng, na_dim, max_tokens, 5 if na_dim == 3 else 7, [1, 1, 2, 3],
        lambda r, kd: r.randint(kd, kd + r.choice([0, 1, 3, 6])), causal_p=0.3, rpb_p=0.35,
    )
    heads_kv = rng.choice([1, 2])
    heads = heads_kv * rng.choice([1, 2])
    dim = rng.choice([4, 8, 16])
    return Case(
        spatial=spatial, kernel=kernel, stride=stride, dilation=dilation, causal=causal,
        batch=rng.choice([1, 2]), heads=heads, heads_kv=heads_kv, dim=dim,
        dim_v=rng.choice([dim, 8]), extra=rng.choice([0, 0, 3]), rpb=rpb,
        scale=rng.choice([None, 0.3]), seed=rng.randint(0, 2**31),
    )


def sweep(count: int, seed: int):
    rng = random.Random(seed)
    return [random_case(rng, 1 + i % 3) for i in range(count)]
