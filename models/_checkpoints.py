"""Checkpoint helpers of the NAT-family models: wrappers and prefixes of saved state dicts,
Hugging Face key names, the strict key / shape check, RPB table resizing and stage renaming."""

from __future__ import annotations

import re
import warnings
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def unwrap_state_dict(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Accept ``{'model': sd}``/``{'state_dict': sd}`` wrappers and DDP ``module.`` prefixes."""
    for key in ("model", "state_dict", "model_ema"):
        if key in state_dict and isinstance(state_dict[key], dict):
            state_dict = state_dict[key]
            break
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state_dict.items()}


class CheckpointMismatchError(RuntimeError):
    """A checkpoint's keys or shapes do not fit the model (after ``checkpoint_filter_fn``'s
    renaming): the message lists every missing, unexpected and mis-shaped key."""


_ORIGINAL_OUT_NORM = re.compile(r"^norm(\d+)\.(.*)$")


def strip_backbone_prefix(state_dict: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], bool]:
    """Detection/segmentation checkpoints (mmdet/mmseg) hold the backbone under ``backbone.``
    next to ``neck.``/``*_head.`` keys: keep only the backbone, unprefixed. Returns
    ``(state_dict, was_backbone_checkpoint)``."""
    if not any(k.startswith("backbone.") for k in state_dict):
        return state_dict, False
    return {k[len("backbone."):]: v for k, v in state_dict.items() if k.startswith("backbone.")}, True


_HF_BLOCK = re.compile(r"^encoder\.levels\.(\d+)\.layers\.(\d+)\.(.*)$")
_HF_BLOCK_NAMES = (
    ("layernorm_before.", "norm1."), ("attention.self.rpb", "attn.rpb"),
    ("attention.output.dense.", "attn.proj."), ("layernorm_after.", "norm2."),
    ("intermediate.dense.", "mlp.fc1."), ("output.dense.", "mlp.fc2."),
)
_HF_OTHER_NAMES = (
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^embeddings\.norm\.", "patch_embed.norm."),
    (r"^encoder\.levels\.(\d+)\.downsample\.", r"levels.\1.downsample."),
    (r"^layernorm\.", "norm."), (r"^classifier\.", "head."),
    (r"^hidden_states_norms\.stage(\d+)\.", lambda m: f"norm{int(m.group(1)) - 1}."),
)


def is_hf_checkpoint(state_dict: Dict[str, torch.Tensor]) -> bool:
    """A Hugging Face transformers ``Nat*``/``Dinat*`` state dict (``shi-labs/*`` on the Hub)."""
    return any(re.search(r"(^|\.)encoder\.levels\.\d+\.layers\.\d+\.", k) for k in state_dict)


def hf_to_original(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """transformers' NAT/DiNAT names -> the SHI-Labs originals' (``levels.{i}.blocks.{j}``).

    ``nat.``/``dinat.`` prefixes (the classifiers) go; separate ``query``/``key``/``value``
    become one ``qkv`` (rows in that order, natten's layout); ``layer_scale_parameters``
    ``[2, C]`` become ``gamma1``/``gamma2``; ``hidden_states_norms.stage{n}`` (``*Backbone``)
    become the detection backbones' ``norm{n-1}``. Unknown keys pass through unchanged, for
    :func:`check_state_dict` to report.
    """
    out, qkv = {}, {}
    for key, value in state_dict.items():
        key = re.sub(r"^(dinat|nat)\.", "", key)
        m = _HF_BLOCK.match(key)
        if m:
            prefix, rest = f"levels.{m.group(1)}.blocks.{m.group(2)}.", m.group(3)
            qm = re.match(r"^attention\.self\.(query|key|value)\.(weight|bias)$", rest)
            if qm:
                qkv.setdefault((prefix, qm.group(2)), {})[qm.group(1)] = value
                continue
            if rest == "layer_scale_parameters":
                out[prefix + "gamma1"], out[prefix + "gamma2"] = value[0], value[1]
                continue
            for old, new in _HF_BLOCK_NAMES:
                if rest.startswith(old):
                    rest = new + rest[len(old):]
                    break
            out[prefix + rest] = value
            continue
        for pattern, repl in _HF_OTHER_NAMES:
            key, n = re.subn(pattern, repl, key)
            if n:
                break
        out[key] = value
    for (prefix, kind), parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            raise CheckpointMismatchError(
                f"Hugging Face checkpoint: {prefix}attn.qkv.{kind} needs query, key and value, "
                f"got only {sorted(parts)}")
        out[f"{prefix}attn.qkv.{kind}"] = torch.cat([parts["query"], parts["key"], parts["value"]])
    return out


def _short(keys: List[str], limit: int = 20) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def check_state_dict(out: Dict[str, torch.Tensor], model: nn.Module, backbone_checkpoint: bool,
                     classifier: str = "head", features_only: bool = False,
                     strict: bool = True) -> Dict[str, torch.Tensor]:
    """Make a renamed checkpoint fit ``model`` or raise :class:`CheckpointMismatchError`.

    Tolerated, and taken from the model's own initialisation: the per-output norms
    (``feature_norms.*``) when the checkpoint has none (classification checkpoints), and the
    final ``norm``/classifier when the checkpoint is a detection/segmentation backbone (it
    has neither; a warning says so unless the model has no classifier or is built for
    ``features_only``, which drops both). The original
    backbones' ``norm{i}`` go to ``feature_norms.{i}``, or are dropped when the model was
    built without ``feature_norms``. Classifier shapes are left to timm (``num_classes``).
    Anything else that differs is an error that names the keys; with ``strict=False``
    (``pretrained_strict=False`` to ``timm.create_model``) a warning with the same list,
    and the unexpected and mis-shaped keys are left out so that the rest loads.
    """
    own = model.state_dict()
    has_feature_norms = any(k.startswith("feature_norms.") for k in own)
    renamed = {}
    for key, value in out.items():
        m = _ORIGINAL_OUT_NORM.match(key)
        if m:
            if not has_feature_norms:
                continue  # only used for the backbone's outputs; not requested
            key = f"feature_norms.{m.group(1)}.{m.group(2)}"
        renamed[key] = value
    out = renamed
    fill = []
    if not any(k.startswith("feature_norms.") for k in out):
        fill += [k for k in own if k.startswith("feature_norms.")]
    if backbone_checkpoint:
        extra = [k for k in own if k not in out and (k.startswith("norm.") or k.startswith(classifier + "."))]
        if (any(k.startswith(classifier + ".") for k in extra) and getattr(model, "num_classes", 0) > 0
                and not features_only):
            warnings.warn(
                f"{type(model).__name__}: a detection/segmentation backbone checkpoint has no final "
                f"norm or classifier; {_short(extra)} keep their initial values", UserWarning, stacklevel=3)
        fill += extra
    for key in fill:
        out[key] = own[key].detach().clone()
    missing = [k for k in own if k not in out]
    unexpected = [k for k in out if k not in own]
    shapes = [f"{k} {tuple(out[k].shape)} (model: {tuple(own[k].shape)})" for k in out
              if k in own and not k.startswith(classifier + ".") and out[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = [f"{len(missing)} missing: {_short(missing)}" if missing else "",
                 f"{len(unexpected)} unexpected: {_short(unexpected)}" if unexpected else "",
                 f"{len(shapes)} of another shape: {_short(shapes)}" if shapes else ""]
        matched = len(own) - len(missing)
        msg = (f"{type(model).__name__}: the checkpoint does not fit the model ({matched} of {len(own)} "
               f"keys matched after renaming); " + "; ".join(p for p in parts if p))
        if strict:
            raise CheckpointMismatchError(msg + "; pretrained_strict=False loads the keys that fit")
        warnings.warn(msg + "; the missing ones keep their initial values", UserWarning, stacklevel=3)
        bad = set(unexpected) | {s.split(" ", 1)[0] for s in shapes}
        out = {k: v for k, v in out.items() if k not in bad}
    return out


def resize_rpb(table: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """Interpolate an RPB table ``[H, 2k-1, ...]`` to another kernel size (Swin's recipe)."""
    if tuple(table.shape) == tuple(shape):
        return table
    if table.shape[0] != shape[0] or table.dim() != len(shape) or table.dim() not in (2, 3, 4):
        raise ValueError(f"cannot resize an rpb table of shape {tuple(table.shape)} to {tuple(shape)}")
    mode = {2: "linear", 3: "bicubic", 4: "trilinear"}[table.dim()]
    out = F.interpolate(table[None].float(), size=tuple(shape[1:]), mode=mode, align_corners=False)
    return out[0].to(table.dtype)


def rename_stages(state_dict, old: str, model: nn.Module, extra_renames=(),
                  features_only: bool = False, strict: bool = True) -> Dict[str, torch.Tensor]:
    """Map an original SHI-Labs state dict onto our layout.

    The originals end each level with the downsampler of the next one
    (``{old}.{i}.downsample``); here a stage starts with its own downsampler, so that
    stage outputs are the features at each resolution: ``stages.{i+1}.downsample``.
    RPB tables are ``[H, 2k-1, 2k-1]`` in both and pass through (resized when the
    kernel size differs). Detection/segmentation checkpoints lose their ``backbone.``
    prefix (and their neck/heads); then :func:`check_state_dict` raises
    :class:`CheckpointMismatchError` unless the result fits the model.
    """
    state_dict, backbone_checkpoint = strip_backbone_prefix(unwrap_state_dict(state_dict))
    if old == "levels" and is_hf_checkpoint(state_dict):  # transformers has NAT/DiNAT only
        state_dict = hf_to_original(state_dict)
        backbone_checkpoint = backbone_checkpoint or "norm.weight" not in state_dict  # *Backbone
    own = model.state_dict()
    out = {}
    for key, value in state_dict.items():
        m = re.match(rf"^{old}\.(\d+)\.downsample\.(.*)$", key)
        if m:
            key = f"stages.{int(m.group(1)) + 1}.downsample.{m.group(2)}"
        else:
            key = re.sub(rf"^{old}\.(\d+)\.blocks\.", r"stages.\1.blocks.", key)
        for pattern, repl in extra_renames:
            key = re.sub(pattern, repl, key)
        if key.endswith("attn.rpb") and key in own and value.shape[0] == own[key].shape[0]:
            value = resize_rpb(value, tuple(own[key].shape))  # another head count: reported below
        out[key] = value
    return check_state_dict(out, model, backbone_checkpoint, features_only=features_only, strict=strict)
