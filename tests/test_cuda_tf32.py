"""CPU tests of float32 through TF32 tensor cores on the cuda backend's Python side: the problem
struct's allow_tf32 field (ABI 4), torch's switch read on every call (nattn/_tf32.py), the
kernel table's TF32 rows, libraries from before ABI 4 (they never get TF32), and the dispatch
decisions that follow the switch (backend order, dropout, the call cache, the tuner's key).

No GPU is needed: problems are CPU or fake CUDA tensors (FakeTensorMode) and a stand-in for the
loaded library records what it is called with (tests/test_cuda_dropout.py does the same);
libnattn's own checks of the field are at the end, with the built library (NATTN_LIBRARY).
"""

import ctypes
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nattn import _call_cache, _tf32, dropout
from nattn._cuda import kernel_table, library
from nattn.backends import BACKENDS, NoBackendError, autotune, choose_na_backend, heuristics
from nattn.backends import cuda as cuda_backend
from nattn.params import normalize

import fake_library

CUDA = BACKENDS["cuda"]
F = kernel_table.FIELD_OFFSETS


def FakeLibrary(abi=kernel_table.ABI_VERSION, tf32_dims=(16, 32, 64, 128)):
    """The loaded library as the backend sees it: SIMT for everything, the tensor-core family
    for every dtype up to head dim 128 (its float32 rows: TF32, ``tf32``) with dropout; ``abi``
    3 makes it a library from before allow_tf32 (a prefix of the struct, no TF32)."""
    return fake_library.FakeLibrary(tc=True, tf32_dims=tf32_dims, dropout={"tc"}, abi=abi)


def _install(monkeypatch, lib, capability=(8, 0), tf32=False):
    fake_library.install_on_gpu(monkeypatch, lib, capability)
    set_tf32(monkeypatch, tf32)
    _call_cache.clear()


def set_tf32(monkeypatch, on: bool):
    """torch's switch as nattn reads it (the real switch is exercised in subprocesses below)."""
    monkeypatch.setattr(_tf32, "allowed", lambda: on)


@pytest.fixture
def lib(monkeypatch):
    lib = FakeLibrary()
    _install(monkeypatch, lib)
    yield lib
    _call_cache.clear()


def fake(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="cuda", dtype=dtype)


# ------------------------------------------------------------------ the problem struct
def test_abi_4_appends_allow_tf32():
    names = [name for name, _ in kernel_table.PROBLEM_FIELDS]
    assert kernel_table.ABI_VERSION == 5  # 5 appends query_range after it
    assert names[-2] == "allow_tf32" and F["allow_tf32"] == F["query_range"] - 1
    assert kernel_table.ABI_PROBLEM_FIELDS == {2: F["dropout_threshold"], 3: F["allow_tf32"],
                                               4: F["query_range"], 5: kernel_table.NUM_PROBLEM_FIELDS}
    assert F["rng_ptr"] == kernel_table.ABI_PROBLEM_FIELDS[3] - 1  # ABI 3's last field
    header = kernel_table.problem_header()
    assert "#define NATTN_ABI_VERSION 5" in header and "  int64_t allow_tf32;" in header
    assert "  int64_t query_range[6];" in header


