"""VideoNAT: a hierarchical 3-D (DiNAT-style) video backbone on NeighborhoodAttention3D.

Input ``[B, C, T, H, W]``. A 3-D overlapping conv tokenizer reduces (T, H, W) by (2, 4, 4);
four stages of 3-D NA blocks (kernel 3x7x7) follow, with 1x3x3 stride-(1, 2, 2) conv
downsamplers between them (time is kept, space halves). In the dilated variant every
other block dilates the spatial axes (8, 4, 2, 1 per stage: the 56/28/14/7 maps of a
224x224 clip). This is nattn's own design; no pretrained weights are published.
"""

from __future__ import annotations

from typing import Optional, Sequence

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ._checkpoints import unwrap_state_dict
from ._common import ChannelsLastBackbone, LayerNorm, NAStage, block_dilations
from ._create import create

__all__ = ["VideoNAT"]


class ConvTokenizer3d(nn.Module):
    """[B, C_in, T, H, W] -> [B, T/2, H/4, W/4, C]."""

    def __init__(self, in_chans: int = 3, embed_dim: int = 64, norm_layer=LayerNorm):
        super().__init__()
        self.proj = nn.Sequential(
            nn.Conv3d(in_chans, embed_dim // 2, 3, stride=(1, 2, 2), padding=1),
            nn.Conv3d(embed_dim // 2, embed_dim, 3, stride=2, padding=1),
        )
        self.norm = norm_layer(embed_dim)

    def forward(self, x):
        return self.norm(self.proj(x).permute(0, 2, 3, 4, 1))


class SpatialDownsampler3d(nn.Module):
    """[B, T, H, W, C] -> [B, T, H/2, W/2, C_out]."""

    def __init__(self, dim: int, out_dim: int, norm_layer=LayerNorm):
        super().__init__()
        self.reduction = nn.Conv3d(dim, out_dim, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1), bias=False)
        self.norm = norm_layer(out_dim)

    def forward(self, x):
        return self.norm(self.reduction(x.permute(0, 4, 1, 2, 3)).permute(0, 2, 3, 4, 1))


class VideoNAT(ChannelsLastBackbone):
    """3-D NA video classifier/backbone; features are ``[B, C, T', H', W']``."""

    def __init__(
        self, in_chans: int = 3, num_classes: int = 400, global_pool: str = "avg", embed_dim: int = 64,
        depths=(2, 2, 6, 2), num_heads=(2, 4, 8, 16), kernel_size=(3, 7, 7),
        dilations: Optional[Sequence[Sequence[int]]] = None, mlp_ratio: float = 3.0, qkv_bias: bool = True,
        drop_rate: float = 0.0, proj_drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.2, layer_scale: Optional[float] = None, norm_layer=LayerNorm,
        backend: Optional[str] = None, fp32_block_norms: bool = False,
    ):
        super().__init__()
        dilations = block_dilations(depths, num_heads, dilations)
        dims, dpr = self._pyramid(num_classes, global_pool, embed_dim, depths, drop_path_rate)
        self.patch_embed = ConvTokenizer3d(in_chans, embed_dim, norm_layer)
        stages = []
        for i, depth in enumerate(depths):
            down = SpatialDownsampler3d(dims[i - 1], dims[i], norm_layer) if i > 0 else None
            spatial_dilations = [(1, d, d) for d in dilations[i]]  # dilate H and W, never T
            stages.append(NAStage(
                dims[i], depth, num_heads[i], kernel_size, spatial_dilations, down, dpr[i], na_dim=3,
                mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, proj_drop=proj_drop_rate, attn_drop=attn_drop_rate,
                layer_scale=layer_scale, norm_layer=norm_layer, backend=backend, fp32_block_norms=fp32_block_norms,
            ))
            self.feature_info.append(dict(num_chs=dims[i], reduction=4 * 2 ** i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self._add_head(norm_layer, drop_rate)


def checkpoint_filter_fn(state_dict, model, features_only: bool = False, strict: bool = True):
    """nattn's own video checkpoints (no published ones): unwrapped, passed through."""
    return unwrap_state_dict(state_dict)


def _cfg(**kwargs):
    return {
        "url": "", "num_classes": 400, "input_size": (3, 224, 224), "pool_size": (8, 7, 7),  # per frame; clips of 16
        "crop_pct": 0.875, "interpolation": "bicubic", "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj.0", "classifier": "head",
        "license": "mit", **kwargs,
    }


default_cfgs = generate_default_cfgs({"nat_video_tiny": _cfg(), "dinat_video_tiny": _cfg()})

_DEPTHS = (2, 2, 6, 2)


def _create(variant: str, dilated: bool, pretrained: bool, kwargs):
    args = dict(depths=_DEPTHS, num_heads=(2, 4, 8, 16), embed_dim=64, mlp_ratio=3.0, kernel_size=(3, 7, 7))
    if dilated:
        args["dilations"] = [[1 if j % 2 == 0 else d for j in range(n)] for n, d in zip(_DEPTHS, (8, 4, 2, 1))]
    args.update(kwargs)
    return create(VideoNAT, variant, pretrained, checkpoint_filter_fn, (0, 1, 2, 3), **args)


@register_model
def nat_video_tiny(pretrained: bool = False, **kwargs) -> VideoNAT:
    return _create("nat_video_tiny", False, pretrained, kwargs)


@register_model
def dinat_video_tiny(pretrained: bool = False, **kwargs) -> VideoNAT:
    return _create("dinat_video_tiny", True, pretrained, kwargs)
