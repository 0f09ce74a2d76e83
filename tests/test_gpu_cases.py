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


def test_poisoned_kernel_buffers_reach_the_cuda_backend(monkeypatch):
    """The GPU tier's NaN-filled buffers (tests/gpu/conftest.py) are the ones the cuda backend
    hands to libnattn: with a stand-in library that writes nothing, every output, gradient
    and workspace the backend allocated reads NaN, and libnattn is asked to poison its own."""
    from nattn import _buffers
    from nattn.params import NAParams
    fake_library.install_on_gpu(monkeypatch, fake_library.FakeLibrary())
    gpu_cases.poison_kernel_buffers(monkeypatch)
    q, k, v = (torch.randn(1, 6, 7, 2, 16) for _ in range(3))
    params = NAParams((3, 3), (1, 1), (1, 1), (False, False), 0.25)
    cuda = fake_library.CUDA
    out, lse = cuda.na_forward(q, k, v, None, params)
    assert out.isnan().all() and lse.isnan().all()
    dq, dk, dv, _ = cuda.na_backward(q, k, v, None, torch.randn_like(out), torch.randn_like(lse),
                                     torch.randn_like(out), None, params)
    assert dq.isnan().all() and dk.isnan().all() and dv.isnan().all()
    assert os.environ[gpu_cases.POISON_ENV] == "1"
    assert _buffers.empty(3, dtype=torch.int32).dtype == torch.int32  # integers are left as they come
    monkeypatch.undo()
    assert _buffers.empty is torch.empty and _buffers.empty_like is torch.empty_like
    assert gpu_cases.POISON_ENV not in os.environ


def test_library_buffers_come_from_the_poisoned_allocator():
    """The modules that hand uninitialized buffers to libnattn take them from nattn/_buffers.py
    (the GPU tier fills those with NaN): a plain torch.empty / empty_like / new_empty there
    would escape the tier's check for rows a kernel leaves unwritten. Meta tensors (shapes
    only, never written) are the one exception."""
    import inspect
    import re

    import nattn._eager
    import nattn.backends.cuda
    import nattn.nn.fast_norm
    import nattn.qk_av_kernels
    plain = re.compile(r"(torch\.empty(_like)?|\.new_empty)\([^\n]*")
    for module in (nattn.backends.cuda, nattn.qk_av_kernels, nattn.nn.fast_norm, nattn._eager):
        for found in plain.finditer(inspect.getsource(module)):
            assert 'device="meta"' in found.group(0), f"{module.__name__}: {found.group(0)}"
