import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

MAX_AUTO_WORKERS = 8  # the suite gains nothing past this; each worker holds torch and timm


def pytest_configure(config):
    """In an xdist worker, torch gets its share of the cores: with every worker's torch
    spinning one thread per core, a busy 2-core machine ran the tests several times slower.
    OMP_NUM_THREADS (when not set already) also reaches the subprocesses that tests start."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    threads = max(1, len(os.sched_getaffinity(0)) // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def _selects_gpu_tests(config) -> bool:
    expr = config.getoption("markexpr", "") or ""
    return "gpu" in expr.replace("not gpu", "")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """How many workers `-n auto` (pyproject's addopts) starts: one per core (xdist's count,
    which PYTEST_XDIST_AUTO_NUM_WORKERS overrides), at most MAX_AUTO_WORKERS; none for the GPU
    tier (-m gpu), whose tests share one device and run in one process."""
    if _selects_gpu_tests(config):
        return 0
    from xdist.plugin import pytest_xdist_auto_num_workers as xdist_count

    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return xdist_count(config)
    return max(1, min(xdist_count(config), MAX_AUTO_WORKERS))
