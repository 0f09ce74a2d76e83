"""The kernels' index math, run on the CPU (needs nvcc, no GPU): the same header code compiled
for the host. csrc/tests/window_math_check.cu checks windows, inverse neighborhoods and the SIMT
kernels' incremental window cursor against direct formulas; csrc/tests/tiling_check.cu replays
the tensor-core kernels' warp walk (boxes, window unions, lines, chunks, masks, RPB indices)
and checks that every query keeps exactly its window and every key exactly its inverse;
csrc/tests/window_ops_check.cu runs the unfused window ops' per-element code (dot, sum,
inverse sum) against a brute-force scatter over random windows; csrc/tests/sm90_rows_check.cu
checks that the Hopper family's query boxes and their rows cover every token exactly once
(the output, and split-KV's box-local partial rows, are written through that mapping)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = os.environ.get("CUDACXX") or shutil.which("nvcc")


def _build_and_run(tmp_path, name):
    exe = tmp_path / name
    subprocess.run(
        [NVCC, "-std=c++17", "-O2", "-I", os.path.join(ROOT, "csrc", "include"), "-o", str(exe),
         os.path.join(ROOT, "csrc", "tests", f"{name}.cu")],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
def test_window_math_on_host(tmp_path):
    run = _build_and_run(tmp_path, "window_math_check")
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
def test_tensor_core_walk_on_host(tmp_path):
    run = _build_and_run(tmp_path, "tiling_check")
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
def test_unfused_window_ops_on_host(tmp_path):
    run = _build_and_run(tmp_path, "window_ops_check")
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
def test_hopper_query_boxes_cover_every_token_once_on_host(tmp_path):
    run = _build_and_run(tmp_path, "sm90_rows_check")
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr
