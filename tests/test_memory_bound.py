"""The plain-PyTorch backends never build an N x N tensor: a 128x128 map runs fwd+bwd on the CPU."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("backend", ["reference", "tiled"])
def test_128x128_kernel13_forward_backward_memory(backend):
    n = 128 * 128
    probe = os.path.join(os.path.dirname(__file__), "memory_probe.py")
    result = subprocess.run(
        [sys.executable, probe, "128", "128", "4", "32", "13", backend],
        capture_output=True, text=True, timeout=600,
        # glibc's mmap threshold fixed: large blocks always mapped and unmapped, so the peak RSS
        # is what the code held, not how much freed memory the heap happened to keep
        env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072"),
    )
    assert result.returncode == 0, result.stderr
    growth = int(result.stdout.strip().splitlines()[-1])
    # One float32 N x N matrix is 1 GiB here; the whole fwd+bwd (inputs' grads included)
    # must stay under an eighth of it.
    assert growth < n * n * 4 / 8, f"peak RSS grew by {growth / 2**20:.0f} MiB"
