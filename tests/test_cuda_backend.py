"""CPU tests of the cuda backend's Python side: dispatch, reasons, fallback, packing.

No GPU is needed: problems are fake CUDA tensors (FakeTensorMode), and a stand-in for
the loaded library lets the capability checks run as if libnattn were present.
"""

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import nattn
from nattn._cuda import kernel_table, library
from nattn.backends import BACKENDS, choose_na_backend
from nattn.backends import cuda as cuda_backend
from nattn.params import normalize

import fake_library

CUDA = BACKENDS["cuda"]


@pytest.fixture
def fake_lib(monkeypatch):
    fake_library.install(monkeypatch, fake_library.FakeLibrary())
    yield


@pytest.fixture
def no_lib(monkeypatch):
    monkeypatch.setenv("NATTN_LIBRARY", "/nonexistent/libnattn.so")
    monkeypatch.setattr(CUDA, "_warned_missing", False)
    library.reset()
    yield
    library.reset()


def fake(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="cuda", dtype=dtype)


def reasons(q, k, v, na_dim, kernel=3, rpb=None, explicit=True, **kw):
    params = normalize(q, k, v, na_dim, kernel, rpb=rpb, **kw)
    return CUDA.na_not_supported_reasons(q, k, v, rpb, params, explicit)


def test_registered_first_in_auto_order():
    assert nattn.backends.AUTO_ORDER[0] == "cuda"


def test_cpu_tensors_are_refused():
    q = torch.randn(1, 12, 2, 16)
    assert any("CUDA tensors" in r for r in reasons(q, q, q, 1))


def test_supported_problem_has_no_reasons(fake_lib):
    with FakeTensorMode():
        q, k, v = fake(2, 9, 11, 4, 32), fake(2, 9, 11, 2, 32), fake(2, 9, 11, 2, 64)
        assert reasons(q, k, v, 2, kernel=(3, 5), dilation=(2, 1), is_causal=(True, False)) == []
        assert choose_na_backend(q, k, v, None, normalize(q, k, v, 2, 3)) == "cuda"


def test_fused_qkv_views_are_accepted(fake_lib):
    with FakeTensorMode():
        qkv = fake(2, 40, 3, 4, 64)
        q, k, v = qkv.unbind(2)
        assert reasons(q, k, v, 1) == []
        heads_major = fake(2, 4, 40, 64).transpose(1, 2)
        assert reasons(heads_major, heads_major, heads_major, 1) == []


@pytest.mark.parametrize("dtype,dim,dim_v,expect", [
    (torch.float64, 32, 32, "dtype"),
    (torch.bfloat16, 12, 12, "multiples of 8"),
    (torch.float16, 32, 20, "multiples of 8"),
    (torch.float32, 264, 264, "no compiled"),
])
def test_reasons_for_unsupported_dtype_and_head_dim(fake_lib, dtype, dim, dim_v, expect):
    with FakeTensorMode():
        q, v = fake(1, 20, 2, dim, dtype=dtype), fake(1, 20, 2, dim_v, dtype=dtype)
        got = reasons(q, q, v, 1)
    assert any(expect in r for r in got), got


def test_reasons_for_layouts(fake_lib):
    with FakeTensorMode():
        base = fake(1, 20, 2, 40)
        channel_strided = base[..., ::2][..., :16]  # head-dim stride 2
        assert any("stride 1 along the head dim" in r for r in reasons(channel_strided, channel_strided, channel_strided, 1))
        unaligned = fake(1, 20, 2, 33)[..., 1:]  # 32 channels, rows 66 bytes apart
        got = reasons(unaligned, unaligned, unaligned, 1)
        assert any("16 bytes" in r for r in got), got
        too_many_heads = fake(1, 20, 70000, 8)
        assert any("<= 65535" in r for r in reasons(too_many_heads, too_many_heads, too_many_heads, 1))


