"""detectron2-format checkpoints (``.pkl``: Mask2Former / OneFormer backbones): a pickled
``{"model": {name: numpy array}, "__author__": ...}``. Read with an unpickler that rebuilds
numpy arrays and plain containers only, so a checkpoint cannot run code on load; the arrays
become tensors for the usual ``checkpoint_filter_fn`` (``backbone.`` prefixes, output norms).
"""

from __future__ import annotations

import pickle
from typing import Dict

import numpy as np
import torch

# The globals a pickled dict of numpy arrays needs (numpy 1.x and 2.x module names).
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("collections", "OrderedDict"),
}


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"the checkpoint pickles {module}.{name}; a detectron2 checkpoint holds numpy arrays "
            "only, and nothing else is unpickled (it could run code)")


def load_pickle_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of a detectron2 ``.pkl`` checkpoint (its ``"model"`` dict, or the top
    level), by name; non-array entries (metadata) are dropped."""
    with open(path, "rb") as f:
        obj = _ArraysOnlyUnpickler(f, encoding="latin1").load()
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a pickled dict (detectron2 format), got {type(obj).__name__}")
    weights = obj.get("model", obj)
    if not isinstance(weights, dict):
        raise ValueError(f"{path}: 'model' is a {type(weights).__name__}, not a dict of arrays")
    out = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items() if isinstance(v, np.ndarray)}
    if not out:
        raise ValueError(f"{path}: no numpy arrays found (not a detectron2 checkpoint?)")
    return out
