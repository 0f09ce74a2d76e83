"""Build entry: pure-Python package plus, when CUDA archs are requested, libnattn via CMake.

``NATTN_CUDA_ARCH="8.0;9.0"`` selects the archs (default: the GPU present, found with
nvidia-smi, when an nvcc is there; no CUDA build at all on a machine without one).
``NATTN_CUDA_ARCH=none`` forces a pure-Python install; build_backend/nattn_archs.py
decides. Other knobs: ``NATTN_N_WORKERS`` (parallel compile jobs),
``NATTN_DTYPES`` / ``NATTN_HEAD_DIMS`` / ``NATTN_NA_DIMS`` / ``NATTN_FAMILIES`` (developer subsets of the
kernel table), ``CUDACXX`` (which nvcc: e.g. CUDA 11.8 for sm_50). The torch-free
``libnattn.so`` and ``build_config.json`` land in ``nattn/_cuda/``.
"""

import os
import shutil
import subprocess
import sys
import time

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
# The build backend has this folder on sys.path already; `python setup.py ...` does not.
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
from nattn_archs import find_nvcc, request  # noqa: E402
from nattn_console import run_with_progress, say  # noqa: E402


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
        if not shutil.which("cmake"):  # only without build isolation, which installs it
            raise RuntimeError(
                f"building CUDA kernels for NATTN_CUDA_ARCH={ARCHS!r} needs cmake>=3.24 on PATH: "
                "pip install cmake ninja nvidia-cutlass, or drop --no-build-isolation, "
                "or set NATTN_CUDA_ARCH=none")
        args = [
            "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
            f"-DNATTN_CUDA_ARCH={ARCHS}", f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        for var in ("NATTN_DTYPES", "NATTN_HEAD_DIMS", "NATTN_NA_DIMS", "NATTN_FAMILIES"):
            args.append(f"-D{var}={os.environ.get(var, '')}")
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        # $CUDACXX, else PATH, CUDA_HOME, /usr/local/cuda (CMake alone may prefer /usr/bin/nvcc).
        nvcc = find_nvcc()
        if nvcc:
            args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        start = time.monotonic()
        sys.stdout.flush()  # keep setuptools' lines ahead of CMake's in the log
        subprocess.check_call(args)
        workers = os.environ.get("NATTN_N_WORKERS", str(os.cpu_count() or 1))
        # ninja/make progress lines go to pip -v; a terminal also gets one every 10%.
        run_with_progress(["cmake", "--build", build_dir, "--parallel", workers],
                          f"compiling libnattn for {ARCHS} with {workers} jobs")
        shutil.copyfile(os.path.join(build_dir, "libnattn.so"), target)
        # Editable installs copy only the extension itself back into the source tree, so
        # the record of what was built goes there too.
        source_config = os.path.join(ROOT, "nattn", "_cuda", "build_config.json")
        for path in {config_out, source_config}:
            shutil.copyfile(os.path.join(build_dir, "build_config.json"), path)
        minutes, seconds = divmod(int(time.monotonic() - start), 60)
        say(f"nattn: libnattn built for {ARCHS} in {minutes}m{seconds:02d}s; "
            "python -m nattn shows what it holds")


ARCHS = request().cmake_list

setup(
    packages=find_packages(include=["nattn", "nattn.*"]) + ["nattn.models"],
    package_dir={"nattn.models": "models"},
    package_data={"nattn._cuda": ["build_config.json"]},
    ext_modules=[CMakeExtension("nattn._cuda.libnattn")] if ARCHS else [],
    cmdclass={"build_ext": CMakeBuild},
)
