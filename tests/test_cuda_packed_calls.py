"""The cuda backend's calls on a packed qkv (``na_forward_packed`` / ``na_backward_packed``,
the modules' op and NAPackedFunction): libnattn receives the same problem struct as from the
q / k / v views' calls, on a layout's first call and on the cached ones, for fresh layouts
and inputs every run (a stand-in library records the structs)."""

import pytest
import torch

import fake_library
from nattn._cuda import kernel_table
from nattn.backends import BACKENDS, deferred
from nattn.params import normalize

F = kernel_table.FIELD_OFFSETS
FRESH = ("out_ptr", "lse_ptr", "delta_ptr", "dq_ptr", "dk_ptr", "dv_ptr", "drpb_ptr")  # allocated per call


@pytest.fixture
def lib(monkeypatch):
    lib = fake_library.FakeLibrary()
    fake_library.install_on_gpu(monkeypatch, lib)
    return lib


def _layouts():
    """(spatial, heads, dim, kernel, how qkv is laid out) cases."""
    return [
        ((11,), 2, 16, (5,), "dense"),
        ((6, 7), 2, 16, (3, 5), "dense"),
        ((6, 7), 3, 8, (3, 3), "wider"),  # a view into a larger projection (extra channels per token)
        ((3, 4, 5), 2, 16, (3, 3, 3), "heads-first"),  # [B, H..] memory, permuted to heads-last views
    ]


def _qkv(spatial, heads, dim, how, dtype):
    b = 2
    if how == "dense":
        return torch.randn(b, *spatial, 3, heads, dim, dtype=dtype)
    if how == "wider":
        return torch.randn(b, *spatial, 3 * heads * dim + 8, dtype=dtype)[..., 8:].unflatten(-1, (3, heads, dim))
    base = torch.randn(b, 3, heads, *spatial, dim, dtype=dtype)  # moved to [B, *spatial, 3, H, D]
    return base.permute(0, *range(3, 3 + len(spatial)), 1, 2, -1)


def _same_struct(got, want, own=(), skip=()):
    """Equal fields, except the pointers of the tensors in ``own`` (name, tensor), which must
    point at the packed call's own tensors, and the ``skip`` ones (per-call buffers)."""
    own = {F[name]: t for name, t in own}
    skip = {F[name] for name in skip}
    for i, (a, b) in enumerate(zip(got, want)):
        if i in skip:
            continue
        assert a == (own[i].data_ptr() if i in own else b), (i, [k for k, v in F.items() if v == i])


@pytest.mark.parametrize("spatial,heads,dim,kernel,how", _layouts())
@pytest.mark.parametrize("rpb_on", [False, True])
@pytest.mark.parametrize("dtype,tf32", [(torch.float16, False), (torch.float32, True), (torch.float32, False)])
def test_packed_calls_pass_the_views_problem(lib, spatial, heads, dim, kernel, how, rpb_on, dtype, tf32, monkeypatch):
    from nattn import _tf32

    monkeypatch.setattr(_tf32, "allowed", lambda: tf32)
    torch.manual_seed(torch.seed() % 2**31)
    cuda = BACKENDS["cuda"]
    cuda._packed.clear()
    qkv = _qkv(spatial, heads, dim, how, dtype)
    q, k, v = qkv.unbind(-3)
    rpb = torch.randn(heads, *(2 * n - 1 for n in kernel)) if rpb_on else None
    params = normalize(q, k, v, len(spatial), kernel, rpb=rpb)

    for _ in range(2):  # a layout's first call (through the views), then the cached one
        out, lse = cuda.na_forward_packed(qkv, rpb, params)
        got = lib.calls[-1]
        ref_out, ref_lse = cuda.na_forward(q, k, v, rpb, params)
        _same_struct(got, lib.calls[-1], own=(("out_ptr", out), ("lse_ptr", lse)))
        assert out.shape == ref_out.shape and out.stride() == ref_out.stride() and out.dtype == dtype
        assert lse.shape == ref_lse.shape and lse.dtype == torch.float32

    g = torch.randn_like(out).transpose(-1, -2).contiguous().transpose(-1, -2)  # a strided output gradient
    for grad_lse in (None, torch.randn_like(lse)):
        for _ in range(2):
            dqkv, drpb = cuda.na_backward_packed(qkv, rpb, out, lse, g, grad_lse, params)
            got = lib.calls[-1]
            assert dqkv.shape == qkv.shape and dqkv.is_contiguous() and dqkv.dtype == dtype
            assert (drpb is None) == (rpb is None) and (drpb is None or drpb.shape == rpb.shape)
            views = torch.empty_like(dqkv).unbind(-3)
            cuda.na_backward(q, k, v, rpb, out, lse, g, grad_lse, params, grads_into=views)
            want = lib.calls[-1]
            dq, dk, dv = dqkv.unbind(-3)
            # the delta buffer, the zeroed bias gradient and the copied output gradient are per call
            assert got[F["delta_ptr"]] != 0 and (got[F["drpb_ptr"]] != 0) == rpb_on
            _same_struct(got, want, own=(("dq_ptr", dq), ("dk_ptr", dk), ("dv_ptr", dv)),
                         skip=("delta_ptr", "drpb_ptr", "grad_out_ptr"))
            assert got[F["out_ptr"]] == out.data_ptr() and got[F["lse_ptr"]] == lse.data_ptr()


def test_packed_backward_under_the_determinism_switch_takes_the_views(lib, monkeypatch):
    """With a bias and torch's determinism switch the backward goes through the views' call
    (its alert reads them): the same struct, one call."""
    cuda = BACKENDS["cuda"]
    qkv = torch.randn(1, 5, 6, 3, 2, 16, dtype=torch.float16)
    q, k, v = qkv.unbind(-3)
    rpb = torch.randn(2, 5, 5)
    params = normalize(q, k, v, 2, 3, rpb=rpb)
    out, lse = cuda.na_forward_packed(qkv, rpb, params)
    seen = []
    monkeypatch.setattr(cuda, "na_backward", lambda *a, **kw: seen.append(kw) or (None, None, None, "drpb"))
    torch.use_deterministic_algorithms(True)
    try:
        dqkv, drpb = cuda.na_backward_packed(qkv, rpb, out, lse, torch.randn_like(out), None, params)
    finally:
        torch.use_deterministic_algorithms(False)
    assert drpb == "drpb" and len(seen) == 1 and len(seen[0]["grads_into"]) == 3


def test_resolve_na_packed_remembers_the_choice(monkeypatch):
    """A compiled call's packed op resolves its backend once per qkv signature: the views are
    built and the chooser asked only on the first call."""
    calls = []

    def resolve(name, q, k, v, rpb, params):
        calls.append(q.shape)
        return "reference"

    monkeypatch.setattr(deferred, "resolve_na", resolve)
    qkv = torch.randn(2, 7, 3, 2, 8)
    params = normalize(*qkv.unbind(-3), 1, 3)
    name = deferred.spec("test_packed_choice", None, None, False)  # a name no other test caches
    assert deferred.resolve_na_packed(name, qkv, None, params) == "reference"
    assert deferred.resolve_na_packed(name, torch.randn_like(qkv), None, params) == "reference"
    assert calls == [(2, 7, 2, 8)]
    assert deferred.resolve_na_packed("cuda", qkv, None, params) == "cuda"  # a plain name passes through


def test_switched_off_the_packed_calls_go_through_the_views(lib, monkeypatch):
    """``NATTN_PACKED_CALLS=0`` (``cuda.PACKED_CALLS``): every packed call through the views'
    calls, the same structs."""
    from nattn.backends import cuda as cuda_backend

    cuda = BACKENDS["cuda"]
    qkv = torch.randn(1, 5, 6, 3, 2, 16, dtype=torch.float16)
    params = normalize(*qkv.unbind(-3), 2, 3)
    cuda.na_forward_packed(qkv, None, params)  # a layout seen: the next call could use the template
    monkeypatch.setattr(cuda_backend, "PACKED_CALLS", False)
    forward, backward = [], []
    monkeypatch.setattr(cuda, "na_forward", lambda *a, **kw: forward.append(a) or (torch.empty(1, 5, 6, 2, 16),
                                                                                  torch.empty(1, 5, 6, 2)))
    monkeypatch.setattr(cuda, "na_backward", lambda *a, **kw: backward.append(kw) or (None, None, None, None))
    out, lse = cuda.na_forward_packed(qkv, None, params)
    cuda.na_backward_packed(qkv, None, out, lse, torch.randn_like(out), None, params)
    assert len(forward) == 1 and len(backward) == 1 and len(backward[0]["grads_into"]) == 3
