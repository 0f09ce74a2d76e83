"""Every registered model: timm builds it, it trains one step on the CPU (small input),
features_only works, and its parameter count matches the published table; plus the
timm contract (classifier reset, intermediates, original checkpoints, pretrained errors)."""

import math
import re

import pytest
import torch
import torch.nn.functional as F

import nattn  # noqa: F401  (registers the models with timm)

timm = pytest.importorskip("timm")
from nattn.models._create import PretrainedWeightsError  # noqa: E402

# Exact counts (1000 classes; video: 400) and the published figure in millions
# (NAT: arXiv:2204.07143, DiNAT, DiNAT_s, isotropic: arXiv:2209.15001). The papers
# round (DiNAT_s-Large 196.53M -> 197M) or truncate (DiNAT-Large 200.94M -> 200M).
PARAMS = {
    "nat_mini": (19984174, 20), "nat_tiny": (27901582, 28), "nat_small": (50743297, 51),
    "nat_base": (89769652, 90),
    "dinat_mini": (19984174, 20), "dinat_tiny": (27901582, 28), "dinat_small": (50719681, 51),
    "dinat_base": (89769652, 90), "dinat_large": (200943514, 200),
    "dinat_s_tiny": (28288354, 28), "dinat_s_small": (49606258, 50), "dinat_s_base": (87768224, 88),
    "dinat_s_large": (196532476, 197),
    "nat_isotropic_small": (21999736, 22), "nat_isotropic_base": (86465800, 86),
    "dinat_isotropic_small": (21999736, 22), "dinat_isotropic_base": (86465800, 86),
    "nat_video_tiny": (11512124, None), "dinat_video_tiny": (11512124, None),  # nattn's own design
}
MODELS = sorted(PARAMS)
SIZE = 32


def _input(name, batch=2):
    if "video" in name:
        return torch.randn(batch, 3, 4, SIZE, SIZE)
    return torch.randn(batch, 3, SIZE, SIZE)


