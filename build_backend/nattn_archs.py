"""Which CUDA archs an install compiles: the one place that decides it.

Both the build backend (to add the kernel toolchain to the build requirements) and
setup.py (to run CMake) ask :func:`request`, so the two cannot disagree.

``NATTN_CUDA_ARCH="8.0;9.0"`` names the archs; ``none`` (or empty, or ``0``) asks for a
pure-Python install. Unset, the GPUs that nvidia-smi reports are built, provided an nvcc
is there to build them (a GPU without a CUDA toolkit gets a pure-Python install rather
than a failed one).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Mapping, NamedTuple, Optional, Tuple

ENV = "NATTN_CUDA_ARCH"
_OFF = ("", "none", "0")
_ARCH = re.compile(r"^[0-9]+\.[0-9]+$")  # the form CMakeLists.txt accepts


class ArchRequest(NamedTuple):
    archs: Tuple[str, ...]  # e.g. ("8.0", "9.0"); empty: no kernels, a pure-Python install
    why: str  # where the answer came from, for the install notice
    gpus: Tuple[str, ...] = ()  # archs of the GPUs found, to suggest what to build

    @property
    def cmake_list(self) -> str:
        return ";".join(self.archs)


def sm_names(archs: Tuple[str, ...]) -> str:
    """("8.0", "9.0") -> "sm_80, sm_90"."""
    return ", ".join("sm_" + a.replace(".", "") for a in archs)


def _arch_key(arch: str) -> Tuple[int, int]:
    major, minor = arch.split(".")
    return int(major), int(minor)


def parse_archs(value: str) -> Tuple[str, ...]:
    """``"8.0;9.0"`` (``;``, ``,`` or spaces between) -> ``("8.0", "9.0")``; ``none`` -> ``()``."""
    if value.strip().lower() in _OFF:
        return ()
    items = [a for a in re.split(r"[;,\s]+", value.strip()) if a]
    bad = [a for a in items if not _ARCH.match(a)]
    if bad:
        raise ValueError(
            f"{ENV}={value!r}: {', '.join(map(repr, bad))} is not an arch. Accepted: "
            f"compute capabilities as major.minor separated by ';' (e.g. {ENV}=\"8.0;9.0\"), "
            f"or {ENV}=none for a pure-Python install"
        )
    return tuple(sorted(set(items), key=_arch_key))


def gpu_archs() -> Tuple[str, ...]:
    """Compute capabilities of the GPUs nvidia-smi reports; () without a GPU or driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ()
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    # Old drivers answer with an error text instead of numbers: keep only the numbers.
    return tuple(sorted({c.strip() for c in out.splitlines() if _ARCH.match(c.strip())},
                        key=_arch_key))


def find_nvcc(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The nvcc a build would use: $CUDACXX, then PATH, then $CUDA_HOME and /usr/local/cuda."""
    env = os.environ if env is None else env
    if env.get("CUDACXX"):
        return env["CUDACXX"]
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def request(env: Optional[Mapping[str, str]] = None) -> ArchRequest:
    """The archs this install builds, and why (``env`` defaults to os.environ)."""
    env = os.environ if env is None else env
    if ENV in env:
        return ArchRequest(parse_archs(env[ENV]), f"{ENV}={env[ENV]}")
    found = gpu_archs()
    if not found:
        return ArchRequest((), f"{ENV} is unset and nvidia-smi found no GPU")
    if not find_nvcc(env):
        return ArchRequest((), f"GPU {sm_names(found)} found but no nvcc "
                               "(set CUDACXX or put the CUDA toolkit on PATH)", found)
    return ArchRequest(found, "the GPU nvidia-smi reports", found)


def notice(req: ArchRequest) -> str:
    """The one line an install prints about its kernels."""
    if req.archs:
        return (f"nattn: building CUDA kernels for {sm_names(req.archs)} ({req.why}); "
                "this takes minutes, pip install -v shows the progress")
    example = req.gpus[-1] if req.gpus else "9.0"
    return (f"nattn: no CUDA kernels built ({req.why}); reference and flex backends only. "
            f"To build them: {ENV}=\"{example}\" pip install ...")