def test_explicit_backend_error_lists_reason(fake_lib):
    with FakeTensorMode():
        q = fake(1, 20, 2, 12)
        with pytest.raises(ValueError, match="cuda: head dims must be multiples of 8"):
            choose_na_backend(q, q, q, None, normalize(q, q, q, 1, 3), "cuda")


def test_missing_library_reason_and_single_warning(no_lib):
    with FakeTensorMode():
        q = fake(1, 20, 2, 16)
        params = normalize(q, q, q, 1, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fallback = "flex" if "flex" in BACKENDS else "reference"  # next in AUTO_ORDER
            for _ in range(3):
                assert choose_na_backend(q, q, q, None, params) == fallback
        assert len([w for w in caught if "libnattn is not built" in str(w.message)]) == 1
        got = CUDA.na_not_supported_reasons(q, q, q, None, params, True)
        assert len(got) == 1 and "libnattn is not built" in got[0]


def test_missing_library_cpu_calls_do_not_warn(no_lib):
    q = torch.randn(1, 12, 2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nattn.na1d(q, q, q, 3)  # CPU tensors never reach the library check


def test_forward_without_library_raises_clearly(no_lib):
    q = torch.randn(1, 12, 2, 16)
    with pytest.raises(RuntimeError, match="libnattn is not built"):
        CUDA.na_forward(q, q, q, None, normalize(q, q, q, 1, 3))


def test_pack_matches_problem_fields():
    q = torch.randn(2, 5, 6, 4, 16)[:, :, :, :3]  # a strided view
    k = torch.randn(2, 5, 6, 3, 16)
    v = torch.randn(2, 5, 6, 3, 24)
    out = torch.empty(2, 5, 6, 3, 24)
    lse = torch.empty(2, 5, 6, 3)
    params = normalize(q, k, v, 2, (3, 2), stride=(1, 2), dilation=(1, 3), is_causal=(False, True))
    fields, device = CUDA._pack(params, q, k, v, out, lse, None)
    assert len(fields) == kernel_table.NUM_PROBLEM_FIELDS
    f = kernel_table.FIELD_OFFSETS
    assert fields[f["abi_version"]] == kernel_table.ABI_VERSION
    assert fields[f["dtype"]] == kernel_table.DTYPES.index("float32")
    assert list(fields[f["spatial"]:f["spatial"] + 3]) == [5, 6, 1]
    assert list(fields[f["kernel"]:f["kernel"] + 3]) == [3, 2, 1]
    assert list(fields[f["stride"]:f["stride"] + 3]) == [1, 2, 1]
    assert list(fields[f["dilation"]:f["dilation"] + 3]) == [1, 3, 1]
    assert list(fields[f["causal"]:f["causal"] + 3]) == [0, 1, 0]
    assert fields[f["heads"]] == 3 and fields[f["heads_kv"]] == 3
    assert fields[f["dim"]] == 16 and fields[f["dim_v"]] == 24
    s = q.stride()
    assert list(fields[f["q_stride"]:f["q_stride"] + 5]) == [s[0], s[1], s[2], 0, s[3]]
    assert fields[f["q_ptr"]] == q.data_ptr()
    assert fields[f["rpb_ptr"]] == 0 and fields[f["dq_ptr"]] == 0


def test_size_one_axes_pass_zero_strides():
    q = torch.randn(1, 7, 1, 16).transpose(0, 0)
    assert cuda_backend._strides(q, 1) == (0, 16, 0, 0, 0)


def test_pack_cache_refreshes_pointers_and_layouts():
    f = kernel_table.FIELD_OFFSETS
    q1, q2 = torch.randn(1, 12, 2, 16), torch.randn(1, 12, 2, 16)
    lse = torch.empty(1, 12, 2)
    params = normalize(q1, q1, q1, 1, 3)
    a, _ = CUDA._pack(params, q1, q1, q1, q1, lse, None)
    b, _ = CUDA._pack(params, q2, q2, q2, q2, lse, None)
    assert a[f["q_ptr"]] == q1.data_ptr() and b[f["q_ptr"]] == q2.data_ptr()
    wide = torch.randn(1, 12, 2, 32)[..., :16]  # same shape, other strides
    c, _ = CUDA._pack(params, wide, wide, wide, q1, lse, None)
    assert c[f["q_stride"] + 1] == 64 and a[f["q_stride"] + 1] == 32
    g = torch.randn(1, 12, 2, 16)
    d, _ = CUDA._pack(params, q1, q1, q1, q1, lse, None, grad_out=g, dq=g, dk=g, dv=g)
    assert d[f["grad_out_ptr"]] == g.data_ptr() and d[f["dq_stride"] + 1] == 32
    assert a[f["grad_out_ptr"]] == 0


def test_hopper_configurations_for_the_tuner(fake_lib, monkeypatch):
    """On a 9.0 GPU whose library has the Hopper family, the tuner gets its tile pairs (not
    the default, not the declined) and, with a Hopper backward, both dQ modes (whether a
    deterministic call may use them is the tuner's decision)."""
    from nattn.backends import heuristics

    lib = library._state["lib"]
    lib.kernels[("sm90", "bfloat16", 2)] = [32, 64, 128]
    lib.sm90_backward = {("bfloat16", 2, 64)}
    monkeypatch.setattr(heuristics, "_capability", lambda index: (9, 0))
    listed = [dict(name="q8x16_k8x16", keys=768, default=True, backward=False, declined=None),
              dict(name="q8x8_k4x24", keys=480, default=False, backward=False, declined=None),
              dict(name="q8x8_k7x16", keys=672, default=False, backward=False, declined="an RPB table ..."),
              # a pair not yet run on a GPU (kernel_table.SM90_UNVERIFIED_TILES): not tuned
              dict(name="q8x8_k14x16", keys=128, default=False, backward=False, declined=None),
              dict(name="q16x8_k8x8", keys=505, default=False, backward=True, declined=None)]  # tuned
    monkeypatch.setattr(kernel_table, "SM90_UNVERIFIED_TILES", ((2, ((8, 8), (14, 16))),))
    monkeypatch.setattr(CUDA, "sm90_configs", lambda q, k, v, params: listed)
    with FakeTensorMode():
        q = fake(2, 32, 32, 4, 64)
        params = normalize(q, q, q, 2, 13)
        assert CUDA.configurations(q, q, q, None, params) == ["q8x8_k4x24", "q16x8_k8x8"]  # no CUDA runtime: no kv=
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132))
        assert CUDA.configurations(q, q, q, None, params) == ["q8x8_k4x24", "q16x8_k8x8", "kv=1", "kv=2", "kv=4"]
        assert CUDA.backward_configurations(q, q, q, None, params) == ["dq=pass", "dq=atomic"]
        torch.use_deterministic_algorithms(True)  # listed still: the tuner decides (test_autotune.py)
        try:
            assert CUDA.backward_configurations(q, q, q, None, params) == ["dq=pass", "dq=atomic"]
        finally:
            torch.use_deterministic_algorithms(False)
        q32 = fake(2, 32, 32, 4, 32)  # a head dim without a Hopper backward in this "build"
        assert CUDA.backward_configurations(q32, q32, q32, None, normalize(q32, q32, q32, 2, 13)) == []
        lib.kernels[("sm90", "bfloat16", 2)] = [32, 64, 128, 256]
        lib.sm90_backward = {("bfloat16", 2, 64), ("bfloat16", 2, 256)}
        q256 = fake(2, 32, 32, 4, 256)  # its backward has the dQ pass only: nothing to choose
        assert CUDA.backward_configurations(q256, q256, q256, None, normalize(q256, q256, q256, 2, 13)) == []
        monkeypatch.setattr(heuristics, "_capability", lambda index: (8, 0))
        assert CUDA.configurations(q, q, q, None, params) == []