def test_kernel_table_has_tf32_rows_for_the_tensor_core_family_only():
    insts = kernel_table.instances()
    tf32 = {(i.na_dim, i.head_dim) for i in insts if i.family == "tc" and i.dtype == "float32"}
    assert kernel_table.TF32_FAMILY == "tc"
    assert tf32 == {(n, h) for n in kernel_table.NA_DIMS for h in (16, 32, 64, 128)}
    assert not any(i.family == "sm90" and i.dtype == "float32" for i in insts)  # Hopper: no fp32
    inst = kernel_table.Instance("tc", "float32", 2, 64)
    src = kernel_table.instance_source(inst)
    assert inst.stem == "tc_float32_na2d_hd64"
    assert "launch_forward<float, 2, 64>" in src and "launch_backward<float, 2, 64>" in src
    assert '{"tc", 0, 2, 64, &tc::launch_forward<float, 2, 64>' in kernel_table.table_source([inst])
    # a float32-only developer build still gets them (for SM80+ archs, like the 16-bit rows)
    assert {i.family for i in kernel_table.instances("float32", "64", "2", "8.0")} == {"simt", "tc"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_switch_is_read_on_every_call(lib, monkeypatch, dtype):
    """Forward and backward pack allow_tf32 = 1 for float32 while torch allows TF32 (the cached
    template never keeps it), 0 otherwise and for 16-bit inputs."""
    q = torch.randn(1, 12, 2, 16, dtype=dtype)
    params = normalize(q, q, q, 1, 3)
    for on in (False, True, False, True):
        set_tf32(monkeypatch, on)
        lib.calls.clear()
        out, lse = CUDA.na_forward(q, q, q, None, params)
        CUDA.configured("dq=pass").na_backward(q, q, q, None, out, lse, out, None, params)
        assert len(lib.calls) == 2
        for fields in lib.calls:
            assert len(fields) == kernel_table.NUM_PROBLEM_FIELDS and fields[F["abi_version"]] == kernel_table.ABI_VERSION
            assert fields[F["allow_tf32"]] == int(on and dtype == torch.float32)
            assert fields[F["q_ptr"]] == q.data_ptr()
    template, _ = CUDA._template(params, (q, q, q, out, None, None, None, None))
    assert template[F["allow_tf32"]] == 0


def test_an_abi_3_library_reads_the_prefix_and_never_gets_tf32(monkeypatch):
    """A library from before allow_tf32 (ABI 3) keeps working, dropout included: calls pass its
    field count and version; its float32 calls run the SIMT family (it never sees the field)."""
    old = FakeLibrary(abi=3)
    _install(monkeypatch, old, tf32=True)
    assert old.tf32 == {}
    q = torch.randn(1, 12, 2, 16)
    out, lse = CUDA.na_forward(q, q, q, None, normalize(q, q, q, 1, 3))
    rng = dropout.draw_rng("cpu")
    h = q.half()
    CUDA.na_forward(h, h, h, None, normalize(h, h, h, 1, 3, dropout_p=0.5), rng=rng)
    for fields in old.calls:
        assert len(fields) == kernel_table.ABI_PROBLEM_FIELDS[3] == F["allow_tf32"]
        assert fields[F["abi_version"]] == 3
    assert old.calls[1][F["rng_ptr"]] == rng.data_ptr()
    with FakeTensorMode():  # and it is not counted as running tensor cores for float32
        assert not heuristics.runs_tensor_cores(fake(1, 8, 8, 2, 64))
    _call_cache.clear()


def test_library_attribute_lists_tf32_only_from_abi_4():
    """Library.tf32 (NA dim -> head-dim buckets of the tensor-core family's float32 rows) is
    what nattn_kernels() lists for a library of ABI 4, and empty before."""
    real = library.load()
    if real is None:
        pytest.skip("libnattn is not built")
    listed = {nd: dims for (fam, dt, nd), dims in real.kernels.items() if fam == "tc" and dt == "float32"}
    assert real.tf32 == (listed if real.abi >= 4 else {})


# ------------------------------------------------------------------ torch's switch
def _switch(code: str) -> bool:
    """nattn._tf32.allowed() after running ``code`` in a fresh interpreter (torch refuses to
    read allow_tf32 once the newer API has set the precision: never mix them in this one)."""
    script = textwrap.dedent(f"""
        import torch
        from nattn import _tf32
        m = torch.backends.cuda.matmul
        {code}
        print(_tf32.allowed())
    """)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("code,expect", [
    ("pass", False),  # torch's default: off
    ("m.allow_tf32 = True", True),
    ("m.allow_tf32 = True; m.allow_tf32 = False", False),
    ("torch.set_float32_matmul_precision('high')", True),
    ("torch.set_float32_matmul_precision('medium')", True),
    ("torch.set_float32_matmul_precision('high'); torch.set_float32_matmul_precision('highest')", False),
    ("torch.backends.cudnn.allow_tf32 = True", False),  # convolutions' switch, not matmuls'
])
def test_the_legacy_switches(code, expect):
    assert _switch(code) is expect


@pytest.mark.skipif(not hasattr(torch._C, "_get_fp32_precision_getter"), reason="torch < 2.9: no fp32_precision")
@pytest.mark.parametrize("code,expect", [
    ("m.fp32_precision = 'tf32'", True),
    ("m.fp32_precision = 'ieee'", False),
    ("torch.backends.fp32_precision = 'tf32'", True),
    ("torch.backends.fp32_precision = 'tf32'; m.fp32_precision = 'ieee'", False),
    ("m.allow_tf32 = True; m.fp32_precision = 'ieee'", False),  # torch raises reading allow_tf32 here
    ("torch.set_float32_matmul_precision('high'); m.fp32_precision = 'ieee'", False),
])
def test_the_fp32_precision_api(code, expect):
    assert _switch(code) is expect


def test_the_switch_in_this_process_matches_torch():
    """Without either API touched (the test suite never sets them in-process) it reads off."""
    assert _tf32.allowed() is bool(torch.backends.cuda.matmul.allow_tf32) is False


# ------------------------------------------------------------------ dispatch decisions
def test_backend_order_follows_the_switch(lib, monkeypatch):
    """With TF32 off float32 runs SIMT against flex's exact fp32 matmuls (SIMT_FP32_MAX_WINDOW);
    with it on the TF32 kernels against flex in TF32 (TC_MAX_WINDOW), while head dims above
    128 and GPUs before SM80 take the SIMT limit of 16-bit problems (SIMT_MAX_WINDOW)."""
    from nattn.backends.heuristics import SIMT_FP32_MAX_WINDOW, SIMT_MAX_WINDOW, TC_MAX_WINDOW, na_auto_order
    order, flex_first = ["cuda", "flex", "reference"], ["flex", "cuda", "reference"]
    assert SIMT_MAX_WINDOW < 13 * 13 <= TC_MAX_WINDOW < 25 * 25 <= SIMT_FP32_MAX_WINDOW < 33 * 33
    with FakeTensorMode():
        q, wide = fake(1, 40, 40, 2, 64), fake(1, 40, 40, 2, 256)
        p13, p25, p33 = (normalize(q, q, q, 2, k) for k in (13, 25, 33))
        assert [na_auto_order(order, q, p) for p in (p13, p25, p33)] == [order, order, flex_first]
        assert na_auto_order(order, wide, p13) == order  # exact fp32 on SIMT either way
        set_tf32(monkeypatch, True)
        assert heuristics.runs_tensor_cores(q) and not heuristics.runs_tensor_cores(wide)
        assert [na_auto_order(order, q, p) for p in (p13, p25, p33)] == [order, flex_first, flex_first]
        assert na_auto_order(order, wide, p13) == flex_first
        assert not heuristics.runs_hopper(q, p13)  # the Hopper family has no float32
        monkeypatch.setattr(heuristics, "_capability_major", lambda index: 7)
        assert not heuristics.runs_tensor_cores(q)
        assert na_auto_order(order, q, p13) == flex_first  # SIMT beside flex in TF32


def test_call_cache_and_tuner_keys_follow_the_switch(monkeypatch):
    q = torch.randn(1, 9, 2, 16)
    set_tf32(monkeypatch, False)
    key_off, sig_off = _call_cache.key((q,), (3,)), autotune.signature(q, q, q, None, normalize(q, q, q, 1, 3))
    set_tf32(monkeypatch, True)
    key_on, sig_on = _call_cache.key((q,), (3,)), autotune.signature(q, q, q, None, normalize(q, q, q, 1, 3))
    assert key_off != key_on and sig_off != sig_on and '"tf32"' in sig_on and '"tf32"' not in sig_off
    h = q.half()  # 16-bit calls: the tuner's key is as before
    assert autotune.signature(h, h, h, None, normalize(h, h, h, 1, 3)) == \
        autotune.signature(h, h, h, None, normalize(h, h, h, 1, 3))
    set_tf32(monkeypatch, False)
    assert '"tf32"' not in autotune.signature(h, h, h, None, normalize(h, h, h, 1, 3))
    ref = torch.randn(1000)
    off = ref * (1 + 2e-3)  # a TF32-sized error: rejected for exact fp32, accepted with TF32
    assert autotune._agrees(off, ref) is not None
    set_tf32(monkeypatch, True)
    assert autotune._agrees(off, ref) is None


def test_float32_dropout_runs_on_the_tf32_kernels_with_the_switch_on(lib, monkeypatch):
    """With TF32 allowed the tensor-core family's TF32 instances run float32 dropout (head dims
    <= 128, SM80+); with it off, float32 runs the SIMT family, which declines dropout (the
    automatic dispatch then falls back to the reference). The choice is cached per switch."""
    with FakeTensorMode():
        q = fake(1, 40, 2, 64)
        params = normalize(q, q, q, 1, 5, dropout_p=0.2)
        reasons = CUDA.na_not_supported_reasons(q, q, q, None, params, True)
        assert len(reasons) == 1 and "TF32 off" in reasons[0] and "float16/bfloat16" in reasons[0], reasons
        assert choose_na_backend(q, q, q, None, params) == "reference"
        set_tf32(monkeypatch, True)
        assert CUDA.na_not_supported_reasons(q, q, q, None, params, True) == []
        assert choose_na_backend(q, q, q, None, params) == "cuda"
        wide = fake(1, 40, 2, 136)
        reasons = CUDA.na_not_supported_reasons(wide, wide, wide, None, normalize(wide, wide, wide, 1, 5, dropout_p=0.2),
                                                True)
        assert len(reasons) == 1 and "head dims <= 128 for float32" in reasons[0], reasons
        with pytest.raises(NoBackendError, match="tensor-core family"):
            choose_na_backend(wide, wide, wide, None, normalize(wide, wide, wide, 1, 5, dropout_p=0.2), "cuda")
    _install(monkeypatch, FakeLibrary(tf32_dims=()), tf32=True)  # a build without TF32 rows
    with FakeTensorMode():
        q = fake(1, 40, 2, 64)
        reasons = CUDA.na_not_supported_reasons(q, q, q, None, normalize(q, q, q, 1, 5, dropout_p=0.2), True)
        assert len(reasons) == 1 and "has not compiled" in reasons[0], reasons
    _install(monkeypatch, FakeLibrary(abi=3), tf32=True)  # a library from before ABI 4
    with FakeTensorMode():
        reasons = CUDA.na_not_supported_reasons(q, q, q, None, normalize(q, q, q, 1, 5, dropout_p=0.2), True)
        assert len(reasons) == 1 and "(ABI 3) predates" in reasons[0], reasons
    _call_cache.clear()


# ------------------------------------------------------------------ libnattn (built)
LIB = library.load()
needs_abi4 = pytest.mark.skipif(LIB is None or LIB.abi < 4, reason="needs a libnattn of ABI 4 (NATTN_LIBRARY)")


def _problem(dtype=torch.float32, allow=0, p=0.0):
    q = torch.zeros(2, 9, 11, 2, 32, dtype=dtype)
    out, lse = torch.empty_like(q), torch.empty(2, 9, 11, 2)
    params = normalize(q, q, q, 2, (3, 5), dropout_p=p)
    fields, _ = CUDA._template(params, (q, q, q, out, None, None, None, None))
    for slot, t in zip(cuda_backend._PTR_SLOTS, (q, q, q, out, lse)):
        fields[slot] = t.data_ptr()
    if p:
        fields[F["rng_ptr"]] = 1 << 20
    fields[F["allow_tf32"]] = allow
    return fields, (q, out, lse)


def _call(fields, fn="forward"):
    err = ctypes.create_string_buffer(1024)
    rc = getattr(LIB, fn)(fields, LIB.num_fields, 0.5, None, err, 1024)
    return rc, err.value.decode()


@needs_abi4
def test_library_lists_its_tf32_instances():
    if not any(fam == "tc" for fam, _, _ in LIB.kernels):
        pytest.skip("this build has no tensor-core family")
    assert LIB.tf32 and all(set(d) <= {16, 32, 64, 128} for d in LIB.tf32.values())
    assert LIB.tf32 == {nd: LIB.kernels[("tc", "float32", nd)] for nd in LIB.tf32}


@needs_abi4
def test_library_checks_allow_tf32(monkeypatch):
    """allow_tf32 must be 0 or 1 (checked before any device work, named in the message's
    configuration); with or without TF32 and dropout a float32 call passes every check (the
    tensor-core family, or the SIMT family, which runs dropout too)."""
    monkeypatch.delenv("NATTN_FAMILY", raising=False)
    fields, keep = _problem(allow=2)
    rc, msg = _call(fields)
    assert rc == 1 and "allow_tf32 must be 0 or 1, got 2" in msg and msg.endswith(" allow_tf32=2]"), msg
    if not torch.cuda.is_available():  # past every check: no GPU to launch on
        for allow in (0, 1):
            for p in (0.0, 0.3):
                fields, keep = _problem(allow=allow, p=p)
                rc, msg = _call(fields)
                assert rc == 3 and "device" in msg, (allow, p, msg)
