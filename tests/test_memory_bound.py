"""The reference path never builds an N x N tensor: a 128x128 map runs fwd+bwd on the CPU."""

import os
import subprocess
import sys


def test_128x128_kernel13_forward_backward_memory():
    n = 128 * 128
    probe = os.path.join(os.path.dirname(__file__), "memory_probe.py")
    result = subprocess.run(
        [sys.executable, probe, "128", "128", "4", "32", "13"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    growth = int(result.stdout.strip().splitlines()[-1])
    # One float32 N x N matrix is 1 GiB here; the whole fwd+bwd (inputs' grads included)
    # must stay under an eighth of it.
    assert growth < n * n * 4 / 8, f"peak RSS grew by {growth / 2**20:.0f} MiB"
