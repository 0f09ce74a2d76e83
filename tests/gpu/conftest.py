"""The GPU tier's set-up: every test sees kernel output buffers that start as NaN
(gpu_cases.poison_kernel_buffers), so a kernel that leaves rows unwritten fails at once."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _nan_kernel_buffers(monkeypatch):
    from gpu_cases import poison_kernel_buffers
    poison_kernel_buffers(monkeypatch)
    yield
