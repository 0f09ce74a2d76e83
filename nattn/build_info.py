"""What this install's kernel library was built with (printed by ``python -m nattn``)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict

from ._cuda import library

CONFIG_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cuda", "build_config.json")


def build_config() -> Dict[str, Any]:
    """Archs, dtypes, head dims and NA dims compiled into libnattn, and where it is.

    ``library`` is None (and the lists empty) for a pure-Python install; ``error``
    says why the library is unusable when it is present but cannot be loaded.
    """
    config: Dict[str, Any] = {
        "library": library.library_path(), "archs": [], "toolkit": None, "families": [],
        "dtypes": [], "head_dims": [], "na_dims": [],
    }
    if os.path.isfile(CONFIG_FILE):
        with open(CONFIG_FILE) as f:
            recorded = json.load(f)
        config.update({k: recorded[k] for k in config if k in recorded and k != "library"})
    lib = library.load()
    if lib is None:
        config["error"] = library.load_error()
    else:  # the library's own table is the truth about what it can run
        config["families"] = sorted({f for f, _, _ in lib.kernels})
        config["dtypes"] = sorted({d for _, d, _ in lib.kernels})
        config["na_dims"] = sorted({n for _, _, n in lib.kernels})
        config["head_dims"] = sorted({h for hs in lib.kernels.values() for h in hs})
    return config