def test_all_models_registered():
    registered = set(timm.list_models(["nat_*", "dinat_*"]))
    assert registered == set(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_param_count_matches_published(name):
    with torch.device("meta"):
        model = timm.create_model(name)
    count = sum(p.numel() for p in model.parameters())
    exact, published = PARAMS[name]
    assert count == exact
    if published is not None:
        assert published in (math.floor(count / 1e6), round(count / 1e6))


@pytest.mark.parametrize("name", MODELS)
def test_forward_backward_and_features(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5, drop_path_rate=0.1)
    x = _input(name, batch=1)  # DiNAT pads small maps up to kernel * dilation: keep the batch at 1
    out = model(x)
    assert out.shape == (1, 5)
    out.square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing
    # the same weights as a feature extractor, through timm's getter
    model.eval()
    with torch.no_grad():
        features = model.forward_intermediates(x, intermediates_only=True)
    info = model.feature_info
    assert [f.shape[1] for f in features] == [i["num_chs"] for i in info]
    for f, i in zip(features, info):
        assert f.shape[-1] == math.ceil(SIZE / i["reduction"])


@pytest.mark.parametrize("name", ["nat_mini", "dinat_s_tiny", "nat_isotropic_small", "nat_video_tiny"])
def test_features_only(name):
    model = timm.create_model(name, features_only=True)
    with torch.no_grad():
        features = model(_input(name, 1))
    channels = model.feature_info.channels()
    assert [f.shape[1] for f in features] == channels
    if "isotropic" in name:
        assert len(features) == 3  # last three blocks, as timm's ViTs
    else:
        assert len(features) == 4 and channels == [channels[0] * 2 ** i for i in range(4)]
    reductions = model.feature_info.reduction()
    assert [f.shape[-1] for f in features] == [math.ceil(SIZE / r) for r in reductions]
    picked = timm.create_model(name, features_only=True, out_indices=(1,) if "isotropic" not in name else (5,))
    with torch.no_grad():
        assert len(picked(_input(name, 1))) == 1


def test_intermediates_classifier_contract():
    torch.manual_seed(0)
    model = timm.create_model("nat_mini").eval()
    x = _input("nat_mini", 1)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
        assert len(inter) == 4 and inter[0].shape == (1, 64, 8, 8)
        nhwc = model.forward_intermediates(x, indices=[3], output_fmt="NHWC", intermediates_only=True)
        torch.testing.assert_close(nhwc[0], inter[3].permute(0, 2, 3, 1))
        model.reset_classifier(7)
        assert model(x).shape == (1, 7)
        model.reset_classifier(0)
        assert model(x).shape == (1, model.num_features) == (1, 512)
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NLC")


def test_dilation_schedules_and_layer_scale():
    def dilations(model):
        return [[blk.attn.dilation[0] for blk in stage.blocks] for stage in model.stages]

    with torch.device("meta"):
        dinat = timm.create_model("dinat_tiny")
        nat_small = timm.create_model("nat_small")
        dinat_small = timm.create_model("dinat_small")
        dinat_s = timm.create_model("dinat_s_tiny")
        iso = timm.create_model("dinat_isotropic_small")
    assert dilations(dinat) == [[1, 8, 1], [1, 4, 1, 4], [1, 2] * 9, [1] * 5]
    assert dilations(dinat_s) == [[1, 8], [1, 4], [1, 2] * 3, [1, 1]]
    assert [blk.attn.dilation for blk in iso.blocks] == [(1, 1), (2, 2)] * 6
    assert nat_small.stages[0].blocks[0].gamma1 is not None  # NAT-S/B: layer scale 1e-5
    assert dinat_small.stages[0].blocks[0].gamma1 is None
    assert all(blk.attn.rpb is not None and blk.attn.kernel_size == (7, 7)
               for stage in dinat.stages for blk in stage.blocks)


# ------------------------------------------------------------------ original checkpoints
def _to_original_hierarchical(state_dict, level_name):
    """Our keys -> the SHI-Labs layout: level i ends with the downsampler into level i+1."""
    out = {}
    for key, value in state_dict.items():
        m = re.match(r"^stages\.(\d+)\.downsample\.(.*)$", key)
        if m:
            key = f"{level_name}.{int(m.group(1)) - 1}.downsample.{m.group(2)}"
        else:
            key = re.sub(r"^stages\.", f"{level_name}.", key)
        out[key] = value
    return out


def _save(tmp_path, state_dict, wrap=None):
    path = tmp_path / "original.pth"
    torch.save({wrap: state_dict} if wrap else state_dict, path)
    return str(path)


def _assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


def test_loads_original_nat_checkpoint(tmp_path):
    torch.manual_seed(1)
    source = timm.create_model("nat_mini", layer_scale=1e-5)
    original = _to_original_hierarchical(source.state_dict(), "levels")
    # key names and shapes of the original NAT-Mini (SHI-Labs classification/nat.py)
    expected = {
        "patch_embed.proj.0.weight": (32, 3, 3, 3), "patch_embed.proj.1.weight": (64, 32, 3, 3),
        "patch_embed.norm.weight": (64,), "levels.0.blocks.0.attn.rpb": (2, 13, 13),
        "levels.0.blocks.0.attn.qkv.weight": (192, 64), "levels.0.blocks.2.mlp.fc1.weight": (192, 64),
        "levels.0.downsample.reduction.weight": (128, 64, 3, 3), "levels.2.downsample.norm.weight": (512,),
        "levels.3.blocks.4.attn.rpb": (16, 13, 13), "levels.1.blocks.0.gamma1": (128,),
        "norm.weight": (512,), "head.weight": (1000, 512),
    }
    for key, shape in expected.items():
        assert tuple(original[key].shape) == shape, key
    assert not any("levels.3.downsample" in k for k in original)
    path = _save(tmp_path, original, wrap="model")
    loaded = timm.create_model("nat_mini", pretrained=True, layer_scale=1e-5,
                               pretrained_cfg_overlay=dict(file=path))
    _assert_same_weights(source, loaded)
    # a different classifier: the head is left out, everything else loads
    fewer = timm.create_model("nat_mini", pretrained=True, num_classes=10, layer_scale=1e-5,
                              pretrained_cfg_overlay=dict(file=path))
    torch.testing.assert_close(fewer.stages[2].blocks[1].attn.rpb, source.stages[2].blocks[1].attn.rpb)
    assert fewer.head.weight.shape == (10, 512)


def test_rpb_tables_are_resized_for_another_kernel(tmp_path):
    torch.manual_seed(2)
    source = timm.create_model("nat_mini")
    path = _save(tmp_path, _to_original_hierarchical(source.state_dict(), "levels"))
    model = timm.create_model("nat_mini", pretrained=True, kernel_size=9, pretrained_cfg_overlay=dict(file=path))
    table = source.stages[0].blocks[0].attn.rpb.detach()
    want = F.interpolate(table[None], size=(17, 17), mode="bicubic", align_corners=False)[0]
    torch.testing.assert_close(model.stages[0].blocks[0].attn.rpb.detach(), want)


def test_loads_original_dinat_s_and_isotropic_checkpoints(tmp_path):
    torch.manual_seed(3)
    source = timm.create_model("dinat_s_tiny", num_classes=3)
    original = _to_original_hierarchical(source.state_dict(), "layers")
    assert tuple(original["layers.0.downsample.reduction.weight"].shape) == (192, 384)  # Swin merging
    assert tuple(original["layers.2.blocks.1.attn.rpb"].shape) == (12, 13, 13)
    assert tuple(original["patch_embed.proj.weight"].shape) == (96, 3, 4, 4)
    original = {"module." + k: v for k, v in original.items()}  # saved from DistributedDataParallel
    loaded = timm.create_model("dinat_s_tiny", num_classes=3, pretrained=True,
                               pretrained_cfg_overlay=dict(file=_save(tmp_path, original), num_classes=3))
    _assert_same_weights(source, loaded)

    source = timm.create_model("nat_isotropic_small", num_classes=3)
    original = {k.replace("blocks.", "layers.", 1) if k.startswith("blocks.") else k: v
                for k, v in source.state_dict().items()}
    assert tuple(original["layers.11.attn.rpb"].shape) == (12, 13, 13)
    loaded = timm.create_model("nat_isotropic_small", num_classes=3, pretrained=True,
                               pretrained_cfg_overlay=dict(file=_save(tmp_path, original, "state_dict"),
                                                           num_classes=3))
    _assert_same_weights(source, loaded)


def test_patch_merging_order_is_swin():
    """Concatenation order (0,0), (1,0), (0,1), (1,1) over each 2x2 group, as Swin/DiNAT_s."""
    from nattn.models.dinat_s import PatchMerging

    m = PatchMerging(1, 1)
    m.norm, m.reduction = torch.nn.Identity(), torch.nn.Identity()
    x = torch.arange(16.0).reshape(1, 4, 4, 1)
    merged = m(x)
    assert merged.shape == (1, 2, 2, 4)
    assert merged[0, 0, 1].tolist() == [x[0, 0, 2, 0], x[0, 1, 2, 0], x[0, 0, 3, 0], x[0, 1, 3, 0]]


def test_pretrained_errors_are_clear():
    with pytest.raises(PretrainedWeightsError, match="no pretrained weights are published"):
        timm.create_model("dinat_video_tiny", pretrained=True)
    with pytest.raises(PretrainedWeightsError, match="pretrained_cfg_overlay=dict\\(file="):
        timm.create_model("nat_mini", pretrained=True,
                          pretrained_cfg_overlay=dict(url="http://127.0.0.1:9/nat_mini.pth"))


def test_gradient_checkpointing_gives_same_gradients():
    torch.manual_seed(4)
    model = timm.create_model("nat_mini", num_classes=3, drop_path_rate=0.0)
    x = _input("nat_mini", 1)
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for g, w in zip((p.grad for p in model.parameters()), want):
        torch.testing.assert_close(g, w)


def test_import_nattn_without_timm():
    import subprocess
    import sys

    code = ("import sys; sys.modules['timm'] = None; import nattn, torch; "
            "assert not hasattr(nattn, 'models'); "
            "m = nattn.nn.NeighborhoodAttention1D(8, 2, 3); print(m(torch.randn(1, 5, 8)).shape)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([1, 5, 8])" in done.stdout


@pytest.mark.parametrize("name", ["nat_mini", "dinat_s_tiny", "dinat_video_tiny"])
def test_stage_layout_errors_name_the_arguments(name):
    with pytest.raises(ValueError, match=r"depths .* and num_heads .* must have one entry per stage"):
        timm.create_model(name, depths=(2, 2), num_heads=(2, 4, 8))
    with pytest.raises(ValueError, match=r"dilations must give one dilation per block"):
        timm.create_model(name, depths=(1, 1, 1, 1), dilations=[[1], [1], [1], [1, 2]])


def test_norms_are_torch_layer_norm_and_follow_timm_fast_norm():
    """Every norm is an nn.LayerNorm with torch's eps (1e-5, the original code's); with timm's
    fast-norm switch on at creation, the norms run at the autocast dtype (bf16 out) instead of
    float32, and the model's output stays close to the default one's."""
    from timm.layers import is_fast_norm, set_fast_norm
    from nattn.models._common import LayerNorm

    torch.manual_seed(torch.seed() % 2**31)
    x = torch.randn(2, 3, 64, 64)
    assert not is_fast_norm()
    plain = timm.create_model("nat_mini", num_classes=10, fp32_block_norms=True).eval()  # no stochastic depth
    norms = [m for m in plain.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(type(m) is LayerNorm and m.eps == 1e-5 for m in norms)
    set_fast_norm(True)
    try:
        fast = timm.create_model("nat_mini", num_classes=10).eval()
    finally:
        set_fast_norm(False)
    with torch.no_grad():  # gains not exactly representable in bf16, so the two paths differ
        for m in norms:
            m.weight.normal_(1.0, 0.1)
            m.bias.normal_(0.0, 0.1)
    fast.load_state_dict(plain.state_dict())
    norm = fast.stages[0].blocks[0].norm1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(torch.randn(2, 8, 8, norm.normalized_shape[0])).dtype == torch.bfloat16
        assert plain.stages[0].blocks[0].norm1(torch.randn(2, 8, 8, 64)).dtype == torch.float32
        a, b = plain(x).float(), fast(x).float()
    assert torch.isfinite(b).all()
    assert 0 < (a - b).norm() / a.norm() < 0.05


@pytest.mark.parametrize("name", ["nat_mini", "dinat_s_tiny", "nat_isotropic_small", "nat_video_tiny"])
def test_block_norms_run_at_the_autocast_dtype(name):
    """The blocks' norm1 / norm2 (outputs that feed only a Linear) normalize at the autocast
    dtype by default: exactly torch's norm of the rounded input and parameters, within a few
    bf16 steps of the float32 norm the Linear would round, gradients in the parameters'
    dtype; outside autocast they are the plain norm, bit for bit. ``fp32_block_norms=True``
    keeps torch's float32 norm; both models take the same state dict."""
    from nattn.models._common import BranchLayerNorm, LayerNorm

    torch.manual_seed(torch.seed() % 2**31)
    kw = dict(depth=1) if "isotropic" in name else {} if "dinat" in name else dict(depths=(1, 1, 1, 1))
    fast = timm.create_model(name, num_classes=10, **kw).eval()
    slow = timm.create_model(name, num_classes=10, fp32_block_norms=True, **kw).eval()
    blocks = [m for m in fast.modules() if hasattr(m, "norm2") and hasattr(m, "mlp")]
    assert blocks and all(type(b.norm1) is BranchLayerNorm and type(b.norm2) is BranchLayerNorm for b in blocks)
    others = [m for n, m in fast.named_modules()
              if isinstance(m, torch.nn.LayerNorm) and not n.endswith(("norm1", "norm2"))]
    assert others and all(type(m) is LayerNorm for m in others)  # stem, downsamplers, head: float32 under autocast
    assert all(type(m) is LayerNorm for m in slow.modules() if isinstance(m, torch.nn.LayerNorm))
    with torch.no_grad():
        for m in slow.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.1)
                m.bias.normal_(0.0, 0.1)
    fast.load_state_dict(slow.state_dict())

    norm = blocks[0].norm1
    c = norm.normalized_shape[0]
    t = (torch.randn(2, 5, 7, c) * 3 + 1).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(t)
        want_fp32 = F.layer_norm(t, (c,), norm.weight, norm.bias, 1e-5)  # float32 under autocast
    assert y.dtype == torch.bfloat16
    want = F.layer_norm(t.detach().bfloat16(), (c,), norm.weight.detach().bfloat16(), norm.bias.detach().bfloat16(), 1e-5)
    assert torch.equal(y, want)
    # rounding the input, the gains and the output: a few bf16 steps (2^-8) of the normalized scale
    err = (y.float() - want_fp32.detach()).abs() / (1 + want_fp32.detach().abs())
    assert 0 < err.max() < 2 ** -6 and err.mean() < 2 ** -9
    y.float().square().sum().backward()
    assert t.grad.dtype == torch.float32 and norm.weight.grad.dtype == torch.float32
    assert torch.isfinite(t.grad).all() and norm.weight.grad.abs().sum() > 0
    with torch.no_grad():
        u = torch.randn(2, 5, 7, c)
        assert torch.equal(norm(u), F.layer_norm(u, (c,), norm.weight, norm.bias, 1e-5))

    x = _input(name)
    with torch.no_grad():
        assert torch.equal(fast(x), slow(x))  # no autocast: identical
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a, b = slow(x).float(), fast(x).float()
    assert torch.isfinite(b).all()
    assert 0 < (a - b).norm() / a.norm() < 0.05
