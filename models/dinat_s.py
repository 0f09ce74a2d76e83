"""DiNAT_s: the Swin-like layout of DiNAT (arXiv:2209.15001): Swin's 4x4 patch embedding
and patch merging, with window attention replaced by NA and shifted-window attention
by dilated NA (alternating blocks)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch.nn.functional as F
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ._checkpoints import rename_stages
from ._common import ChannelsLastBackbone, LayerNorm, NAStage, block_dilations
from ._create import create
from .nat import _cfg, dinat_dilations

__all__ = ["DiNAT_s", "checkpoint_filter_fn"]


class PatchEmbed(nn.Module):
    """[B, C_in, H, W] -> [B, H/p, W/p, C]: non-overlapping p x p patches (padded), norm."""

    def __init__(self, patch_size: int = 4, in_chans: int = 3, embed_dim: int = 96, norm_layer=LayerNorm):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else nn.Identity()

    def forward(self, x):
        p = self.patch_size
        x = F.pad(x, (0, (-x.shape[-1]) % p, 0, (-x.shape[-2]) % p))
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


class PatchMerging(nn.Module):
    """[B, H, W, C] -> [B, H/2, W/2, 2C]: each 2x2 group concatenated, norm, linear.

    Concatenation order (row, col) = (0,0), (1,0), (0,1), (1,1), Swin's, so that
    DiNAT_s checkpoints load.
    """

    def __init__(self, dim: int, out_dim: int, norm_layer=LayerNorm):
        super().__init__()
        self.norm = norm_layer(4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim, bias=False)

    def forward(self, x):
        b, h, w, c = x.shape
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        h, w = x.shape[1] // 2, x.shape[2] // 2
        # [B, h, row, w, col, C] -> [B, h, w, col, row, C]: col-major over the 2x2 group
        x = x.reshape(b, h, 2, w, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, h, w, 4 * c)
        return self.reduction(self.norm(x))


class DiNAT_s(ChannelsLastBackbone):
    """DiNAT_s classifier and backbone."""

    def __init__(
        self, in_chans: int = 3, num_classes: int = 1000, global_pool: str = "avg", patch_size: int = 4,
        embed_dim: int = 96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), kernel_size: int = 7,
        dilations: Optional[Sequence[Sequence[int]]] = None, mlp_ratio: float = 4.0, qkv_bias: bool = True,
        qk_scale: Optional[float] = None, drop_rate: float = 0.0, proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0, drop_path_rate: float = 0.2, norm_layer=LayerNorm,
        backend: Optional[str] = None, feature_norms: bool = False, fp32_block_norms: bool = False,
    ):
        super().__init__()
        dilations = block_dilations(depths, num_heads, dilations)
        dims, dpr = self._pyramid(num_classes, global_pool, embed_dim, depths, drop_path_rate)
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, norm_layer)
        stages = []
        for i, depth in enumerate(depths):
            down = PatchMerging(dims[i - 1], dims[i], norm_layer) if i > 0 else None
            stages.append(NAStage(
                dims[i], depth, num_heads[i], kernel_size, dilations[i], down, dpr[i], mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, norm_layer=norm_layer, backend=backend, fp32_block_norms=fp32_block_norms,
            ))
            self.feature_info.append(dict(num_chs=dims[i], reduction=patch_size * 2 ** i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self._add_head(norm_layer, drop_rate, feature_norms)


def checkpoint_filter_fn(state_dict, model, features_only: bool = False, strict: bool = True):
    """Load original DiNAT_s checkpoints (``layers.{i}...``; classification, or
    detection/segmentation with ``backbone.`` and ``norm{i}``) or our own."""
    return rename_stages(state_dict, "layers", model, features_only=features_only, strict=strict)


_URL = "https://shi-labs.com/projects/dinat/checkpoints/imagenet1k/{}.pth"
default_cfgs = generate_default_cfgs({
    "dinat_s_tiny.in1k": _cfg(_URL.format("dinat_s_tiny_in1k_224"), first_conv="patch_embed.proj"),
    "dinat_s_small.in1k": _cfg(_URL.format("dinat_s_small_in1k_224"), first_conv="patch_embed.proj"),
    "dinat_s_base.in1k": _cfg(_URL.format("dinat_s_base_in1k_224"), first_conv="patch_embed.proj"),
    "dinat_s_large.in22k_ft_in1k": _cfg(_URL.format("dinat_s_large_in1k_224"), first_conv="patch_embed.proj"),
})

# (depths, heads, embed_dim, drop_path_rate), as in SHI-Labs' classification/dinats.py;
# mlp_ratio 4, kernel 7 and no layer scale throughout.
_CONFIGS = {
    "tiny": ((2, 2, 6, 2), (3, 6, 12, 24), 96, 0.2),
    "small": ((2, 2, 18, 2), (3, 6, 12, 24), 96, 0.3),
    "base": ((2, 2, 18, 2), (4, 8, 16, 32), 128, 0.5),
    "large": ((2, 2, 18, 2), (6, 12, 24, 48), 192, 0.35),
}


def _create(size: str, pretrained: bool, kwargs):
    depths, heads, dim, dpr = _CONFIGS[size]
    args = dict(depths=depths, num_heads=heads, embed_dim=dim, drop_path_rate=dpr, mlp_ratio=4.0,
                kernel_size=7, dilations=dinat_dilations(depths))
    args.update(kwargs)
    return create(DiNAT_s, f"dinat_s_{size}", pretrained, checkpoint_filter_fn, (0, 1, 2, 3), **args)


@register_model
def dinat_s_tiny(pretrained: bool = False, **kwargs) -> DiNAT_s:
    return _create("tiny", pretrained, kwargs)


@register_model
def dinat_s_small(pretrained: bool = False, **kwargs) -> DiNAT_s:
    return _create("small", pretrained, kwargs)


@register_model
def dinat_s_base(pretrained: bool = False, **kwargs) -> DiNAT_s:
    return _create("base", pretrained, kwargs)


@register_model
def dinat_s_large(pretrained: bool = False, **kwargs) -> DiNAT_s:
    return _create("large", pretrained, kwargs)
