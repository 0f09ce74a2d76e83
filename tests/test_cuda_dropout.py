"""CPU tests of attention dropout on the cuda backend's Python side: the problem struct's
dropout fields (ABI 3), the rng pointer each call packs, which problems the backend takes
with dropout (libnattn's tensor-core family: fp16/bf16, head dims <= 128, SM80+) and why it
declines the others, libraries without dropout, and the modules' choice of the fused path.

No GPU is needed: problems are fake CUDA tensors (FakeTensorMode) and a stand-in for the
loaded library answers the capability checks (tests/test_cuda_backend.py does the same);
libnattn's own checks of the fields are in tests/test_cuda_abi.py.
"""

import importlib
import struct

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import nattn
from nattn import _call_cache, dropout
from nattn._cuda import kernel_table, library
from nattn.backends import AUTO_ORDER, BACKENDS, NoBackendError, choose_na_backend, na_reasons
from nattn.backends import cuda as cuda_backend
from nattn.backends.base import DROPOUT_REASON
from nattn.backends.reference import ReferenceBackend
from nattn.nn import NeighborhoodAttention2D
from nattn.params import normalize

import fake_library

CUDA = BACKENDS["cuda"]
F = kernel_table.FIELD_OFFSETS
MODULE = importlib.import_module("nattn.nn.neighborhood_attention")


def FakeLibrary(dropout=True):
    """The loaded library as the backend sees it: SIMT for everything, the tensor-core family
    for 16-bit inputs up to head dim 128, and (``dropout=True``) attention dropout there."""
    return fake_library.FakeLibrary(tc=True, dropout={"tc"} if dropout else None)


def _install(monkeypatch, lib, capability=(8, 0)):
    fake_library.install_on_gpu(monkeypatch, lib, capability)
    _call_cache.clear()


@pytest.fixture
def dropout_lib(monkeypatch):
    lib = FakeLibrary()
    _install(monkeypatch, lib)
    yield lib
    _call_cache.clear()


@pytest.fixture
def old_lib(monkeypatch):
    """A library from before ABI 3's dropout (no nattn_dropout_families)."""
    _install(monkeypatch, FakeLibrary(dropout=False))
    yield
    _call_cache.clear()


def fake(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="cuda", dtype=dtype)


# ------------------------------------------------------------------ the problem struct
def test_abi_3_appends_the_dropout_fields():
    names = [name for name, _ in kernel_table.PROBLEM_FIELDS]
    assert kernel_table.ABI_VERSION >= 3
    assert names[-5:-2] == ["dropout_threshold", "dropout_p_bits", "rng_ptr"]  # then ABI 4's allow_tf32, 5's query_range
    assert F["rng_ptr"] == kernel_table.ABI_PROBLEM_FIELDS[3] - 1
    assert kernel_table.DROPOUT_FAMILIES == ("tc", "simt")
    header = kernel_table.problem_header()
    assert f"#define NATTN_ABI_VERSION {kernel_table.ABI_VERSION}" in header
    for name in names[-5:-2]:
        assert f"  int64_t {name};" in header


@pytest.mark.parametrize("p", [0.0, 1e-12, 2.0**-33, 0.1, 0.25, 0.5, 0.9, 0.999999])
def test_dropout_fields_follow_the_threshold_rule(p):
    threshold, bits = cuda_backend.dropout_fields(p)
    if p == 0:
        assert (threshold, bits) == (0, 0)
        return
    assert threshold == dropout.drop_threshold(p) == min(int(p * 2**32), 2**32 - 1)
    assert struct.unpack("<d", struct.pack("<q", bits))[0] == p  # libnattn reads p back exactly
    assert bits != 0


def test_template_and_pack_carry_dropout_and_the_rng_pointer():
    q = torch.randn(2, 9, 3, 16)
    out, lse = torch.empty_like(q), torch.empty(2, 9, 3)
    rng = dropout.draw_rng("cpu")
    params = normalize(q, q, q, 1, 3, dropout_p=0.3)
    fields, _ = CUDA._pack(params, q, q, q, out, lse, None, rng=rng)
    assert fields[F["dropout_threshold"]] == dropout.drop_threshold(0.3)
    assert struct.unpack("<d", struct.pack("<q", fields[F["dropout_p_bits"]]))[0] == 0.3
    assert fields[F["rng_ptr"]] == rng.data_ptr()
    rng2 = dropout.draw_rng("cpu")  # the cached template never keeps a call's pointer
    assert CUDA._pack(params, q, q, q, out, lse, None, rng=rng2)[0][F["rng_ptr"]] == rng2.data_ptr()
    plain, _ = CUDA._pack(normalize(q, q, q, 1, 3), q, q, q, out, lse, None)
    assert [plain[F[n]] for n in ("dropout_threshold", "dropout_p_bits", "rng_ptr")] == [0, 0, 0]
    with pytest.raises(ValueError, match="needs the call's rng tensor"):
        CUDA._pack(params, q, q, q, out, lse, None)
    for bad in (rng.int(), torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)[::2]):
        with pytest.raises(ValueError, match="rng must be a contiguous int64 tensor"):
            CUDA._pack(params, q, q, q, out, lse, None, rng=bad)


