"""Random NA problems that the Hopper (sm90) forward takes: fp16/bf16, D == D_v in
{32, 64, 128} (the forward's sweeps add 256; the backward's has its own at 256), tensors in the layouts its tensor maps express
(heads-last, sliced from one projection, heads-first [B, H, *spatial, D] viewed heads-last),
dilation within the copy engine's element strides. Every other feature
(odd/even kernels, stride, causal, GQA/MQA, RPB, extra keys, scale) is drawn at random."""

import dataclasses
import math
import random

import torch

from gpu_cases import GpuCase
from cases import random_window

SM90_DIMS = (32, 64, 128)  # forward and backward
SM90_FORWARD_DIMS = SM90_DIMS + (256,)  # 256: forward only (pairs with 64-key boxes)
# The copy engine's element strides are the dilations: at most 8 (boxes above its 256
# elements per axis, 1-D's 64 and 128 tokens from dilation 3, are copied in pieces).
MAX_DILATION = 8


def random_sm90_case(rng: random.Random, na_dim: int, wide: bool = False, dims=SM90_DIMS,
                     dilations=(1, 1, 1, 2, 3, 4, 8)) -> GpuCase:
    max_tokens = {1: 4000, 2: 3000, 3: 4000} if wide else {1: 1500, 2: 1200, 3: 1500}
    max_kernel = {1: 300, 2: 33, 3: 11} if wide else {1: 40, 2: 11, 3: 6}
    while True:
        spatial, kernel, stride, dilation, causal, rpb = random_window(
            rng, na_dim, max_tokens[na_dim], max_kernel[na_dim], list(dilations),
            lambda r, kd: kd + r.choice([0, 1, 5, 17, r.randint(0, 300)]), causal_p=0.25, rpb_p=0.25)
        if max(dilation) <= MAX_DILATION:
            break
    heads_kv = rng.choice([1, 1, 2, 3])
    heads = heads_kv * rng.choice([1, 1, 2, 4])
    dim = rng.choice(dims)
    return GpuCase(
        spatial=spatial, kernel=kernel, stride=stride, dilation=dilation, causal=causal,
        batch=rng.choice([1, 2, 3]), heads=heads, heads_kv=heads_kv, dim=dim, dim_v=dim,
        extra=rng.choice([0, 0, 0, 5]), rpb=rpb, dtype=rng.choice((torch.float16, torch.bfloat16)),
        layout=rng.choice(["plain", "plain", "fused", "heads_major"]), scale=rng.choice([None, None, 0.2]),
        seed=rng.randint(0, 2**31))


def sm90_sweep(count: int, seed: int, wide: bool = False, dims=SM90_DIMS):
    rng = random.Random(seed)
    return [random_sm90_case(rng, 1 + i % 3, wide, dims) for i in range(count)]


