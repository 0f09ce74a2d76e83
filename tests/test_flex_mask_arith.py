"""The flex backend's arithmetic mask_mod / RPB score_mod against the oracle's mask, exactly.

The modifiers are evaluated on the full (position x position) grid, mapped back to
row-major tokens through the layout, and compared with tests/oracle.py's boolean mask and
RPB offsets. Covers tiles that do not divide the sizes, dilation (grouped and row-major),
stride, causal, even kernels, 1-D/2-D/3-D.
"""

import random

import pytest
import torch

from nattn.backends.flex_layout import TileLayout, choose_tile
from nattn.backends.flex_mask import NeighborhoodMask
from oracle import mask_and_bias_index


def _problem(rng, na_dim):
    while True:
        kernel, stride, dilation, causal, spatial = [], [], [], [], []
        for _ in range(na_dim):
            k = rng.randint(2, 5)
            d = rng.choice([1, 2, 3])
            kernel.append(k); dilation.append(d)
            spatial.append(rng.randint(k * d, k * d + 7))
            stride.append(rng.randint(1, k))
            causal.append(rng.random() < 0.35)
        n = 1
        for x in spatial:
            n *= x
        if n <= 600:
            return tuple(spatial), tuple(kernel), tuple(stride), tuple(dilation), tuple(causal)


def _tiles(rng, spatial, dilation):
    """The backend's choice, row-major, and a random tile that rarely divides the axis."""
    return [(choose_tile(spatial, dilation), True), ((1,) * len(spatial), False),
            (tuple(rng.randint(1, 5) for _ in spatial), rng.random() < 0.7)]


PROBLEMS = []
_rng = random.Random(2026)
for _i in range(36):
    _p = _problem(_rng, 1 + _i % 3)
    for _tile, _grouped in _tiles(_rng, _p[0], _p[3]):
        PROBLEMS.append((_p, _tile, _grouped))
# Hand-picked: even kernels with stride at borders, padding + dilation on every axis.
PROBLEMS += [
    (((11, 9), (4, 2), (3, 2), (2, 3), (False, True)), (4, 4), True),
    (((7, 10, 6), (2, 4, 3), (2, 1, 3), (3, 2, 1), (True, False, False)), (4, 4, 4), True),
    (((13,), (6,), (4,), (2,), (False,)), (1,), False),
    (((17, 5), (3, 5), (1, 1), (5, 1), (False, False)), (8, 8), True),
]


def _positions_grid(layout):
    p = torch.arange(layout.num_positions)
    return p[:, None], p[None, :]


def _token_positions(layout):
    dst = torch.empty(layout.num_tokens, dtype=torch.long)
    dst[layout.src[layout.real]] = torch.arange(layout.num_positions)[layout.real]
    return dst


@pytest.mark.parametrize("problem, tile, grouped", PROBLEMS, ids=str)
def test_arithmetic_mask_equals_oracle(problem, tile, grouped):
    spatial, kernel, stride, dilation, causal = problem
    nm = NeighborhoodMask(spatial, kernel, stride, dilation, causal, "cpu", tile=tile, group_by_dilation=grouped)
    layout = nm.layout
    qi, ki = _positions_grid(layout)
    full = nm.mask_mod()(None, None, qi, ki).expand(layout.num_positions, layout.num_positions)
    dst = _token_positions(layout)
    want, offsets = mask_and_bias_index(spatial, kernel, stride, dilation, causal)
    got = full[dst][:, dst]
    assert torch.equal(got, want), f"{(~(got == want)).sum()} pairs differ"
    assert not full[:, ~layout.real].any(), "a padded key is attended"
    assert full.any(1).all(), "a position (padded query included) has an empty row"


@pytest.mark.parametrize("problem, tile, grouped", PROBLEMS[::3], ids=str)
def test_arithmetic_rpb_index_equals_oracle(problem, tile, grouped):
    spatial, kernel, _, dilation, _ = problem
    kernel = tuple(k | 1 for k in kernel)  # RPB: odd kernels, stride 1, non-causal
    spatial = tuple(max(n, k * d) for n, k, d in zip(spatial, kernel, dilation))
    stride, causal = (1,) * len(spatial), (False,) * len(spatial)
    nm = NeighborhoodMask(spatial, kernel, stride, dilation, causal, "cpu", tile=tile, group_by_dilation=grouped)
    layout = nm.layout
    sizes = [2 * k - 1 for k in kernel]
    heads = 2
    table = torch.arange(heads * torch.tensor(sizes).prod().item(), dtype=torch.float64).reshape(heads, *sizes)
    bias = nm.rpb_score_mod(table)
    qi, ki = _positions_grid(layout)
    dst = _token_positions(layout)
    want_mask, offsets = mask_and_bias_index(spatial, kernel, stride, dilation, causal)
    flat = torch.zeros(offsets.shape[:2], dtype=torch.long)
    for a, size in enumerate(sizes):
        flat = flat * size + offsets[..., a]
    for h in range(heads):
        got = bias(torch.zeros((), dtype=torch.float64), None, torch.tensor(h), qi, ki)[dst][:, dst]
        want = (flat + h * torch.tensor(sizes).prod()).double()
        assert torch.equal(got[want_mask], want[want_mask])
    nm.release_rpb()


@pytest.mark.parametrize("spatial, dilation, tile, grouped", [
    ((13, 6, 5), (2, 1, 3), None, True), ((10, 7), (3, 2), (4, 3), True), ((10, 7), (3, 2), (4, 3), False),
    ((29,), (4,), (1,), True), ((12, 12), (1, 1), (1, 6), True),
])
def test_layout_roundtrip_matches_decode(spatial, dilation, tile, grouped):
    """to/from_positions invert each other, and decode() agrees with where tokens landed."""
    tile = choose_tile(spatial, dilation) if tile is None else tile
    layout = TileLayout(spatial, tile, dilation, grouped)
    x = torch.randn(2, *spatial, 3, 4)
    pos = layout.to_positions(x)
    assert pos.shape == (2, 3, layout.num_positions, 4)
    assert (pos[:, :, ~layout.real] == 0).all()
    assert torch.equal(layout.from_positions(pos), x)
    lse = torch.randn(2, 3, layout.num_positions)
    assert layout.from_positions(lse).shape == (2, *spatial, 3)
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in spatial], indexing="ij"), -1).reshape(-1, len(spatial))
    axes = layout.decode(torch.arange(layout.num_positions))
    real = layout.real
    for a, ax in enumerate(axes):
        d = dilation[a]
        got = ax.coord * d + (ax.group if ax.group is not None else 0)
        assert torch.equal(got[real], coords[layout.src[real], a])
    ok = torch.ones(layout.num_positions, dtype=torch.bool)
    for ax in axes:
        if ax.real is not None:
            ok &= ax.real
    assert torch.equal(ok, real)


@pytest.mark.parametrize("problem", [p for p, _, _ in PROBLEMS[::3]], ids=str)
def test_bench_row_major_mask_equals_oracle(problem):
    """The bench's plain flex recipe (row-major closed-form mask) is the oracle's mask too."""
    from nattn.bench.rows import row_major_mask_mod

    spatial, kernel, stride, dilation, causal = problem
    n = 1
    for x in spatial:
        n *= x
    p = torch.arange(n)
    got = row_major_mask_mod(spatial, kernel, stride, dilation, causal)(None, None, p[:, None], p[None, :])
    want, _ = mask_and_bias_index(spatial, kernel, stride, dilation, causal)
    assert torch.equal(got.expand(n, n), want)
