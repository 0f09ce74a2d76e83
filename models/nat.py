"""NAT and DiNAT (hierarchical): Hassani et al., "Neighborhood Attention Transformer"
(arXiv:2204.07143) and "Dilated Neighborhood Attention Transformer" (arXiv:2209.15001).

Overlapping convolutional tokenizer (two 3x3 stride-2 convs, 4x downsampling), four
stages of NA blocks with 7x7 kernels, 3x3 stride-2 conv downsamplers between stages.
DiNAT is NAT with a dilation per block (alternating NA and dilated NA). Stage ``i``
starts with its downsampler, so stage outputs are the features at stride 4, 8, 16, 32.
"""

from __future__ import annotations

from typing import Optional, Sequence

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ._checkpoints import rename_stages
from ._common import ChannelsLastBackbone, LayerNorm, NAStage, block_dilations
from ._create import create

__all__ = ["NAT", "checkpoint_filter_fn"]


class ConvTokenizer(nn.Module):
    """[B, C_in, H, W] -> [B, H/4, W/4, C]: two overlapping 3x3 stride-2 convs, then a norm."""

    def __init__(self, in_chans: int = 3, embed_dim: int = 64, norm_layer=LayerNorm):
        super().__init__()
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, embed_dim // 2, 3, stride=2, padding=1),
            nn.Conv2d(embed_dim // 2, embed_dim, 3, stride=2, padding=1),
        )
        self.norm = norm_layer(embed_dim)

    def forward(self, x):
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class ConvDownsampler(nn.Module):
    """[B, H, W, C] -> [B, H/2, W/2, 2C]: 3x3 stride-2 conv (no bias), then a norm."""

    def __init__(self, dim: int, out_dim: int, norm_layer=LayerNorm):
        super().__init__()
        self.reduction = nn.Conv2d(dim, out_dim, 3, stride=2, padding=1, bias=False)
        self.norm = norm_layer(out_dim)

    def forward(self, x):
        return self.norm(self.reduction(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


class NAT(ChannelsLastBackbone):
    """NAT / DiNAT classifier and backbone (``dilations=None`` is NAT)."""

    def __init__(
        self, in_chans: int = 3, num_classes: int = 1000, global_pool: str = "avg",
        embed_dim: int = 64, depths=(3, 4, 6, 5), num_heads=(2, 4, 8, 16), kernel_size: int = 7,
        dilations: Optional[Sequence[Sequence[int]]] = None, mlp_ratio: float = 3.0,
        qkv_bias: bool = True, qk_scale: Optional[float] = None, drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.2,
        layer_scale: Optional[float] = None, norm_layer=LayerNorm, backend: Optional[str] = None,
        feature_norms: bool = False, fp32_block_norms: bool = False,
    ):
        super().__init__()
        dilations = block_dilations(depths, num_heads, dilations)
        dims, dpr = self._pyramid(num_classes, global_pool, embed_dim, depths, drop_path_rate)
        self.patch_embed = ConvTokenizer(in_chans, embed_dim, norm_layer)
        stages = []
        for i, depth in enumerate(depths):
            down = ConvDownsampler(dims[i - 1], dims[i], norm_layer) if i > 0 else None
            stages.append(NAStage(
                dims[i], depth, num_heads[i], kernel_size, dilations[i], down, dpr[i], mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                qk_scale=qk_scale, proj_drop=proj_drop_rate, attn_drop=attn_drop_rate,
                layer_scale=layer_scale, norm_layer=norm_layer, backend=backend, fp32_block_norms=fp32_block_norms,
            ))
            self.feature_info.append(dict(num_chs=dims[i], reduction=4 * 2 ** i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self._add_head(norm_layer, drop_rate, feature_norms)


def checkpoint_filter_fn(state_dict, model, features_only: bool = False, strict: bool = True):
    """Load original SHI-Labs NAT/DiNAT checkpoints (``levels.{i}...``; classification, or
    detection/segmentation with ``backbone.`` and ``norm{i}``) or our own."""
    return rename_stages(state_dict, "levels", model, features_only=features_only, strict=strict)


def _cfg(url: str = "", **kwargs):
    return {
        "url": url, "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7),
        "crop_pct": 0.875, "interpolation": "bicubic", "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj.0", "classifier": "head",
        "license": "mit", **kwargs,
    }


_NAT_URL = "https://shi-labs.com/projects/nat/checkpoints/CLS/{}.pth"
_DINAT_URL = "https://shi-labs.com/projects/dinat/checkpoints/imagenet1k/{}.pth"
default_cfgs = generate_default_cfgs({
    **{f"nat_{s}.in1k": _cfg(_NAT_URL.format(f"nat_{s}"), paper_ids="arXiv:2204.07143")
       for s in ("mini", "tiny", "small", "base")},
    **{f"dinat_{s}.in1k": _cfg(_DINAT_URL.format(f"dinat_{s}_in1k_224"), paper_ids="arXiv:2209.15001")
       for s in ("mini", "tiny", "small", "base")},
    "dinat_large.in22k_ft_in1k": _cfg(_DINAT_URL.format("dinat_large_in22k_in1k_224"),
                                      paper_ids="arXiv:2209.15001"),
})

# (depths, heads, embed_dim, mlp_ratio, drop_path_rate), as in SHI-Labs'
# classification/nat.py and classification/dinat.py. Large exists only as DiNAT.
_CONFIGS = {
    "mini": ((3, 4, 6, 5), (2, 4, 8, 16), 64, 3.0, 0.2),
    "tiny": ((3, 4, 18, 5), (2, 4, 8, 16), 64, 3.0, 0.2),
    "small": ((3, 4, 18, 5), (3, 6, 12, 24), 96, 2.0, 0.3),
    "base": ((3, 4, 18, 5), (4, 8, 16, 32), 128, 2.0, 0.5),
    "large": ((3, 4, 18, 5), (6, 12, 24, 48), 192, 2.0, 0.35),
}
# Layer scale (per-channel gains ``gamma1``/``gamma2`` initialised to this) differs between
# the families: NAT-Small/Base have it, of DiNAT only Base does.
_LAYER_SCALE = {
    False: {"small": 1e-5, "base": 1e-5},
    True: {"base": 1e-5},
}


def dinat_dilations(depths: Sequence[int], stage_dilations=(8, 4, 2, 1)):
    """DiNAT's schedule: blocks alternate NA (dilation 1) and dilated NA with the stage's
    dilation, chosen so that ``kernel * dilation`` covers the 224x224 feature map."""
    return [[1 if j % 2 == 0 else d for j in range(depth)] for depth, d in zip(depths, stage_dilations)]


def _model_args(size: str, dilated: bool, kwargs):
    depths, heads, dim, mlp, dpr = _CONFIGS[size]
    args = dict(depths=depths, num_heads=heads, embed_dim=dim, mlp_ratio=mlp, drop_path_rate=dpr,
                layer_scale=_LAYER_SCALE[dilated].get(size), kernel_size=7)
    if dilated:
        args.update(dilations=dinat_dilations(depths))
    args.update(kwargs)
    return args


def _create(variant: str, pretrained: bool, **kwargs):
    return create(NAT, variant, pretrained, checkpoint_filter_fn, (0, 1, 2, 3), **kwargs)


@register_model
def nat_mini(pretrained: bool = False, **kwargs) -> NAT:
    return _create("nat_mini", pretrained, **_model_args("mini", False, kwargs))


@register_model
def nat_tiny(pretrained: bool = False, **kwargs) -> NAT:
    return _create("nat_tiny", pretrained, **_model_args("tiny", False, kwargs))


@register_model
def nat_small(pretrained: bool = False, **kwargs) -> NAT:
    return _create("nat_small", pretrained, **_model_args("small", False, kwargs))


@register_model
def nat_base(pretrained: bool = False, **kwargs) -> NAT:
    return _create("nat_base", pretrained, **_model_args("base", False, kwargs))


@register_model
def dinat_mini(pretrained: bool = False, **kwargs) -> NAT:
    return _create("dinat_mini", pretrained, **_model_args("mini", True, kwargs))


@register_model
def dinat_tiny(pretrained: bool = False, **kwargs) -> NAT:
    return _create("dinat_tiny", pretrained, **_model_args("tiny", True, kwargs))


@register_model
def dinat_small(pretrained: bool = False, **kwargs) -> NAT:
    return _create("dinat_small", pretrained, **_model_args("small", True, kwargs))


@register_model
def dinat_base(pretrained: bool = False, **kwargs) -> NAT:
    return _create("dinat_base", pretrained, **_model_args("base", True, kwargs))


@register_model
def dinat_large(pretrained: bool = False, **kwargs) -> NAT:
    return _create("dinat_large", pretrained, **_model_args("large", True, kwargs))