def test_forward_and_backward_hand_the_rng_to_the_library(dropout_lib, monkeypatch):
    """na_forward / na_backward (and a configured view's) pack the call's rng pointer; the
    struct the library receives carries the threshold and p."""
    monkeypatch.setattr(cuda_backend, "_raw_stream", lambda device: 0)
    q = torch.randn(1, 12, 2, 16, dtype=torch.float16)
    params = normalize(q, q, q, 1, 3, dropout_p=0.25)
    rng = dropout.draw_rng("cpu")
    out, lse = CUDA.na_forward(q, q, q, None, params, rng=rng)
    CUDA.configured("dq=pass").na_backward(q, q, q, None, out, lse, out, None, params, rng=rng)
    for fields in dropout_lib.calls:
        assert fields[F["rng_ptr"]] == rng.data_ptr()
        assert fields[F["dropout_threshold"]] == dropout.drop_threshold(0.25)
        assert fields[F["abi_version"]] == kernel_table.ABI_VERSION
    assert dropout_lib.calls[1][F["dq_mode"]] == 1
    with pytest.raises(ValueError, match="needs the call's rng tensor"):
        CUDA.na_forward(q, q, q, None, params)


def test_an_abi_2_library_reads_the_prefix_without_dropout(monkeypatch):
    """A library from before dropout (ABI 2: the struct without its last three fields) keeps
    working: calls pass its field count and version, and it gets no dropout."""
    assert kernel_table.ABI_PROBLEM_FIELDS[2] == F["dropout_threshold"]  # ABI 3 and 4: tests/test_cuda_tf32.py
    assert F["kv_splits"] == kernel_table.ABI_PROBLEM_FIELDS[2] - 1  # ABI 2's last field
    lib = FakeLibrary(dropout=False)
    lib.abi, lib.num_fields = 2, kernel_table.ABI_PROBLEM_FIELDS[2]
    _install(monkeypatch, lib)
    monkeypatch.setattr(cuda_backend, "_raw_stream", lambda device: 0)
    q = torch.randn(1, 12, 2, 16, dtype=torch.float16)
    out, lse = CUDA.na_forward(q, q, q, None, normalize(q, q, q, 1, 3))
    CUDA.na_backward(q, q, q, None, out, lse, out, None, normalize(q, q, q, 1, 3))
    for fields in lib.calls:
        assert len(fields) == lib.num_fields and fields[F["abi_version"]] == 2
        assert fields[F["q_ptr"]] == q.data_ptr()
    assert not CUDA.supports_dropout
    with pytest.raises(RuntimeError, match="has no attention dropout"):  # never silently without it
        CUDA.na_forward(q, q, q, None, normalize(q, q, q, 1, 3, dropout_p=0.5), rng=dropout.draw_rng("cpu"))
    _call_cache.clear()


# ------------------------------------------------------------------ capability
def test_library_with_dropout_takes_tensor_core_problems(dropout_lib):
    assert CUDA.supports_dropout and CUDA.configured("dq=pass").supports_dropout
    with FakeTensorMode():
        for dtype in (torch.float16, torch.bfloat16):
            q, v = fake(2, 9, 11, 4, 64, dtype=dtype), fake(2, 9, 11, 2, 128, dtype=dtype)
            k = fake(2, 9, 11, 2, 64, dtype=dtype)
            params = normalize(q, k, v, 2, (3, 5), dilation=(2, 1), is_causal=(True, False), dropout_p=0.1)
            assert CUDA.na_not_supported_reasons(q, k, v, None, params, True) == []
            assert choose_na_backend(q, k, v, None, params) == "cuda"
            assert choose_na_backend(q, k, v, None, params, deterministic=True) == "cuda:dq=pass"


