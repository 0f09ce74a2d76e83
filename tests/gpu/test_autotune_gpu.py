"""GPU tier: measured dispatch over the cuda backend's kernel configurations on a 9.0 GPU.
Every Hopper tile pair a problem lists runs when named (``"cuda:<pair>"``) and matches the
reference; the tuner's choice for a forward and for a training call (with the dQ modes) runs
and matches; under deterministic algorithms the KV-parallel dQ is never chosen."""

import pytest
import torch

import nattn
from nattn.backends import BACKENDS, autotune, choose_na_backend
from nattn.params import normalize

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)

PROBLEMS = [((40, 48), (13, 13), 64), ((6, 20, 24), (3, 7, 7), 32), ((700,), (129,), 128)]
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def inputs(spatial, dim, grad=False):
    torch.manual_seed(0)
    return [torch.randn(2, *spatial, 4, dim, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
            for _ in range(3)]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("spatial,kernel,dim", PROBLEMS, ids=["2d", "3d", "1d"])
def test_every_listed_tile_pair_runs_when_named(spatial, kernel, dim):
    q, k, v = inputs(spatial, dim)
    fn = FUNCS[len(spatial)]
    ref = fn(q, k, v, kernel, backend="reference")
    configs = BACKENDS["cuda"].configurations(q, k, v, None, normalize(q, k, v, len(spatial), kernel))
    assert configs, "a Hopper problem lists its other tile pairs"
    for name in configs:
        assert rel(fn(q, k, v, kernel, backend=f"cuda:{name}"), ref) < 1.2e-2, name


@pytest.mark.parametrize("spatial,kernel,dim", PROBLEMS, ids=["2d", "3d", "1d"])
def test_tuned_forward_and_training_calls_match_the_reference(spatial, kernel, dim, tmp_path, monkeypatch):
    monkeypatch.setenv("NATTN_AUTOTUNE_QUIET", "1")
    autotune.enable(False, cache_path=str(tmp_path / "tune.json"))
    try:
        fn = FUNCS[len(spatial)]
        q, k, v = inputs(spatial, dim, grad=True)
        with torch.no_grad():
            out = fn(q, k, v, kernel, tune=True)
            ref = fn(q, k, v, kernel, backend="reference")
        assert rel(out, ref) < 1.2e-2
        out = fn(q, k, v, kernel, tune=True)  # a training call: its own signature, dQ modes timed
        grad = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
        rq, rk, rv = torch.autograd.grad(fn(q, k, v, kernel, backend="reference"), (q, k, v), grad)
        for got, want in ((dq, rq), (dk, rk), (dv, rv)):
            assert rel(got, want) < 2e-2
        chosen = [e["backend"] for e in autotune.results().values()]
        assert len(chosen) == 2 and all(isinstance(c, str) for c in chosen)
        params = normalize(q, k, v, len(spatial), kernel)
        torch.use_deterministic_algorithms(True)
        try:
            autotune.clear()
            name = choose_na_backend(q, k, v, None, params, tune=True)
            assert "dq=atomic" not in name
        finally:
            torch.use_deterministic_algorithms(False)
    finally:
        autotune.enable(False, cache_path="")
        autotune._state["path"] = None
        autotune._state["results"] = None
