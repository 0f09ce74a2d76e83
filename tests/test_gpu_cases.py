"""The GPU tier's random sweeps draw from what the loaded library holds (tests/gpu/gpu_cases.py,
built_space): a developer build (one dtype, two head dims) gets cases it runs; a full build
the same cases as before; each run draws fresh data for them (data_seed). CPU only: a
stand-in library."""

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gpu"))
import fake_library  # noqa: E402
import gpu_cases  # noqa: E402


class DeveloperBuild(fake_library.FakeLibrary):
    """bfloat16 at head dims 32 and 64 (benchmarks/build_variants.sh's usual subset)."""

    def __init__(self):
        super().__init__()
        self.kernels = {(f, "bfloat16", nd): [32, 64] for f in ("simt", "tc") for nd in (1, 2, 3)}


def test_developer_build_draws_only_what_it_holds(monkeypatch):
    fake_library.install(monkeypatch, DeveloperBuild())
    assert gpu_cases.built_space() == ((torch.bfloat16,), (8, 16, 24, 32, 40, 64))
    cases = gpu_cases.sweep(200)
    assert {c.dtype for c in cases} == {torch.bfloat16}
    assert max(max(c.dim, c.dim_v) for c in cases) <= 64


def test_full_build_draws_the_whole_space(monkeypatch):
    fake_library.install(monkeypatch, fake_library.FakeLibrary())  # every dtype up to head dim 256
    assert gpu_cases.built_space() == (gpu_cases.DTYPES, gpu_cases.HEAD_DIMS)
    monkeypatch.setitem(fake_library.library._state, "lib", None)  # no library: the same draws
    without = gpu_cases.sweep(50)
    fake_library.install(monkeypatch, fake_library.FakeLibrary())
    assert [str(c) for c in gpu_cases.sweep(50)] == [str(c) for c in without]


def test_each_run_draws_fresh_data_for_the_same_cases(monkeypatch):
    """The sweeps' cases (shapes, ids) are fixed by their seeds; their data mix in the run's
    seed (NATTN_TEST_SEED), so two runs test different inputs and a run replays exactly."""
    monkeypatch.setitem(fake_library.library._state, "lib", None)
    case = dataclasses.replace(gpu_cases.sweep(1)[0], dtype=torch.float32, layout="plain")
    drawn = {}
    for run in (11, 12, 11):
        monkeypatch.setattr(gpu_cases, "RUN_SEED", run)
        t, _ = gpu_cases.make_inputs(case, device="cpu")
        if run in drawn:
            assert torch.equal(t["query"], drawn[run])
        drawn[run] = t["query"].detach().clone()
    assert not torch.equal(drawn[11], drawn[12])
    assert torch.isfinite(drawn[12]).all()