@pytest.mark.parametrize("dtype,dim,capability,family,expect", [
    (torch.float32, 32, (9, 0), None, "float16/bfloat16"),
    (torch.bfloat16, 136, (9, 0), None, "head dims <= 128"),
    (torch.float16, 256, (9, 0), None, "head dims <= 128"),
    (torch.bfloat16, 64, (7, 5), None, "SM80+"),
    (torch.bfloat16, 64, (8, 6), "simt", "NATTN_FAMILY=simt"),
])
def test_problems_the_tensor_core_family_cannot_run_are_declined(monkeypatch, dtype, dim, capability, family,
                                                                 expect):
    _install(monkeypatch, FakeLibrary(), capability)
    if family:
        monkeypatch.setenv("NATTN_FAMILY", family)
    with FakeTensorMode():
        q = fake(1, 40, 2, dim, dtype=dtype)
        params = normalize(q, q, q, 1, 5, dropout_p=0.2)
        reasons = CUDA.na_not_supported_reasons(q, q, q, None, params, True)
        assert len(reasons) == 1 and expect in reasons[0] and "tensor-core family" in reasons[0], reasons
        assert choose_na_backend(q, q, q, None, params) == "reference"  # the automatic fallback
        with pytest.raises(NoBackendError, match=f"cuda: dropout_p > 0 runs on libnattn's tensor-core family"):
            choose_na_backend(q, q, q, None, params, "cuda")
        # without dropout the same problem runs on cuda (its SIMT family) as before
        assert CUDA.na_not_supported_reasons(q, q, q, None, normalize(q, q, q, 1, 5), True) == []
    _call_cache.clear()


@pytest.mark.parametrize("families", [{"tc", "simt"}, {"simt"}])
@pytest.mark.parametrize("dtype,dim,capability,family", [
    (torch.float32, 32, (9, 0), None),
    (torch.bfloat16, 136, (9, 0), None),
    (torch.float16, 256, (9, 0), None),
    (torch.bfloat16, 64, (7, 5), None),
    (torch.float32, 8, (5, 2), None),
    (torch.bfloat16, 64, (8, 6), "simt"),
])
def test_simt_dropout_takes_what_the_tensor_core_family_cannot(monkeypatch, dtype, dim, capability,
                                                                family, families):
    """A library that lists the SIMT family among its dropout families (every current build)
    runs dropout for every problem it takes: the backend declines none of those above, the
    dispatch picks cuda and the modules take the fused path."""
    lib = FakeLibrary()
    lib.dropout_families = families
    _install(monkeypatch, lib, capability)
    if family:
        monkeypatch.setenv("NATTN_FAMILY", family)
    assert CUDA.supports_dropout
    m = NeighborhoodAttention2D(2 * dim, 2, 5, attn_drop=0.1)
    with FakeTensorMode():
        q = fake(1, 40, 2, dim, dtype=dtype)
        params = normalize(q, q, q, 1, 5, dropout_p=0.2)
        assert CUDA.na_not_supported_reasons(q, q, q, None, params, True) == []
        assert choose_na_backend(q, q, q, None, params) == "cuda"
        assert choose_na_backend(q, q, q, None, params, "cuda") == "cuda"
        q2 = fake(2, 8, 8, 2, dim, dtype=dtype)
        assert m._fused_dropout(q2, q2, q2, None, None) is True
        # a Hopper configuration still declines it
        got = na_reasons(CUDA.configured("kv=2"), q, q, q, None, params, True)
        assert len(got) == 1 and "not supported by the sm90 family" in got[0]
    _call_cache.clear()


def test_configurations_naming_the_hopper_family_decline_dropout(dropout_lib):
    with FakeTensorMode():
        q = fake(1, 16, 16, 2, 64)
        params = normalize(q, q, q, 2, 5, dropout_p=0.2)
        for name in ("cuda:q8x16_k8x16", "cuda:kv=2", "cuda:q8x8_k7x16+dq=atomic"):
            got = na_reasons(CUDA.configured(name.split(":")[1]), q, q, q, None, params, True)
            assert len(got) == 1 and "not supported by the sm90 family" in got[0], (name, got)
            with pytest.raises(NoBackendError, match="sm90 family"):
                choose_na_backend(q, q, q, None, params, name)
        for name in ("cuda:kv=1", "cuda:dq=pass", "cuda:dq=atomic"):  # the tensor-core family runs these
            assert choose_na_backend(q, q, q, None, params, name) == name


def test_library_without_dropout_declines_it_as_before(old_lib):
    assert not CUDA.supports_dropout and not CUDA.configured("kv=2").supports_dropout
    with FakeTensorMode():
        q = fake(1, 40, 2, 32)
        params = normalize(q, q, q, 1, 5, dropout_p=0.2)
        assert na_reasons(CUDA, q, q, q, None, params, True) == [DROPOUT_REASON]
        assert choose_na_backend(q, q, q, None, params) == "reference"
        assert choose_na_backend(q, q, q, None, normalize(q, q, q, 1, 5)) == "cuda"


def test_missing_library_declines_dropout(monkeypatch):
    monkeypatch.setenv("NATTN_LIBRARY", "/nonexistent/libnattn.so")
    library.reset()
    try:
        assert not CUDA.supports_dropout
        q = torch.randn(1, 12, 2, 16)
        params = normalize(q, q, q, 1, 3, dropout_p=0.1)
        assert na_reasons(CUDA, q, q, q, None, params, True) == [DROPOUT_REASON]
    finally:
        library.reset()


# ------------------------------------------------------------------ the modules
@pytest.fixture
def fresh_cache():
    _call_cache.clear()
    yield
    _call_cache.clear()


def _layer_calls(monkeypatch):
    """Record which path a module's training call takes."""
    taken = []
    real_explicit, real_fused = MODULE.na_explicit, MODULE.neighborhood_attention

    def explicit(*a, **kw):
        taken.append("explicit")
        return real_explicit(*a, **kw)

    def fused(*a, **kw):
        taken.append(("fused", kw.get("dropout_p", 0.0)))
        return real_fused(*a, **kw)

    monkeypatch.setattr(MODULE, "na_explicit", explicit)
    monkeypatch.setattr(MODULE, "neighborhood_attention", fused)
    return taken


def test_module_dropout_runs_fused_on_cpu(monkeypatch, fresh_cache):
    taken = _layer_calls(monkeypatch)
    m = NeighborhoodAttention2D(16, 2, 3, attn_drop=0.4, rel_pos_bias=True)
    x = torch.randn(2, 6, 6, 16, requires_grad=True)
    m.train()
    torch.manual_seed(3)
    y = m(x)
    y.sum().backward()
    assert taken == [("fused", 0.4)]
    assert torch.isfinite(x.grad).all() and torch.isfinite(m.rpb.grad).all()
    torch.manual_seed(3)
    assert torch.equal(m(x), y)  # the functional call's rng: reproducible under manual_seed
    m.eval()
    assert not torch.allclose(m(x), y)
    assert taken[-1] == ("fused", 0.0)


@pytest.mark.parametrize("fast_has_dropout", [False, True])
def test_module_keeps_the_unfused_path_when_only_the_reference_has_dropout(monkeypatch, fresh_cache,
                                                                          fast_has_dropout):
    """A faster backend without dropout runs the layer's plain calls: dropout then stays on
    na_explicit (not the slower reference); a fast backend with dropout runs it fused."""

    class Fast(ReferenceBackend):
        name = "fast"
        supports_dropout = fast_has_dropout

    monkeypatch.setitem(BACKENDS, "fast", Fast())
    # without the tiled backend (it has dropout): the reference is then the only one with it
    monkeypatch.setattr("nattn.backends.AUTO_ORDER", ["fast"] + [n for n in AUTO_ORDER if n != "tiled"])
    taken = _layer_calls(monkeypatch)
    m = NeighborhoodAttention2D(16, 2, 3, attn_drop=0.2).train()
    m(torch.randn(1, 5, 5, 16))
    assert taken == ([("fused", 0.2)] if fast_has_dropout else ["explicit"])


def test_module_naming_a_backend_without_it_keeps_the_unfused_path(monkeypatch, fresh_cache):
    taken = _layer_calls(monkeypatch)
    m = NeighborhoodAttention2D(16, 2, 3, attn_drop=0.2, backend="cuda").train()
    m(torch.randn(1, 5, 5, 16))  # CPU tensors: cuda cannot run it, na_explicit can
    assert taken == ["explicit"]


def test_module_uses_cuda_fused_when_its_tensor_core_family_takes_it(dropout_lib, monkeypatch):
    """Which path a GPU layer would take (only the decision: no kernel runs here)."""
    m = NeighborhoodAttention2D(128, 4, 7, attn_drop=0.1)
    with FakeTensorMode():
        for dtype, want in ((torch.bfloat16, True), (torch.float32, False)):
            q = fake(2, 16, 16, 4, 32, dtype=dtype)
            assert m._fused_dropout(q, q, q, None, None) is want
    m.backend = "reference"  # named: it runs the plain calls too, so fused
    with FakeTensorMode():
        q = fake(2, 16, 16, 4, 32, dtype=torch.float32)
        assert m._fused_dropout(q, q, q, None, None) is True


def test_functional_dropout_on_cpu_runs_tiled_with_the_reference_mask():
    """CPU calls with dropout run on the tiled backend (cuda needs CUDA tensors), which drops
    the weights the reference drops."""
    q = torch.randn(1, 10, 2, 8)
    params = normalize(q, q, q, 1, 3, dropout_p=0.1)
    assert choose_na_backend(q, q, q, None, params) == "tiled"
    torch.manual_seed(0)
    a = nattn.na1d(q, q, q, 3, dropout_p=0.1)
    torch.manual_seed(0)
    torch.testing.assert_close(a, nattn.na1d(q, q, q, 3, dropout_p=0.1, backend="reference"))
