"""The flex layout chooser: its block estimate against brute-force counts, and its choices."""

import pytest
import torch

import nattn.backends.flex_layout_choice as choice
from nattn.backends.flex_layout import TileLayout
from nattn.backends.flex_mask import neighborhood_mask_mod


def _exact_blocks(layout, kernel, stride, causal):
    """(full, non-empty) 128x128 blocks summed over all query blocks, by evaluating the mask."""
    n = layout.num_positions
    nb = -(-n // choice.BLOCK)
    f = neighborhood_mask_mod(layout, kernel, stride, causal)
    m = f(None, None, torch.arange(n)[:, None], torch.arange(n)[None, :]).expand(n, n)
    m = torch.nn.functional.pad(m, (0, nb * choice.BLOCK - n, 0, nb * choice.BLOCK - n))
    m = m.reshape(nb, choice.BLOCK, nb, choice.BLOCK)
    real = torch.nn.functional.pad(layout.real, (0, nb * choice.BLOCK - n)).reshape(nb, choice.BLOCK)
    full = (m.all(3).all(1)).sum().item()
    # Rows of padded queries do not count (the estimate looks at real queries only).
    nonempty = (m & real[:, :, None, None]).any(3).any(1).sum().item()
    return full, nonempty


@pytest.mark.parametrize("spatial, kernel, stride, dilation, causal, tile", [
    ((32, 32), (7, 7), (1, 1), (1, 1), (False, False), (8, 8)),
    ((32, 32), (7, 7), (1, 1), (1, 1), (False, False), (1, 1)),
    ((24, 40), (5, 9), (2, 1), (2, 1), (True, False), (4, 8)),
    ((8, 12, 16), (3, 5, 7), (1, 1, 1), (1, 2, 1), (False, False, True), (4, 4, 4)),
    ((8, 12, 16), (3, 5, 7), (1, 1, 1), (1, 2, 1), (False, False, True), (1, 1, 1)),
])
def test_estimate_counts_blocks(monkeypatch, spatial, kernel, stride, dilation, causal, tile):
    """Full blocks exactly, non-empty ones at least (exactly when query blocks are boxes)."""
    layout = TileLayout(spatial, tile, dilation)
    tables = [choice.axis_window_table(*a) for a in zip(spatial, kernel, stride, dilation, causal)]
    monkeypatch.setattr(choice, "SAMPLES", 10 ** 6)
    n_q = len(torch.linspace(0, -(-layout.num_positions // choice.BLOCK) - 1, 10 ** 6).round().long().unique())
    monkeypatch.setattr(choice, "PARTIAL_COST", 0.0)
    full = choice.estimate_cost(layout, tables, tiled=False) * n_q
    monkeypatch.setattr(choice, "PARTIAL_COST", 1.0)
    nonempty = choice.estimate_cost(layout, tables, tiled=False) * n_q
    want_full, want_nonempty = _exact_blocks(layout, kernel, stride, causal)
    assert round(full) == want_full
    assert round(nonempty) >= want_nonempty
    if tile == (8, 8):  # 32 / 8 tiles per row, two tiles per block: every block is a box
        assert round(nonempty) == want_nonempty


def test_window_table_is_the_oracle_rule():
    from oracle import axis_allowed

    for args in [(11, 4, 3, 2, False), (13, 5, 2, 2, True), (9, 3, 1, 3, False)]:
        n = args[0]
        want = torch.tensor([[axis_allowed(i, j, *args) for j in range(n)] for i in range(n)])
        assert torch.equal(choice.axis_window_table(*args), want)


def test_choices_on_anchor_shapes():
    """Large windows keep tiles (many full blocks); small 3-D/2-D windows go row-major."""
    assert choice.choose_layout_tile((256, 256), (80, 80), (1, 1), (1, 1), (False, False)) == (8, 8)
    assert choice.choose_layout_tile((128, 128), (13, 13), (1, 1), (1, 1), (False, False)) == (8, 8)
    assert choice.choose_layout_tile((16, 32, 32), (5, 7, 7), (1,) * 3, (1,) * 3, (False,) * 3) == (1, 1, 1)
    assert choice.choose_layout_tile((56, 56), (7, 7), (1, 1), (1, 1), (False, False)) == (1, 1)
    assert choice.choose_layout_tile((32768,), (2048,), (1,), (1,), (False,)) == (1,)
