"""The SIMT kernels' index math, run on the CPU: csrc/tests/window_math_check.cu compiles
the same header code for the host and checks windows, inverse neighborhoods and the
incremental window cursor against direct formulas (needs nvcc, no GPU)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = os.environ.get("CUDACXX") or shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
def test_window_math_on_host(tmp_path):
    exe = tmp_path / "window_math_check"
    subprocess.run(
        [NVCC, "-std=c++17", "-I", os.path.join(ROOT, "csrc", "include"), "-o", str(exe),
         os.path.join(ROOT, "csrc", "tests", "window_math_check.cu")],
        check=True, capture_output=True, text=True, timeout=300,
    )
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr
