"""nattn's NAT/DiNAT/DiNAT_s/isotropic models against the original SHI-Labs architectures.

``ORIGINAL`` transcribes the model definitions of SHI-Labs/Neighborhood-Attention-Transformer
(``classification/nat.py``, ``dinat.py``, ``dinats.py``, ``isotropic.py``); each registered
model must build exactly that. Then a small independent re-implementation of the original
architectures (plain torch, a naive NATTEN-semantics neighborhood attention, the original's
module names, so that its ``state_dict`` has the original checkpoint keys) is given random
weights, its state dict goes through nattn's ``checkpoint_filter_fn`` into nattn's model with
a strict load, and the logits must agree in float64.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

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


# --------------------------------------------------- the original architectures, re-written
def _window(length, kernel, dilation):
    """NATTEN's neighborhoods along one axis: key index and RPB index per (query, j)."""
    idx = torch.empty(length, kernel, dtype=torch.long)
    for i in range(length):
        g, ig = i % dilation, i // dilation
        group_len = (length - g + dilation - 1) // dilation
        start = max(0, min(ig - kernel // 2, group_len - kernel))
        idx[i] = (torch.arange(kernel) + start) * dilation + g
    rel = (idx - torch.arange(length)[:, None]) // dilation + kernel - 1
    return idx, rel


class RefNA(nn.Module):
    """natten<=0.17 NeighborhoodAttention2D (qkv, rpb, proj), computed naively."""

    def __init__(self, dim, num_heads, kernel_size=7, dilation=None):
        super().__init__()
        self.heads, self.k, self.d = num_heads, kernel_size, dilation or 1
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.rpb = nn.Parameter(torch.zeros(num_heads, 2 * kernel_size - 1, 2 * kernel_size - 1))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, h0, w0, c = x.shape
        win = self.k * self.d
        x = F.pad(x, (0, 0, 0, max(0, win - w0), 0, max(0, win - h0)))  # natten pads before qkv
        _, h, w, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, h, w, 3, self.heads, c // self.heads).permute(3, 0, 4, 1, 2, 5)
        ih, rh = _window(h, self.k, self.d)
        iw, rw = _window(w, self.k, self.d)
        # keys/values per (query row, query col, j_row, j_col): [B, heads, h, w, k, k, hd]
        kn = k[:, :, ih[:, None, :, None], iw[None, :, None, :]]
        vn = v[:, :, ih[:, None, :, None], iw[None, :, None, :]]
        logits = torch.einsum("bnhwc,bnhwijc->bnhwij", q * self.scale, kn)
        logits = logits + self.rpb[:, rh[:, None, :, None], rw[None, :, None, :]]
        attn = logits.flatten(-2).softmax(-1).view_as(logits)
        out = torch.einsum("bnhwij,bnhwijc->bnhwc", attn, vn)
        out = out.permute(0, 2, 3, 1, 4).reshape(b, h, w, c)[:, :h0, :w0]
        return self.proj(out)


class RefMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class RefLayer(nn.Module):
    """NATLayer / NATransformerLayer: pre-norm NA and MLP, optional gamma1/gamma2."""

    def __init__(self, dim, heads, dilation, mlp_ratio, layer_scale):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RefNA(dim, heads, 7, dilation)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = RefMlp(dim, int(dim * mlp_ratio))
        self.layer_scale = layer_scale is not None
        if self.layer_scale:
            self.gamma1 = nn.Parameter(layer_scale * torch.ones(dim))
            self.gamma2 = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x):
        g1, g2 = (self.gamma1, self.gamma2) if self.layer_scale else (1.0, 1.0)
        x = x + g1 * self.attn(self.norm1(x))
        return x + g2 * self.mlp(self.norm2(x))


class RefConvDown(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.reduction = nn.Conv2d(dim, 2 * dim, 3, 2, 1, bias=False)
        self.norm = nn.LayerNorm(2 * dim)

    def forward(self, x):
        return self.norm(self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class RefMerge(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x):
        x = F.pad(x, (0, 0, 0, x.shape[2] % 2, 0, x.shape[1] % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x))


class RefLevel(nn.Module):
    def __init__(self, dim, depth, heads, dilations, mlp_ratio, layer_scale, down):
        super().__init__()
        self.blocks = nn.ModuleList(
            RefLayer(dim, heads, None if dilations is None else dilations[i], mlp_ratio, layer_scale)
            for i in range(depth))
        self.downsample = down(dim) if down is not None else None

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x if self.downsample is None else self.downsample(x)


class RefPatchEmbed(nn.Module):
    def __init__(self, family, dim):
        super().__init__()
        if family == "nat":  # ConvTokenizer
            self.proj = nn.Sequential(nn.Conv2d(3, dim // 2, 3, 2, 1), nn.Conv2d(dim // 2, dim, 3, 2, 1))
            self.patch = 1
        else:  # Swin's PatchEmbed
            self.patch = 4 if family == "dinat_s" else 16
            self.proj = nn.Conv2d(3, dim, self.patch, self.patch)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        p = self.patch
        x = F.pad(x, (0, (-x.shape[-1]) % p, 0, (-x.shape[-2]) % p))
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class RefModel(nn.Module):
    """The original NAT/DiNAT (``levels``), DiNAT_s or isotropic (``layers``) classifier."""

    def __init__(self, name, num_classes=1000):
        super().__init__()
        family, dim, depths, heads, mlp_ratio, _, layer_scale, dilations = ORIGINAL[name]
        self.patch_embed = RefPatchEmbed(family, dim)
        if family == "iso":
            self.layers = nn.Sequential(*[RefLayer(dim, heads[0], dilations[0][i], mlp_ratio, None)
                                          for i in range(depths[0])])
            features = dim
        else:
            down = RefConvDown if family == "nat" else RefMerge
            levels = nn.ModuleList(
                RefLevel(dim * 2 ** i, depths[i], heads[i], None if dilations is None else dilations[i],
                         mlp_ratio, layer_scale, down if i < len(depths) - 1 else None)
                for i in range(len(depths)))
            setattr(self, "levels" if family == "nat" else "layers", levels)
            features = dim * 2 ** (len(depths) - 1)
        self.norm = nn.LayerNorm(features)
        self.head = nn.Linear(features, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        for layer in self.layers if hasattr(self, "layers") else self.levels:
            x = layer(x)
        return self.head(self.norm(x).flatten(1, 2).mean(1))


def _randomize(model, gen):
    """Random weights everywhere, well away from the initialisation (gamma 1e-5 would hide
    a block; LayerNorm 1/0 and zero biases would hide a mixed-up norm or bias)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if name.endswith(("gamma1", "gamma2")) or "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * noise)
            elif name.endswith("rpb"):
                p.copy_(noise)
            else:
                p.copy_(0.05 * noise)
    return model


def _check_against_original(name, checkpoint_filter_fn, state_dict_fn=lambda sd: sd, num_classes=10,
                            size=(40, 48), **model_kwargs):
    gen = torch.Generator().manual_seed(hash(name) % 2**31)
    ref = RefModel(name, num_classes).double().eval()
    _randomize(ref, gen)
    model = timm.create_model(name, num_classes=num_classes, **model_kwargs).double().eval()
    model.load_state_dict(checkpoint_filter_fn(state_dict_fn(ref.state_dict()), model), strict=True)
    x = torch.randn(2, 3, *size, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        want, got = ref(x), model(x)
    assert want.abs().max() > 1e-3  # the reference computes something
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    return ref, model


SMALL = ["nat_mini", "dinat_mini", "dinat_s_tiny", "nat_isotropic_small", "dinat_isotropic_small"]
LARGE = sorted(set(ORIGINAL) - set(SMALL))


def _filter(name):
    from nattn.models import dinat_s, isotropic, nat

    return {"nat": nat, "dinat_s": dinat_s, "iso": isotropic}[ORIGINAL[name][0]].checkpoint_filter_fn


@pytest.mark.parametrize("name", SMALL + LARGE)
def test_original_state_dict_gives_the_same_logits(name):
    size = (64, 80) if "isotropic" in name else (40, 48)
    _check_against_original(name, _filter(name), size=size)


# ------------------------------------------- detection/segmentation checkpoints, load errors
from nattn.models._checkpoints import CheckpointMismatchError  # noqa: E402
from nattn.models._create import PretrainedWeightsError  # noqa: E402


def _float32_exact(ref):
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.float().double())
    return ref


def _level_outputs(ref, x):
    """The original backbones' outputs: each level's blocks, before its downsampler."""
    x = ref.patch_embed(x)
    outs = []
    for level in ref.levels if hasattr(ref, "levels") else ref.layers:
        for blk in level.blocks:
            x = blk(x)
        outs.append(x)
        if level.downsample is not None:
            x = level.downsample(x)
    return outs


def _detection_checkpoint(ref, gen, tmp_path):
    """mmdet/mmseg layout: {'meta', 'state_dict': backbone.* (no norm/head, norm0..norm3), neck, heads}.
    Values are float32-exact: timm loads them into a float32 model that the tests then make float64."""
    sd = {"backbone." + k: v for k, v in ref.state_dict().items() if not k.startswith(("norm.", "head."))}
    norms = {}
    for i, level in enumerate(ref.levels if hasattr(ref, "levels") else ref.layers):
        c = level.blocks[0].norm1.weight.shape[0]
        norms[i] = ((1 + 0.2 * torch.randn(c, generator=gen)).double(), (0.2 * torch.randn(c, generator=gen)).double())
        sd[f"backbone.norm{i}.weight"], sd[f"backbone.norm{i}.bias"] = norms[i]
    sd["neck.lateral_convs.0.conv.weight"] = torch.randn(8, 4, 1, 1, generator=gen)
    sd["rpn_head.rpn_conv.bias"] = torch.randn(8, generator=gen)
    path = tmp_path / "det.pth"
    torch.save({"meta": {"epoch": 36}, "state_dict": sd}, path)
    return str(path), norms


@pytest.mark.parametrize("name", ["dinat_mini", "dinat_s_tiny"])
def test_detection_backbone_checkpoint_with_feature_norms(name, tmp_path):
    gen = torch.Generator().manual_seed(11)
    ref = RefModel(name).double().eval()
    _float32_exact(_randomize(ref, gen))
    path, norms = _detection_checkpoint(ref, gen, tmp_path)
    x = torch.randn(1, 3, 40, 56, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        levels = _level_outputs(ref, x)
    want = [F.layer_norm(y, y.shape[-1:], *norms[i]).permute(0, 3, 1, 2) for i, y in enumerate(levels)]

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # features_only: no norm/head to miss
        normed = timm.create_model(name, features_only=True, feature_norms=True, pretrained=True,
                                   pretrained_cfg_overlay=dict(file=path)).double().eval()
    plain = timm.create_model(name, features_only=True, pretrained=True,
                              pretrained_cfg_overlay=dict(file=path)).double().eval()
    with torch.no_grad():
        got_normed, got_plain = normed(x), plain(x)
    assert len(got_normed) == 4
    for g, w, p, raw in zip(got_normed, want, got_plain, levels):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(p, raw.permute(0, 3, 1, 2), rtol=1e-9, atol=1e-9)
    one = timm.create_model(name, features_only=True, feature_norms=True, out_indices=(2,), pretrained=True,
                            pretrained_cfg_overlay=dict(file=path)).double().eval()
    with torch.no_grad():
        torch.testing.assert_close(one(x)[0], want[2], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["dinat_mini", "nat_mini"])
def test_detectron2_pkl_backbone_checkpoint(name, tmp_path):
    """Mask2Former/OneFormer (detectron2) checkpoints: numpy arrays pickled under "model",
    backbone.* keys with norm0..norm3, other heads beside them."""
    import pickle
    gen = torch.Generator().manual_seed(21)
    ref = RefModel(name).double().eval()
    _float32_exact(_randomize(ref, gen))
    pth, norms = _detection_checkpoint(ref, gen, tmp_path)
    sd = torch.load(pth, weights_only=True)["state_dict"]
    path = tmp_path / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {k: v.float().numpy() for k, v in sd.items()}, "__author__": "Mask2Former",
                     "matching_heuristics": True}, f)
    x = torch.randn(1, 3, 40, 48, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        levels = _level_outputs(ref, x)
    model = timm.create_model(name, features_only=True, feature_norms=True, pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(path))).double().eval()
    with torch.no_grad():
        got = model(x)
    for i, (g, y) in enumerate(zip(got, levels)):
        torch.testing.assert_close(g, F.layer_norm(y, y.shape[-1:], *norms[i]).permute(0, 3, 1, 2),
                                   rtol=1e-9, atol=1e-9)


def test_pkl_checkpoint_never_unpickles_code(tmp_path):
    import pickle

    class Exploit:
        def __reduce__(self):
            return (print, ("this must not run",))
    path = tmp_path / "evil.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"x": Exploit()}}, f)
    with pytest.raises(PretrainedWeightsError, match="builtins.print"):
        timm.create_model("nat_mini", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


def test_detection_checkpoint_into_a_classifier_warns_and_loads_the_backbone(tmp_path):
    gen = torch.Generator().manual_seed(12)
    ref = RefModel("nat_mini").double()
    _randomize(ref, gen)
    path, _ = _detection_checkpoint(ref, gen, tmp_path)
    with pytest.warns(UserWarning, match="no final norm or classifier"):
        model = timm.create_model("nat_mini", pretrained=True, pretrained_cfg_overlay=dict(file=path))
    torch.testing.assert_close(model.stages[3].downsample.reduction.weight.double(),
                               ref.levels[2].downsample.reduction.weight)
    torch.testing.assert_close(model.stages[1].blocks[2].attn.rpb.double(), ref.levels[1].blocks[2].attn.rpb)


def test_feature_norms_from_a_classification_checkpoint_start_at_identity(tmp_path):
    gen = torch.Generator().manual_seed(13)
    ref = RefModel("nat_mini").double().eval()
    _float32_exact(_randomize(ref, gen))
    path = tmp_path / "cls.pth"
    torch.save({"model": ref.state_dict()}, path)
    model = timm.create_model("nat_mini", features_only=True, feature_norms=True, pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(path))).double().eval()
    x = torch.randn(1, 3, 32, 32, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        got, levels = model(x), _level_outputs(ref, x)
    for g, y in zip(got, levels):
        torch.testing.assert_close(g, F.layer_norm(y, y.shape[-1:]).permute(0, 3, 1, 2), rtol=1e-9, atol=1e-9)
    with pytest.raises(TypeError, match="feature_norms must be a bool"):
        timm.create_model("nat_mini", feature_norms="yes")


@pytest.mark.parametrize("features_only", [False, True])
def test_a_checkpoint_that_does_not_fit_names_the_keys(features_only, tmp_path):
    gen = torch.Generator().manual_seed(14)
    ref = RefModel("nat_mini")
    _randomize(ref, gen)
    sd = {("encoder." + k if "levels.1." in k else k): v for k, v in ref.state_dict().items()}
    path = tmp_path / "renamed.pth"
    torch.save(sd, path)
    with pytest.raises(CheckpointMismatchError) as info:
        timm.create_model("nat_mini", features_only=features_only, pretrained=True,
                          pretrained_cfg_overlay=dict(file=str(path)))
    msg = str(info.value)
    n = sum(1 for k in sd if k.startswith("encoder."))
    assert msg.startswith("nat_mini: weights from ") and str(path) in msg
    assert f"{n} missing: stages.1.blocks.0." in msg and f"{n} unexpected: encoder.levels.1." in msg
    assert "pretrained_cfg_overlay" not in msg

    # a detection checkpoint under another prefix loads nothing: an error, not silence
    torch.save({"model." + k: v for k, v in ref.state_dict().items()}, path)
    with pytest.raises(CheckpointMismatchError, match=r"\(0 of \d+ keys matched"):
        timm.create_model("nat_mini", features_only=features_only, pretrained=True,
                          pretrained_cfg_overlay=dict(file=str(path)))


def test_rpb_with_other_heads_is_reported_not_resized():
    """DiNAT-Large's tables (6-12-24-48 heads) into a 4-8-16-32-head model: the old mismatch."""
    from nattn.models.nat import checkpoint_filter_fn

    ref = RefModel("dinat_mini")
    model = timm.create_model("dinat_mini", num_heads=(1, 2, 4, 8))
    with pytest.raises(CheckpointMismatchError) as info:
        checkpoint_filter_fn(ref.state_dict(), model)
    msg = str(info.value)
    assert "18 of another shape: stages.0.blocks.0.attn.rpb (2, 13, 13) (model: (1, 13, 13))" in msg
    assert "missing" not in msg and "unexpected" not in msg


@pytest.mark.parametrize("content", [
    b"", b"not a checkpoint", bytes(range(256)), b"PK\x03\x04" + bytes(60), b"\x80\x02}q\x00.",
    *[bytes(torch.randint(0, 256, (64,), dtype=torch.uint8, generator=torch.Generator().manual_seed(s)).tolist())
      for s in range(8)],
], ids=lambda c: f"{len(c)}B")
def test_unreadable_file_error_does_not_suggest_a_file(tmp_path, content):
    """Whatever a broken file makes torch.load raise (OSError, UnpicklingError, IndexError,
    EOFError, ...), the error names the file and does not suggest passing a file."""
    path = tmp_path / "broken.pth"
    path.write_bytes(content)
    with pytest.raises(PretrainedWeightsError) as info:
        timm.create_model("nat_mini", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    msg = str(info.value)
    assert str(path) in msg and "could not be loaded" in msg
    assert "pretrained_cfg_overlay=dict(file=" not in msg


# ------------------------------------------------- Hugging Face transformers' shi-labs/* layout
def _to_hf(original, prefix, backbone_norms=None):
    """The original's state dict in transformers' Nat/Dinat layout (modeling_dinat.py):
    ``{prefix}embeddings.patch_embeddings.projection``, ``{prefix}encoder.levels.{i}.layers.{j}``
    with ``attention.self.{query,key,value,rpb}``, ``attention.output.dense``,
    ``layernorm_before/after``, ``intermediate.dense``, ``output.dense``,
    ``layer_scale_parameters`` [2, C]; ``{prefix}layernorm``, ``classifier``; the
    ``*Backbone`` has no prefix, no layernorm/classifier, and ``hidden_states_norms.stage{n}``."""
    block_names = {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.output.dense",
                   "attn.rpb": "attention.self.rpb", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    out = {}
    for key, value in original.items():
        parts = key.split(".")
        if key.startswith("patch_embed.proj."):
            out[prefix + "embeddings.patch_embeddings.projection." + ".".join(parts[2:])] = value
        elif key.startswith("patch_embed.norm."):
            out[prefix + "embeddings.norm." + parts[-1]] = value
        elif parts[0] == "levels" and parts[2] == "downsample":
            out[prefix + "encoder." + key] = value
        elif parts[0] == "levels":
            base = f"{prefix}encoder.levels.{parts[1]}.layers.{parts[3]}."
            rest = ".".join(parts[4:])
            if rest.startswith("attn.qkv."):
                for name, chunk in zip(("query", "key", "value"), value.chunk(3)):
                    out[base + f"attention.self.{name}.{parts[-1]}"] = chunk
            elif rest == "gamma1":
                out[base + "layer_scale_parameters"] = torch.stack([value, original[key[:-1] + "2"]])
            elif rest != "gamma2":
                name = rest if rest == "attn.rpb" else rest.rsplit(".", 1)[0]
                out[base + block_names[name] + rest[len(name):]] = value
        elif key.startswith("norm.") and backbone_norms is None:
            out[prefix + "layernorm." + parts[-1]] = value
        elif key.startswith("head.") and backbone_norms is None:
            out["classifier." + parts[-1]] = value
    for i, (w, b) in (backbone_norms or {}).items():
        out[f"hidden_states_norms.stage{i + 1}.weight"], out[f"hidden_states_norms.stage{i + 1}.bias"] = w, b
    return out


@pytest.mark.parametrize("name, prefix", [("nat_mini", "nat."), ("dinat_base", "dinat."), ("dinat_mini", "dinat.")])
def test_hugging_face_checkpoint_gives_the_same_logits(name, prefix):
    from nattn.models.nat import checkpoint_filter_fn

    def to_hf(sd):
        hf = _to_hf(sd, prefix)
        assert not any(k.startswith(("levels.", "patch_embed.")) for k in hf)
        if ORIGINAL[name][6] is not None:
            assert any(k.endswith("layer_scale_parameters") for k in hf)
        return hf

    _check_against_original(name, checkpoint_filter_fn, to_hf)


def test_hugging_face_backbone_checkpoint_with_feature_norms(tmp_path):
    gen = torch.Generator().manual_seed(15)
    ref = _float32_exact(_randomize(RefModel("dinat_mini").double().eval(), gen))
    norms = {i: ((1 + 0.2 * torch.randn(c, generator=gen)).double(), (0.2 * torch.randn(c, generator=gen)).double())
             for i, c in enumerate((64, 128, 256, 512))}
    path = tmp_path / "pytorch_model.bin"
    torch.save(_to_hf(ref.state_dict(), "", norms), path)
    model = timm.create_model("dinat_mini", features_only=True, feature_norms=True, pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(path))).double().eval()
    x = torch.randn(1, 3, 48, 40, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        got, levels = model(x), _level_outputs(ref, x)
    for i, (g, y) in enumerate(zip(got, levels)):
        torch.testing.assert_close(g, F.layer_norm(y, y.shape[-1:], *norms[i]).permute(0, 3, 1, 2),
                                   rtol=1e-9, atol=1e-9)


def test_hugging_face_checkpoint_missing_a_projection_is_named():
    from nattn.models.nat import checkpoint_filter_fn

    hf = _to_hf(RefModel("nat_mini").state_dict(), "nat.")
    del hf["nat.encoder.levels.2.layers.1.attention.self.key.weight"]
    with pytest.raises(CheckpointMismatchError, match=r"levels\.2\.blocks\.1\.attn\.qkv\.weight needs query, key "
                                                      r"and value, got only \['query', 'value'\]"):
        checkpoint_filter_fn(hf, timm.create_model("nat_mini"))


@pytest.mark.parametrize("name", ["nat_isotropic_small", "nat_video_tiny"])
def test_features_only_from_own_checkpoint_other_families(name, tmp_path):
    """create() passes features_only to every family's checkpoint_filter_fn."""
    torch.manual_seed(16)
    source = timm.create_model(name)
    path = tmp_path / "own.pth"
    torch.save(source.state_dict(), path)
    feats = timm.create_model(name, features_only=True, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    x = torch.randn(1, 3, 4, 32, 32) if "video" in name else torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want = source.eval().forward_intermediates(x, intermediates_only=True)
        got = feats.eval()(x)
    for g, w in zip(got, want[-len(got):]):
        torch.testing.assert_close(g, w)


def test_pretrained_strict_false_warns_with_the_list_and_loads_what_fits(tmp_path):
    gen = torch.Generator().manual_seed(17)
    ref = _randomize(RefModel("nat_mini"), gen)
    sd = {("encoder." + k if "levels.1.blocks.0." in k else k): v for k, v in ref.state_dict().items()}
    sd["levels.2.blocks.0.attn.rpb"] = torch.randn(3, 13, 13, generator=gen)  # another head count
    path = tmp_path / "partial.pth"
    torch.save(sd, path)
    torch.manual_seed(0)
    fresh = timm.create_model("nat_mini")
    with pytest.warns(UserWarning, match=r"missing: stages\.1\.blocks\.0\..*unexpected: encoder\.levels\.1\."
                                         r".*1 of another shape: stages\.2\.blocks\.0\.attn\.rpb"):
        torch.manual_seed(0)
        model = timm.create_model("nat_mini", pretrained=True, pretrained_strict=False,
                                  pretrained_cfg_overlay=dict(file=str(path)))
    # what fits is loaded; the rest keeps the initialisation a fresh model gets
    torch.testing.assert_close(model.stages[1].blocks[1].attn.qkv.weight, ref.levels[1].blocks[1].attn.qkv.weight)
    torch.testing.assert_close(model.stages[3].blocks[4].mlp.fc2.bias, ref.levels[3].blocks[4].mlp.fc2.bias)
    torch.testing.assert_close(model.stages[1].blocks[0].attn.qkv.weight, fresh.stages[1].blocks[0].attn.qkv.weight)
    torch.testing.assert_close(model.stages[2].blocks[0].attn.rpb, fresh.stages[2].blocks[0].attn.rpb)
    with pytest.raises(CheckpointMismatchError, match="pretrained_strict=False loads the keys that fit"):
        timm.create_model("nat_mini", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


@pytest.mark.parametrize("drop", [0.5, 0.3])
@pytest.mark.parametrize("layer_scale", [None, 0.5])
def test_block_fuses_stochastic_depth_into_the_residual_add(layer_scale, drop):
    """NABlock's addcmul branch equals x + timm's drop_path(branch) with the same draws (fresh
    seed), values and gradients; some samples are dropped and some kept. At drop 0.3 the
    1 / keep scale is not a power of two: addcmul's scalar rounds it once in float32 where
    timm divides the mask, so the values agree to float32 rounding."""
    from timm.layers import drop_path
    from nattn.models._common import NABlock

    seed = torch.seed() % 2**31
    torch.manual_seed(seed)
    blk = NABlock(16, 2, 3, drop_path=drop, layer_scale=layer_scale, backend="reference").train()
    x = torch.randn(16, 5, 6, 16)

    def timm_block(x):
        y = blk.attn(blk.norm1(x))
        x = x + drop_path(y if blk.gamma1 is None else blk.gamma1 * y, drop, True)
        y = blk.mlp(blk.norm2(x))
        return x + drop_path(y if blk.gamma2 is None else blk.gamma2 * y, drop, True)

    results = []
    for fn in (blk, timm_block):
        xi = x.clone().requires_grad_()
        torch.manual_seed(seed + 1)
        out = fn(xi)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), xi.grad, blk.norm1.weight.grad.clone()))
        blk.zero_grad(set_to_none=True)
    (a, ga, wa), (b, gb, wb) = results
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ga, gb)
    torch.testing.assert_close(wa, wb)
    blk.eval()
    plain = blk(x)
    per_sample = (a - plain).flatten(1).abs().amax(1)
    assert (per_sample > 0).any()  # a branch was dropped or rescaled
    y = blk.attn(blk.norm1(x))  # eval: x + gamma * branch, no stochastic depth
    mid = x + (y if blk.gamma1 is None else blk.gamma1 * y)
    y = blk.mlp(blk.norm2(mid))
    torch.testing.assert_close(plain, mid + (y if blk.gamma2 is None else blk.gamma2 * y))


@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_mlp_is_timms_mlp(drop):
    """The blocks' Mlp equals timm's (same parameter names, same dropout draws under one seed),
    without no-op modules when drop is 0."""
    from timm.layers import Mlp as TimmMlp
    from nattn.models._common import Mlp

    seed = torch.seed() % 2**31
    ours, theirs = Mlp(12, 20, drop=drop).train(), TimmMlp(12, 20, drop=drop).train()
    assert theirs.load_state_dict(ours.state_dict()) is not None
    assert (ours.drop is None) == (drop == 0)
    x = torch.randn(3, 5, 12)
    torch.manual_seed(seed)
    a = ours(x)
    torch.manual_seed(seed)
    torch.testing.assert_close(a, theirs(x))


@pytest.mark.parametrize("layer_scale", [None, 0.5])
def test_block_branch_under_autocast_is_the_promoted_addcmul(layer_scale):
    """Under autocast the residual add of a dropped-path branch runs without autocast's
    recasting (CUDA autocast promotes addcmul's bf16 inputs through cast kernels): the same
    values as the promoted op (x + y * mask in float32, fresh draws), a float32 residual,
    and gradients in each input's own dtype."""
    from nattn.models._common import NABlock

    seed = torch.seed() % 2**31
    blk = NABlock(16, 2, 3, drop_path=0.5, layer_scale=layer_scale, backend="reference").train()
    x = torch.randn(64, 3, 4, 16, requires_grad=True)
    y = torch.randn(64, 3, 4, 16).to(torch.bfloat16).requires_grad_()
    gamma = None if layer_scale is None else blk.gamma1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(seed)
        out = blk._add_branch(x, y, gamma)
    torch.manual_seed(seed)  # the same mask, drawn as the block draws it (at y's dtype)
    mask = y.new_empty(64, 1, 1, 1).bernoulli_(0.5).div_(0.5)  # timm's: 1 / keep = 2 is exact
    factor = mask.float() if gamma is None else mask * gamma
    want = torch.addcmul(x, y.float(), factor.float())
    assert out.dtype == torch.float32 and torch.equal(out, want)
    assert 0 < int((mask == 0).sum()) < 64  # both kinds of sample (all one kind: 2^-63)
    out.backward(torch.ones_like(out))
    assert x.grad.dtype == torch.float32 and y.grad.dtype == torch.bfloat16
    torch.testing.assert_close(y.grad.float(), factor.float().expand_as(out).to(torch.bfloat16).float())
