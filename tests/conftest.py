"""Suite-wide set-up: tests/ on sys.path, one shared random seed per run, the pytest-xdist
settings behind pyproject's `-n auto` (worker count, torch threads per worker), and a check
that no test leaves a backend registered."""

import os
import random
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

SEED_VAR = "NATTN_TEST_SEED"
MAX_AUTO_WORKERS = 8  # the suite gains nothing past this; each worker holds torch and timm


def pytest_configure(config):
    """One random seed per run for the global RNGs, shared by the xdist workers (they inherit
    the environment): tests that draw random data at import time (parametrize values, and so
    their ids) then collect the same tests in every worker. Fresh on every run; set
    NATTN_TEST_SEED to replay one. Tests that seed for themselves are unaffected."""
    import torch

    seed = os.environ.setdefault(SEED_VAR, str(random.SystemRandom().randrange(2**31)))
    random.seed(int(seed))
    torch.manual_seed(int(seed))
    _share_the_cores(torch)


def pytest_report_header(config):
    return f"{SEED_VAR}={os.environ.get(SEED_VAR)} (global torch/random seed of this run)"


def _share_the_cores(torch):
    """In an xdist worker, torch gets its share of the cores: with every worker's torch
    spinning one thread per core, a busy 2-core machine ran the tests several times slower.
    OMP_NUM_THREADS (when not set already) also reaches the subprocesses that tests start."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _backend_registry_unchanged():
    """A test that registers a backend must take it out again (backend_registry.py's
    ``temporarily_registered``): left in the automatic order, it would run the later tests'
    automatic calls in the same worker, which then fail or pass by test order."""
    from backend_registry import registry_state

    before = registry_state()
    yield
    after = registry_state()
    assert after == before, f"the test left nattn's backend registry changed: {before} -> {after}"


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


@pytest.fixture(autouse=True)
def _fresh_call_cache():
    """NA calls remember their backend per signature (nattn/_call_cache.py, eager calls and
    the ops of compiled ones); tests that swap backends or heuristics with
    monkeypatch must not see a previous test's choice."""
    try:
        from nattn import _call_cache
    except ImportError:  # a test run without nattn importable
        yield
        return
    _call_cache.clear()
    yield
    _call_cache.clear()
