"""Model creation for the NAT-family models: timm's ``build_model_with_cfg`` with clear errors
when pretrained weights are missing or unreadable, and detectron2 ``.pkl`` checkpoints."""

from __future__ import annotations

import functools
import os
import pickle
import tempfile
from typing import Callable

import torch
from timm.models import build_model_with_cfg, get_pretrained_cfg
from torch import nn

from ._checkpoints import CheckpointMismatchError


class PretrainedWeightsError(RuntimeError):
    """pretrained=True but no weights could be found or fetched."""


def create(model_cls, variant: str, pretrained: bool, filter_fn: Callable, default_out_indices,
           **kwargs) -> nn.Module:
    """``build_model_with_cfg`` with a clear error when pretrained weights are unreachable."""
    overlay = kwargs.get("pretrained_cfg_overlay") or {}
    cfg = kwargs.get("pretrained_cfg") or get_pretrained_cfg(variant)
    cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg or {})
    cfg.update(overlay)
    source = cfg.get("file") or cfg.get("url") or cfg.get("hf_hub_id")
    if pretrained and not source:
        raise PretrainedWeightsError(
            f"{variant}: no pretrained weights are published for this model; create it with "
            f"pretrained=False, or pass pretrained_cfg_overlay=dict(file='/path/to/weights.pth')"
        )
    feature_cfg = dict(feature_cls="getter", out_indices=kwargs.pop("out_indices", default_out_indices))
    # features_only: no final norm/classifier wanted, so no warning when a checkpoint lacks them;
    # pretrained_strict=False: a mismatch warns and what fits loads (timm then loads non-strictly)
    filter_fn = functools.partial(filter_fn, features_only=bool(kwargs.get("features_only")),
                                  strict=kwargs.get("pretrained_strict", True))
    converted = None
    try:
        if pretrained and str(cfg.get("file") or "").endswith(".pkl"):
            # detectron2 format: numpy arrays in a pickle; handed to timm as a .pth of tensors
            converted = _pkl_as_pth(cfg["file"])
            kwargs["pretrained_cfg_overlay"] = {**overlay, "file": converted}
        return build_model_with_cfg(
            model_cls, variant, pretrained, pretrained_filter_fn=filter_fn,
            feature_cfg=feature_cfg, **kwargs,
        )
    except CheckpointMismatchError as e:
        raise CheckpointMismatchError(f"{variant}: weights from {source!r}: {e}") from e
    except Exception as e:  # noqa: BLE001  (a corrupt file can fail torch.load in any way)
        if not pretrained or isinstance(e, PretrainedWeightsError):
            raise
        if not cfg.get("file") and not isinstance(
                e, (OSError, ConnectionError, ValueError, RuntimeError, pickle.UnpicklingError)):
            raise  # not a download or read failure
        if cfg.get("file"):  # the user's own file: suggesting a file would not help
            raise PretrainedWeightsError(
                f"{variant}: pretrained=True but the file {cfg['file']!r} (pretrained_cfg_overlay's "
                f"'file') could not be loaded ({type(e).__name__}: {e})"
            ) from e
        raise PretrainedWeightsError(
            f"{variant}: pretrained=True but the weights could not be loaded from {source!r} "
            f"({type(e).__name__}: {e}). If you have the original SHI-Labs checkpoint, pass "
            f"pretrained_cfg_overlay=dict(file='/path/to/checkpoint.pth')"
        ) from e
    finally:
        if converted:
            os.unlink(converted)


def _pkl_as_pth(path: str) -> str:
    """A temporary .pth with the tensors of detectron2 checkpoint ``path`` (the caller deletes it)."""
    from ._pickle_checkpoint import load_pickle_checkpoint
    state_dict = load_pickle_checkpoint(path)
    fd, tmp = tempfile.mkstemp(suffix=".pth")
    os.close(fd)
    torch.save(state_dict, tmp)
    return tmp
