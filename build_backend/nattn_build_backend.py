"""PEP 517 backend: setuptools.build_meta, plus the kernel toolchain only when kernels are built.

A pure-Python install (no GPU, or NATTN_CUDA_ARCH=none) needs setuptools alone; cmake,
ninja and nvidia-cutlass (CUTLASS/CuTe headers) join the build requirements only when
nattn_archs.request() names archs. Every hook not defined here is setuptools' own.
"""

from __future__ import annotations

from typing import List, Optional

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the hooks not wrapped below)

import nattn_archs
from nattn_console import say

KERNEL_TOOLCHAIN = ["cmake>=3.24", "ninja", "nvidia-cutlass>=4.2"]


def kernel_requirements(req: Optional[nattn_archs.ArchRequest] = None) -> List[str]:
    """What building the requested kernels needs on top of setuptools ([] for none)."""
    req = nattn_archs.request() if req is None else req
    return list(KERNEL_TOOLCHAIN) if req.archs else []


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + kernel_requirements()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + kernel_requirements()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    say(nattn_archs.notice(nattn_archs.request()))
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    say(nattn_archs.notice(nattn_archs.request()))
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