def test_deterministic_calls_pin_the_hopper_dq_pass(fake_lib):
    """deterministic=True names the cuda backend's own dQ pass (which a NATTN_SM90_DQ=atomic
    environment would otherwise replace); other backends have no such configuration."""
    with FakeTensorMode():
        q = fake(1, 16, 16, 2, 32)
        params = normalize(q, q, q, 2, 5)
        assert choose_na_backend(q, q, q, None, params) == "cuda"
        assert choose_na_backend(q, q, q, None, params, deterministic=True) == "cuda:dq=pass"
        assert choose_na_backend(q, q, q, None, params, "cuda:q8x8_k7x16+kv=2", deterministic=True) == \
            "cuda:q8x8_k7x16+dq=pass+kv=2"
        torch.use_deterministic_algorithms(True)
        try:
            assert choose_na_backend(q, q, q, None, params) == "cuda:dq=pass"
            assert choose_na_backend(q, q, q, None, params, deterministic=False) == "cuda"
        finally:
            torch.use_deterministic_algorithms(False)
    q = torch.randn(1, 8, 8, 2, 8)
    assert choose_na_backend(q, q, q, None, normalize(q, q, q, 2, 3), "reference", deterministic=True) == "reference"


def test_split_kv_is_listed_for_problems_that_cannot_fill_the_gpu(fake_lib, monkeypatch):
    """kv=1 (unsplit: libnattn splits such problems by default), kv=2 and kv=4 join the tuner's
    candidates when the 128-query CTAs number fewer than the SMs (any NA dim)."""
    from types import SimpleNamespace

    from nattn.backends import heuristics

    lib = library._state["lib"]
    lib.kernels[("sm90", "bfloat16", 1)] = [32, 64, 128]
    monkeypatch.setattr(heuristics, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(CUDA, "sm90_configs", lambda q, k, v, params: [
        dict(name="q128_k128", keys=2176, default=True, backward=True, declined=None)])
    with FakeTensorMode():
        small = fake(1, 4096, 2, 128)  # 32 boxes x 2 heads = 64 CTAs
        params = normalize(small, small, small, 1, 2047)
        assert CUDA.configurations(small, small, small, None, params) == ["kv=1", "kv=2", "kv=4"]
        big = fake(4, 4096, 8, 128)  # 1024 CTAs
        assert CUDA.configurations(big, big, big, None, normalize(big, big, big, 1, 2047)) == []
        lib.kernels[("sm90", "bfloat16", 3)] = [32, 64, 128]
        video = fake(1, 8, 16, 16, 4, 128)  # 16 boxes x 4 heads: a small 3-D grid at B=1
        assert CUDA.configurations(video, video, video, None, normalize(video, video, video, 3, 7)) == ["kv=1", "kv=2", "kv=4"]


def test_needs_copy_fast_path_agrees_with_the_layout_reasons():
    """``_needs_copy`` answers contiguous aligned tensors without building reasons: on fresh
    random layouts (contiguous, offset, transposed, expanded, sliced) it must say exactly what
    ``_layout_reasons`` says."""
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    for _ in range(300):
        dtype = [torch.float32, torch.float16, torch.bfloat16][int(torch.randint(3, (1,), generator=gen))]
        d = int(torch.randint(1, 9, (1,), generator=gen)) * 4 - int(torch.randint(0, 2, (1,), generator=gen))
        shape = [int(torch.randint(1, 4, (1,), generator=gen)) for _ in range(3)] + [d]
        numel = int(torch.tensor(shape).prod())
        offset = int(torch.randint(0, 9, (1,), generator=gen))
        t = torch.empty(numel + 8, dtype=dtype)[offset:offset + numel].view(shape)
        kind = int(torch.randint(4, (1,), generator=gen))
        if kind == 1:
            t = t.transpose(1, 2)
        elif kind == 2:
            t = t[:, :1].expand(shape[0], 3, *shape[2:])
        elif kind == 3:
            t = t[..., : max(1, d // 2)]
        assert cuda_backend._needs_copy(t) == bool(cuda_backend._layout_reasons("t", t)), (t.shape, t.stride(),
                                                                                             t.storage_offset())
