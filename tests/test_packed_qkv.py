"""The modules' packed q/k/v path (nattn/_eager.py, NAPackedFunction): backends that write
gradients into given tensors fill one d(qkv) through its three views (no stack copy); the
result must be the q/k/v path's, with fresh random inputs every run."""

import pytest
import torch

import fake_library
from backend_registry import temporarily_registered
from nattn import _eager
from nattn._cuda import kernel_table
from nattn.backends import BACKENDS
from nattn.backends.reference import ReferenceBackend
from nattn.nn import NeighborhoodAttention1D, NeighborhoodAttention2D, NeighborhoodAttention3D
from nattn.params import normalize


class _WritingReference(ReferenceBackend):
    """The reference's math, writing its gradients into the caller's tensors (as the cuda
    backend does), and counting the calls that did."""

    name = "reference_writes_into"
    writes_grads_into = True
    into_calls = 0

    def na_backward(self, q, k, v, rpb, out, lse, grad_out, grad_lse, params, rng=None, grads_into=None):
        dq, dk, dv, drpb = super().na_backward(q, k, v, rpb, out, lse, grad_out, grad_lse, params, rng=rng)
        if grads_into is None:
            return dq, dk, dv, drpb
        for dst, src in zip(grads_into, (dq, dk, dv)):
            dst.copy_(src)
        type(self).into_calls += 1
        return (*grads_into, drpb)


@pytest.fixture(scope="module")
def writing_backend():
    with temporarily_registered(_WritingReference()) as name:
        yield name


CASES = [
    (NeighborhoodAttention1D, (2, 19), dict(kernel_size=5, dilation=2, is_causal=True)),
    (NeighborhoodAttention2D, (2, 9, 11), dict(kernel_size=(3, 5), dilation=(2, 1), rel_pos_bias=True)),
    (NeighborhoodAttention2D, (1, 8, 10), dict(kernel_size=(4, 3), stride=(2, 1))),
    (NeighborhoodAttention3D, (1, 4, 6, 5), dict(kernel_size=(3, 3, 2), dilation=(1, 2, 1))),
]


@pytest.mark.parametrize("cls,lead,kw", CASES)
def test_packed_path_matches_the_qkv_path(writing_backend, cls, lead, kw):
    torch.manual_seed(torch.seed() % 2**31)  # fresh inputs each run
    dim, heads = 24, 3
    packed = cls(dim, heads, backend=writing_backend, **kw).double()
    plain = cls(dim, heads, backend="reference", **kw).double()
    plain.load_state_dict(packed.state_dict())
    x = torch.randn(*lead, dim, dtype=torch.float64)
    g = torch.randn(*lead, dim, dtype=torch.float64)
    before = _WritingReference.into_calls
    results = []
    for layer in (packed, plain):
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.backward(g)
        results.append((y.detach(), xi.grad, {n: p.grad for n, p in layer.named_parameters()}))
    assert _WritingReference.into_calls == before + 1  # the packed layer took the packed path
    (y1, gx1, gp1), (y2, gx2, gp2) = results
    assert torch.isfinite(y1).all() and torch.isfinite(gx1).all()
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(gx1, gx2)
    assert gp1.keys() == gp2.keys()
    for name in gp1:
        torch.testing.assert_close(gp1[name], gp2[name], msg=name)


def test_packed_path_only_where_it_applies(writing_backend, monkeypatch):
    """No grad recorded, extra tokens, or a backend that allocates its own gradients: the
    q/k/v path (the Function is never applied)."""
    applied = []
    real = _eager.NAPackedFunction.apply
    monkeypatch.setattr(_eager.NAPackedFunction, "apply", lambda *a: applied.append(1) or real(*a))
    layer = NeighborhoodAttention2D(16, 2, kernel_size=3, backend=writing_backend)
    x = torch.randn(1, 5, 5, 16)
    with torch.no_grad():
        layer(x)
    layer(x, additional_tokens=torch.randn(1, 2, 16)).sum().backward()
    NeighborhoodAttention2D(16, 2, kernel_size=3, backend="reference")(x).sum().backward()
    assert applied == []
    layer(x).sum().backward()
    assert applied == [1]


def test_cuda_backward_writes_into_the_given_views(monkeypatch):
    """The cuda backend's problem struct points dq / dk / dv at the given views, with their
    strides (a packed gradient's: 3 H D elements between tokens)."""
    lib = fake_library.FakeLibrary()
    fake_library.install_on_gpu(monkeypatch, lib)
    cuda = BACKENDS["cuda"]
    qkv = torch.randn(2, 6, 7, 3, 2, 16)
    q, k, v = qkv.unbind(-3)
    params = normalize(q, k, v, 2, 3)
    out, lse, g = torch.randn(2, 6, 7, 2, 16), torch.randn(2, 6, 7, 2), torch.randn(2, 6, 7, 2, 16)
    dqkv = torch.empty(qkv.shape)
    into = dqkv.unbind(-3)
    dq, dk, dv, _ = cuda.na_backward(q, k, v, None, out, lse, g, None, params, grads_into=into)
    assert all(a is b for a, b in zip((dq, dk, dv), into))
    fields = lib.calls[-1]
    f = kernel_table.FIELD_OFFSETS
    for name, t in zip(("dq", "dk", "dv"), into):
        assert fields[f[f"{name}_ptr"]] == t.data_ptr()
        s = t.stride()
        assert list(fields[f[f"{name}_stride"]:f[f"{name}_stride"] + 5]) == [s[0], s[1], s[2], 0, s[3]]
    assert fields[f["dq_stride"] + 1] == 7 * 3 * 2 * 16


def test_modules_under_torch_func_take_the_qkv_path(writing_backend):
    """torch.func.grad over a module: the packed Function (no setup_context) stays out of it,
    and the gradients are autograd's (fresh inputs)."""
    layer = NeighborhoodAttention2D(16, 2, kernel_size=3, rel_pos_bias=True, backend=writing_backend).double()
    x = torch.randn(2, 5, 6, 16, dtype=torch.float64)
    params = dict(layer.named_parameters())

    def loss(p):
        return torch.func.functional_call(layer, p, (x,)).square().sum()

    got = torch.func.grad(loss)(params)
    layer.zero_grad(set_to_none=True)
    loss(params).backward()
    for name, p in layer.named_parameters():
        torch.testing.assert_close(got[name], p.grad, msg=name)


def test_inference_runs_the_backends_forward_on_qkv(writing_backend, monkeypatch):
    """Without a gradient to record, the modules' call runs the backend's forward on the packed
    qkv (the cuda backend then builds no views), with the q/k/v path's values (fresh inputs)."""
    import nattn.functional as functional

    seen = []
    real = functional.na_forward_packed_only
    monkeypatch.setattr(functional, "na_forward_packed_only", lambda *a: seen.append(a[0].name) or real(*a))
    torch.manual_seed(torch.seed() % 2**31)
    layer = NeighborhoodAttention2D(16, 2, kernel_size=3, dilation=(1, 2), rel_pos_bias=True,
                                    backend=writing_backend).double()
    x = torch.randn(2, 6, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x)
    assert seen == [writing_backend]
    # with a gradient to record, a backend that allocates its own gradients takes the q/k/v path
    plain = NeighborhoodAttention2D(16, 2, kernel_size=3, dilation=(1, 2), rel_pos_bias=True,
                                    backend="reference").double()
    plain.load_state_dict(layer.state_dict())
    want = plain(x.clone().requires_grad_())
    assert seen == [writing_backend]
    torch.testing.assert_close(got, want.detach())