def fits_wide_rpb(case: GpuCase) -> GpuCase:
    """The case, without its RPB where the head-dim-256 backward would decline it: a KV head's
    tables (query heads a KV head x (2k - 1) per axis) above the 4330 entries its dK/dV pass
    stages (csrc/include/nattn/sm90/backward_wide.cuh)."""
    if not case.rpb or (case.heads // case.heads_kv) * math.prod(2 * k - 1 for k in case.kernel) <= 4330:
        return case
    return dataclasses.replace(case, rpb=False)


def dilated_1d_sweep(count: int, seed: int, dims=SM90_DIMS):
    """1-D problems at dilation 3 to 8: their 64- and 128-token boxes span more than the copy
    engine's 256 elements and are copied in pieces (csrc/include/nattn/sm90/tensor_map_spec.h)."""
    rng = random.Random(seed)
    return [random_sm90_case(rng, 1, wide=i % 2 == 1, dims=dims, dilations=(3, 4, 5, 6, 7, 8)) for i in range(count)]


# The strip pairs' limits (csrc/include/nattn/sm90/forward_strips.cuh): 2-D and 3-D, stride 1,
# windows up to 7 x 9 / 7 x 7 x 9 (the query box's union must fit the key box), head dims 32 / 64.
STRIP_PAIRS = {2: "q8x8_k14x16", 3: "q2x4x8_k8x10x16"}
STRIP_MAX_KERNEL = {2: (7, 9), 3: (7, 7, 9)}
# The square pair's (csrc/include/nattn/sm90/forward_squares.cuh): 2-D, stride 1, windows up
# to 13 x 13, head dims 32 / 64.
SQUARE_PAIR = "q8x8_k20x20"
SQUARE_MAX_KERNEL = 13


def strip_takes(case: GpuCase) -> bool:
    n = len(case.spatial)
    return (n in STRIP_PAIRS and case.dim in (32, 64) and all(s == 1 for s in case.stride)
            and all(k <= m for k, m in zip(case.kernel, STRIP_MAX_KERNEL[n])))


def strip_sweep(count: int, seed: int, na_dim: int = 2):
    """Random problems within a strip pair's limits (every other feature at random; half of
    them with NAT / DiNAT's 7 x 7 window in 2-D, or a video model's 5 x 7 x 7 in 3-D, where
    the grid allows it)."""
    rng = random.Random(seed)
    common = {2: (7, 7), 3: (5, 7, 7)}[na_dim]
    out = []
    while len(out) < count:
        c = random_sm90_case(rng, na_dim, dims=(32, 64))
        if rng.random() < 0.5 and all(s // d >= k for s, d, k in zip(c.spatial, c.dilation, common)):
            kernel = common
        else:  # smaller than drawn: still within the grid (an RPB keeps odd kernels)
            kernel = tuple(min(k, m) - (c.rpb and min(k, m) % 2 == 0) for k, m in zip(c.kernel, STRIP_MAX_KERNEL[na_dim]))
        out.append(dataclasses.replace(c, kernel=kernel, stride=(1,) * na_dim))
    return out


# Video-sized 3-D windows within the 3-D strip pair's limits, over several frames of its ring.
VIDEO_STRIPS = [
    GpuCase(spatial=(9, 20, 27), kernel=(5, 7, 7), stride=(1, 1, 1), dilation=(1, 1, 1), causal=(False, False, False),
            batch=2, heads=4, heads_kv=2, dim=64, dim_v=64, extra=0, rpb=True, dtype=torch.bfloat16, layout="plain",
            scale=None, seed=21),
    GpuCase(spatial=(12, 17, 30), kernel=(7, 6, 9), stride=(1, 1, 1), dilation=(1, 2, 1), causal=(True, False, False),
            batch=1, heads=2, heads_kv=2, dim=32, dim_v=32, extra=3, rpb=False, dtype=torch.float16, layout="fused",
            scale=0.3, seed=22),
    GpuCase(spatial=(16, 32, 32), kernel=(5, 7, 7), stride=(1, 1, 1), dilation=(1, 1, 1), causal=(False, False, False),
            batch=1, heads=2, heads_kv=2, dim=64, dim_v=64, extra=0, rpb=False, dtype=torch.bfloat16, layout="heads_major",
            scale=None, seed=23),
]


def narrow_strip_sweep(count: int, seed: int, na_dim: int = 2):
    """Strip problems whose columns axis' groups are at most 8 long (ceil(length / dilation)),
    so that every warp takes the narrow walk (csrc/include/nattn/sm90/forward_strips.cuh):
    strip_sweep's draws with the last axis cut to such a length, the kernel within it."""
    rng = random.Random(seed)
    out = []
    for c in strip_sweep(count, seed, na_dim):
        d = c.dilation[-1]
        k = min(c.kernel[-1], 8)
        k -= c.rpb and k % 2 == 0  # (an RPB keeps odd kernels)
        group = rng.randint(k, 8)
        length = rng.randint(max(k * d, d * (group - 1) + 1), d * group)
        out.append(dataclasses.replace(c, spatial=c.spatial[:-1] + (length,), kernel=c.kernel[:-1] + (k,)))
    return out


def _layer(spatial, kernel, dilation, heads, dim, rpb, dtype, layout, seed):
    n = len(spatial)
    return GpuCase(spatial=spatial, kernel=kernel, stride=(1,) * n, dilation=dilation, causal=(False,) * n, batch=2,
                   heads=heads, heads_kv=heads, dim=dim, dim_v=dim, extra=0, rpb=rpb, dtype=dtype, layout=layout,
                   scale=None, seed=seed)


# DiNAT's layers whose windows are their whole dilation groups (and NAT's last stage, a 7 x 7
# window on a 7 x 7 grid): every warp of the strip pairs walks narrow; a 3-D one too.
WHOLE_GROUP_LAYERS = [
    _layer((56, 56), (7, 7), (8, 8), 2, 32, True, torch.bfloat16, "fused", 31),
    _layer((28, 28), (7, 7), (4, 4), 4, 64, True, torch.float16, "plain", 32),
    _layer((14, 14), (7, 7), (2, 2), 8, 32, False, torch.bfloat16, "heads_major", 33),
    _layer((7, 7), (7, 7), (1, 1), 16, 32, True, torch.bfloat16, "plain", 34),
    _layer((6, 14, 14), (3, 7, 7), (2, 2, 2), 2, 64, True, torch.bfloat16, "plain", 35),
]


def square_takes(case: GpuCase) -> bool:
    return (len(case.spatial) == 2 and case.dim in (32, 64) and all(s == 1 for s in case.stride)
            and all(k <= SQUARE_MAX_KERNEL for k in case.kernel))


def square_sweep(count: int, seed: int):
    """Random 2-D problems within the square pair's limits (every other feature at random; half
    of them with windows of 10 to 13 per axis, the ones it is built for, where the grid allows)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        c = random_sm90_case(rng, 2, wide=rng.random() < 0.5, dims=(32, 64))
        groups = [s // d for s, d in zip(c.spatial, c.dilation)]
        if rng.random() < 0.5 and all(g >= 10 for g in groups):
            kernel = tuple(rng.randint(10, min(SQUARE_MAX_KERNEL, g)) for g in groups)
        else:  # smaller than drawn: still within the grid
            kernel = tuple(min(k, SQUARE_MAX_KERNEL) for k in c.kernel)
        kernel = tuple(k - (c.rpb and k % 2 == 0) for k in kernel)  # (an RPB keeps odd kernels)
        out.append(dataclasses.replace(c, kernel=kernel, stride=(1, 1)))
    return out

