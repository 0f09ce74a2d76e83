"""nattn's NAT/DiNAT/DiNAT_s/isotropic models against the original SHI-Labs architectures.

``ORIGINAL`` transcribes the model definitions of SHI-Labs/Neighborhood-Attention-Transformer
(``classification/nat.py``, ``dinat.py``, ``dinats.py``, ``isotropic.py``); each registered
model must build exactly that.
"""

import pytest
import torch

import nattn  # noqa: F401  (registers the models with timm)

timm = pytest.importorskip("timm")

_NAT_DIL = ([1, 8, 1], [1, 4, 1, 4], [1, 2] * 9, [1] * 5)
_NAT_MINI_DIL = ([1, 8, 1], [1, 4, 1, 4], [1, 2] * 3, [1] * 5)
_S_DIL = ([1, 8], [1, 4], [1, 2] * 9, [1, 1])
_S_TINY_DIL = ([1, 8], [1, 4], [1, 2] * 3, [1, 1])

# name: (family, embed_dim, depths, heads, mlp_ratio, drop_path_rate, layer_scale, dilations)
ORIGINAL = {
    "nat_mini": ("nat", 64, (3, 4, 6, 5), (2, 4, 8, 16), 3, 0.2, None, None),
    "nat_tiny": ("nat", 64, (3, 4, 18, 5), (2, 4, 8, 16), 3, 0.2, None, None),
    "nat_small": ("nat", 96, (3, 4, 18, 5), (3, 6, 12, 24), 2, 0.3, 1e-5, None),
    "nat_base": ("nat", 128, (3, 4, 18, 5), (4, 8, 16, 32), 2, 0.5, 1e-5, None),
    "dinat_mini": ("nat", 64, (3, 4, 6, 5), (2, 4, 8, 16), 3, 0.2, None, _NAT_MINI_DIL),
    "dinat_tiny": ("nat", 64, (3, 4, 18, 5), (2, 4, 8, 16), 3, 0.2, None, _NAT_DIL),
    "dinat_small": ("nat", 96, (3, 4, 18, 5), (3, 6, 12, 24), 2, 0.3, None, _NAT_DIL),
    "dinat_base": ("nat", 128, (3, 4, 18, 5), (4, 8, 16, 32), 2, 0.5, 1e-5, _NAT_DIL),
    "dinat_large": ("nat", 192, (3, 4, 18, 5), (6, 12, 24, 48), 2, 0.35, None, _NAT_DIL),
    "dinat_s_tiny": ("dinat_s", 96, (2, 2, 6, 2), (3, 6, 12, 24), 4, 0.2, None, _S_TINY_DIL),
    "dinat_s_small": ("dinat_s", 96, (2, 2, 18, 2), (3, 6, 12, 24), 4, 0.3, None, _S_DIL),
    "dinat_s_base": ("dinat_s", 128, (2, 2, 18, 2), (4, 8, 16, 32), 4, 0.5, None, _S_DIL),
    "dinat_s_large": ("dinat_s", 192, (2, 2, 18, 2), (6, 12, 24, 48), 4, 0.35, None, _S_DIL),
    "nat_isotropic_small": ("iso", 384, (12,), (12,), 4, 0.1, None, ([1] * 12,)),
    "dinat_isotropic_small": ("iso", 384, (12,), (12,), 4, 0.1, None, ([1, 2] * 6,)),
    "nat_isotropic_base": ("iso", 768, (12,), (24,), 4, 0.4, None, ([1] * 12,)),
    "dinat_isotropic_base": ("iso", 768, (12,), (24,), 4, 0.4, None, ([1, 2] * 6,)),
}


def _stages(model):
    if hasattr(model, "stages"):
        return [list(stage.blocks) for stage in model.stages]
    return [list(model.blocks)]


@pytest.mark.parametrize("name", sorted(ORIGINAL))
def test_config_matches_original_definition(name):
    family, dim, depths, heads, mlp_ratio, dpr, layer_scale, dilations = ORIGINAL[name]
    with torch.device("meta"):
        model = timm.create_model(name)
    stages = _stages(model)
    assert [len(s) for s in stages] == list(depths)
    n_total = sum(depths)
    flat = [blk for s in stages for blk in s]
    for i, (stage, h) in enumerate(zip(stages, heads)):
        width = dim * 2 ** i if family != "iso" else dim
        want_dil = dilations[i] if dilations is not None else [1] * depths[i]
        for blk, d in zip(stage, want_dil):
            assert blk.attn.embed_dim == width and blk.attn.num_heads == h, (i, blk.attn)
            assert blk.attn.kernel_size == (7, 7) and blk.attn.dilation == (d, d)
            assert blk.attn.rpb is not None and tuple(blk.attn.rpb.shape) == (h, 13, 13)
            assert blk.mlp.fc1.out_features == int(width * mlp_ratio)
            assert (blk.gamma1 is not None) == (layer_scale is not None)
            assert (blk.gamma2 is not None) == (layer_scale is not None)
    # stochastic depth: torch.linspace(0, rate, total) over all blocks, as the original
    rates = [getattr(blk.drop_path, "drop_prob", 0.0) for blk in flat]
    want = torch.linspace(0, dpr, n_total).tolist()
    assert rates == pytest.approx(want, abs=1e-7)


def test_layer_scale_initial_value_is_the_original():
    # depths shrunk to keep it small; the layer scale comes from the variant's config
    for name, want in (("dinat_base", 1e-5), ("nat_small", 1e-5), ("nat_base", 1e-5)):
        model = timm.create_model(name, depths=(1, 1, 1, 1), dilations=[[1]] * 4)
        g = model.stages[1].blocks[0].gamma1.detach()
        torch.testing.assert_close(g, torch.full_like(g, want))
    for name in ("dinat_small", "dinat_large", "dinat_s_large"):
        model = timm.create_model(name, depths=(1, 1, 1, 1), dilations=[[1]] * 4, embed_dim=12,
                                  num_heads=(1, 1, 1, 1))
        assert "gamma1" not in str(list(model.state_dict()))


@pytest.mark.parametrize("dilations", [None, [None] * 4, [[None, 8], [1, None], None, [1, 1]]])
def test_dilation_none_means_one(dilations):
    """The original NAT passes dilation=None for its undilated blocks."""
    from nattn.models.nat import NAT

    with torch.device("meta"):  # timm.create_model drops None kwargs: build the class directly
        model = NAT(depths=(2, 2, 2, 2), dilations=dilations, embed_dim=16)
    got = [[blk.attn.dilation[0] for blk in stage.blocks] for stage in model.stages]
    if dilations is None or dilations[0] is None:
        assert got == [[1, 1]] * 4
    else:
        assert got == [[1, 8], [1, 1], [1, 1], [1, 1]]
    from nattn.models._common import NABlock

    assert NABlock(8, 2, 3, dilation=None).attn.dilation == (1, 1)
