"""csrc/tools/sass_diff.py, the no-GPU check that a refactor keeps the kernels' machine code:
its verdicts on made-up opcode lists, and (where nvcc and cuobjdump are installed, in a git
checkout) a real run of the work tree against HEAD on one small instance, whose kernels can
only differ by what the work tree changed in csrc/ since HEAD."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

_ROOT = os.path.join(os.path.dirname(__file__), "..")
_PATH = os.path.join(_ROOT, "csrc", "tools", "sass_diff.py")
_spec = importlib.util.spec_from_file_location("sass_diff", _PATH)
sass_diff = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_diff)


def test_verdicts():
    assert sass_diff.verdict(["IMAD", "HMMA.16816.F32"], ["IMAD", "HMMA.16816.F32"]) == "same"
    assert sass_diff.verdict(["IMAD", "MOV"], ["MOV", "IMAD"]) == "reordered"
    v = sass_diff.verdict(["IMAD", "MOV"], ["IMAD", "STL", "MOV"])
    assert v.startswith("changed") and "2 -> 3 instructions" in v and "local memory 0 -> 1" in v


def test_hopper_instances_are_built_for_sm_90a():
    # built for plain sm_90 the Hopper family's kernels are empty, and any change compared "same"
    assert sass_diff.arch_for("sm90_bfloat16_na2d_hd64_q16x8_k4x24") == "sm_90a"
    assert sass_diff.arch_for("tc_bfloat16_na2d_hd32") == "sm_90"


def _clean_csrc() -> bool:
    r = subprocess.run(["git", "-C", _ROOT, "status", "--porcelain", "csrc", "nattn/_cuda"],
                       capture_output=True, text=True)
    return r.returncode == 0 and not r.stdout.strip()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_work_tree_against_head_on_one_instance():
    from check_sm90_sass import candidates  # sass_diff put csrc/tools on the path

    if not candidates():
        pytest.skip("needs cuobjdump (nvidia-cuda-cuobjdump)")
    if not _clean_csrc():
        pytest.skip("csrc/ differs from HEAD: the kernels may differ")
    r = subprocess.run([sys.executable, _PATH, "--base", "HEAD", "--arch", "sm_80", "simt_float32_na1d_hd32"],
                       capture_output=True, text=True, timeout=600)
    if "no cuobjdump could read" in r.stdout + r.stderr:
        pytest.skip("cuobjdump needs nvdisasm beside it (nvidia-cuda-nvdisasm)")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if "simt_float32_na1d_hd32  " in line]
    assert rows and all(line.endswith(": same") for line in rows), r.stdout
    assert r.stdout.strip().endswith("0 kernel(s) changed against HEAD")
