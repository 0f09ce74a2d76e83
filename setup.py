"""Build entry: pure-Python package plus, when CUDA archs are requested, libnattn via CMake.

``NATTN_CUDA_ARCH="8.0;9.0"`` selects the archs (default: the GPU present, found with
nvidia-smi; no CUDA build at all on a machine without one). ``NATTN_CUDA_ARCH=none``
forces a pure-Python install. Other knobs: ``NATTN_N_WORKERS`` (parallel compile jobs),
``NATTN_DTYPES`` / ``NATTN_HEAD_DIMS`` / ``NATTN_NA_DIMS`` (developer subsets of the
kernel table), ``CUDACXX`` (which nvcc: e.g. CUDA 11.8 for sm_50). The torch-free
``libnattn.so`` and ``build_config.json`` land in ``nattn/_cuda/``.
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def requested_archs() -> str:
    """The archs to build, or "" for a pure-Python install."""
    archs = os.environ.get("NATTN_CUDA_ARCH")
    if archs is not None:
        return "" if archs.strip().lower() in ("", "none", "0") else archs.strip()
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ""
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    caps = sorted({line.strip() for line in out.splitlines() if line.strip()})
    return ";".join(caps)


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds libnattn with CMake and puts it inside the package."""

    def get_ext_filename(self, fullname):
        # A torch- and Python-independent name: nattn/_cuda/libnattn.so
        return os.path.join(*fullname.split(".")[:-1], "libnattn.so")

    def build_extension(self, ext):
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        build_dir = os.path.join(ROOT, "build", "cmake")
        os.makedirs(build_dir, exist_ok=True)
        config_out = os.path.join(os.path.dirname(target), "build_config.json")
        args = [
            "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
            f"-DNATTN_CUDA_ARCH={ARCHS}", f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        for var in ("NATTN_DTYPES", "NATTN_HEAD_DIMS", "NATTN_NA_DIMS"):
            args.append(f"-D{var}={os.environ.get(var, '')}")
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        # The nvcc on PATH unless CUDACXX names one (CMake alone may prefer /usr/bin/nvcc).
        nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
        if nvcc:
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        subprocess.check_call(args)
        workers = os.environ.get("NATTN_N_WORKERS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", build_dir, "--parallel", workers])
        shutil.copyfile(os.path.join(build_dir, "libnattn.so"), target)
        # Editable installs copy only the extension itself back into the source tree, so
        # the record of what was built goes there too.
        source_config = os.path.join(ROOT, "nattn", "_cuda", "build_config.json")
        for path in {config_out, source_config}:
            shutil.copyfile(os.path.join(build_dir, "build_config.json"), path)


ARCHS = requested_archs()

setup(
    packages=find_packages(include=["nattn", "nattn.*"]) + ["nattn.models"],
    package_dir={"nattn.models": "models"},
    package_data={"nattn._cuda": ["build_config.json"]},
    ext_modules=[CMakeExtension("nattn._cuda.libnattn")] if ARCHS else [],
    cmdclass={"build_ext": CMakeBuild},
)
