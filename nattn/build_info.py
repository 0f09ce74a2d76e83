"""What this install's kernel library was built with (printed by ``python -m nattn``)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

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


def describe(config: Dict[str, Any], gpu_arch: Optional[str] = None) -> List[str]:
    """The build configuration in words; ``gpu_arch`` ("9.0") is this machine's GPU, if any.

    Install-time notices are hidden by pip (it shows a build's output only with -v), so
    this is where a user learns that no kernels were built and how to build them.
    """
    if config["library"] is None:
        lines = ["compiled kernels: none (a pure-Python install: tiled, reference and flex backends)"]
        if gpu_arch:
            lines.append(f"warning: a GPU (sm_{gpu_arch.replace('.', '')}) is present but no CUDA "
                         f"kernels were built for it; build them with "
                         f"NATTN_CUDA_ARCH=\"{gpu_arch}\" pip install -v -e .")
        else:
            lines.append('  to build them (on any machine with nvcc): NATTN_CUDA_ARCH="9.0" '
                         "pip install -v -e .")
        return lines
    if "error" in config:
        return [f"compiled kernels: unusable: {config['error']}"]
    fields = ", ".join(f"{k.replace('_', ' ')} {'/'.join(map(str, config[k]))}"
                       for k in ("archs", "families", "dtypes", "head_dims", "na_dims"))
    return [f"compiled kernels: {config['library']} (CUDA {config['toolkit']}): {fields}"]
