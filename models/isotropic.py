"""Isotropic NAT/DiNAT (arXiv:2209.15001): ViT-like, 16x16 patches and one resolution
throughout; every other block of DiNAT-iso is dilated (dilation 2 covers 14x14)."""

from __future__ import annotations

from typing import Optional

from timm.models import generate_default_cfgs, register_model
from torch import nn

from ._checkpoints import check_state_dict, strip_backbone_prefix, unwrap_state_dict
from ._common import ChannelsLastBackbone, LayerNorm, NABlock, drop_path_rates
from ._create import create
from .dinat_s import PatchEmbed
from .nat import _cfg

__all__ = ["NATIsotropic", "checkpoint_filter_fn"]


class NATIsotropic(ChannelsLastBackbone):
    """Isotropic NA transformer: patch embedding, ``depth`` NA blocks, norm, pool, head."""

    _seq = "blocks"

    def __init__(
        self, in_chans: int = 3, num_classes: int = 1000, global_pool: str = "avg", patch_size: int = 16,
        embed_dim: int = 384, depth: int = 12, num_heads: int = 12, kernel_size: int = 7, dilation: int = 1,
        mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: Optional[float] = None,
        drop_rate: float = 0.0, proj_drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1, norm_layer=LayerNorm, backend: Optional[str] = None,
        fp32_block_norms: bool = False,
    ):
        super().__init__()
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = embed_dim
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, norm_layer)
        dpr = drop_path_rates([depth], drop_path_rate)[0]
        self.blocks = nn.Sequential(*[
            NABlock(embed_dim, num_heads, kernel_size, dilation=1 if i % 2 == 0 else dilation,
                    mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, proj_drop=proj_drop_rate,
                    attn_drop=attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer, backend=backend, fp32_block_norms=fp32_block_norms)
            for i in range(depth)
        ])
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}") for i in range(depth)]
        self._add_head(norm_layer, drop_rate)


def checkpoint_filter_fn(state_dict, model, features_only: bool = False, strict: bool = True):
    """Load original isotropic checkpoints (blocks under ``layers.{i}``) or our own."""
    state_dict, backbone_checkpoint = strip_backbone_prefix(unwrap_state_dict(state_dict))
    out = {}
    for key, value in state_dict.items():
        if key.startswith("layers."):
            key = "blocks." + key[len("layers."):]
        out[key] = value
    return check_state_dict(out, model, backbone_checkpoint, features_only=features_only, strict=strict)


_URL = "https://shi-labs.com/projects/dinat/checkpoints/isotropic/{}_in1k_224.pth"
default_cfgs = generate_default_cfgs({
    f"{name}.in1k": _cfg(_URL.format(name), first_conv="patch_embed.proj", pool_size=(14, 14))
    for name in ("nat_isotropic_small", "dinat_isotropic_small", "nat_isotropic_base", "dinat_isotropic_base")
})

# (embed_dim, heads, drop_path_rate); depth 12, mlp_ratio 4, kernel 7, patch 16.
_CONFIGS = {"small": (384, 12, 0.1), "base": (768, 24, 0.4)}


def _create(size: str, dilation: int, pretrained: bool, kwargs):
    dim, heads, dpr = _CONFIGS[size]
    args = dict(embed_dim=dim, depth=12, num_heads=heads, drop_path_rate=dpr, kernel_size=7, dilation=dilation)
    args.update(kwargs)
    variant = f"{'dinat' if dilation > 1 else 'nat'}_isotropic_{size}"
    return create(NATIsotropic, variant, pretrained, checkpoint_filter_fn, 3, **args)


@register_model
def nat_isotropic_small(pretrained: bool = False, **kwargs) -> NATIsotropic:
    return _create("small", 1, pretrained, kwargs)


@register_model
def nat_isotropic_base(pretrained: bool = False, **kwargs) -> NATIsotropic:
    return _create("base", 1, pretrained, kwargs)


@register_model
def dinat_isotropic_small(pretrained: bool = False, **kwargs) -> NATIsotropic:
    return _create("small", 2, pretrained, kwargs)


@register_model
def dinat_isotropic_base(pretrained: bool = False, **kwargs) -> NATIsotropic:
    return _create("base", 2, pretrained, kwargs)
