"""Build entry: pure-Python package plus, when CUDA archs are requested, libnattn via CMake.

``NATTN_CUDA_ARCH="8.0;9.0"`` selects the archs (default: the GPU present, or no CUDA
build at all on a machine without one). The CMake step is filled in by the kernel
library (csrc/); without it the package installs as pure Python and uses the
reference and flex backends.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["nattn", "nattn.*"]) + ["nattn.models"],
    package_dir={"nattn.models": "models"},
)
