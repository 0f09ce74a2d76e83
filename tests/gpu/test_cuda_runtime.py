"""GPU tier: CUDA graphs, torch.compile, auto-dispatch, errors, and a >2^31-element problem."""

import pytest
import torch

import nattn
from nattn.backends import BACKENDS

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def qkv(shape, dtype=torch.bfloat16, requires_grad=False):
    return [torch.randn(shape, device="cuda", dtype=dtype).requires_grad_(requires_grad) for _ in range(3)]


def test_auto_dispatch_picks_cuda():
    q, k, v = qkv((2, 20, 18, 4, 32))
    reasons = nattn.backends.na_backend_reasons(q, k, v, None, nattn.params.normalize(q, k, v, 2, 5))
    assert reasons["cuda"] == []
    assert nattn.backends.choose_na_backend(q, k, v, None, nattn.params.normalize(q, k, v, 2, 5)) == "cuda"


def test_unsupported_head_dim_falls_back_with_reason():
    q, k, v = qkv((1, 30, 2, 12))  # 12 is not a multiple of 8
    p = nattn.params.normalize(q, k, v, 1, 5)
    reasons = BACKENDS["cuda"].na_not_supported_reasons(q, k, v, None, p, False)
    assert any("multiples of 8" in r for r in reasons)
    out = nattn.na1d(q, k, v, 5)  # auto: runs on the reference
    torch.testing.assert_close(out, nattn.na1d(q, k, v, 5, backend="reference"))


def test_cuda_graph_capture_and_replay():
    q, k, v = qkv((2, 24, 24, 4, 32))
    static_out = None
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            nattn.na2d(q, k, v, 7, backend="cuda")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = nattn.na2d(q, k, v, 7, backend="cuda")
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        want = nattn.na2d(q, k, v, 7, backend="reference")
        torch.testing.assert_close(static_out.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_torch_compile_fullgraph_fwd_bwd():
    q, k, v = qkv((1, 16, 16, 2, 64), requires_grad=True)

    def f(q, k, v):
        return nattn.na2d(q, k, v, (5, 3), dilation=(2, 1), backend="cuda").float().square().sum()

    loss = torch.compile(f, fullgraph=True)(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    loss_ref = nattn.na2d(q, k, v, (5, 3), dilation=(2, 1), backend="reference").float().square().sum()
    grads_ref = torch.autograd.grad(loss_ref, (q, k, v))
    torch.testing.assert_close(loss, loss_ref, rtol=2e-2, atol=1e-1)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-2)


def test_launch_error_names_the_config():
    q, k, v = qkv((1, 40, 2, 32))
    p = nattn.params.normalize(q, k, v, 1, 5)
    misaligned = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)[1:].view(q.shape)
    assert BACKENDS["cuda"].na_not_supported_reasons(misaligned, k, v, None, p, True)
    with pytest.raises(RuntimeError, match=r"not 16-byte aligned.*dtype=bfloat16 na_dim=1"):
        BACKENDS["cuda"].na_forward(misaligned, k, v, None, p)  # bypasses the check: C rejects it


def test_more_than_2_pow_31_elements():
    """q has > 2^31 elements: 64-bit offsets must address the tail correctly."""
    heads, dim, kernel = 16, 128, 5
    tokens = (2**31) // (heads * dim) + 4096
    assert tokens * heads * dim > 2**31
    q, k, v = qkv((1, tokens, heads, dim))
    out, lse = nattn.na1d(q, k, v, kernel, backend="cuda", return_lse=True)
    tail = 2048  # the last queries only see the last keys: check them on a suffix problem
    sl = slice(tokens - tail, tokens)
    want, want_lse = nattn.na1d(q[:, sl], k[:, sl], v[:, sl], kernel, backend="reference", return_lse=True)
    torch.testing.assert_close(out[:, sl][:, kernel:].float(), want[:, kernel:].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[:, sl][:, kernel:], want_lse[:, kernel:], atol=1e-3, rtol=1e-3)
    # backward on the same size: dq of the tail queries
    del lse
    qg, kg, vg = (t.requires_grad_(True) for t in (q, k, v))
    out = nattn.na1d(qg, kg, vg, kernel, backend="cuda")
    g = torch.zeros_like(out)
    g[:, sl] = torch.randn_like(out[:, sl])
    (dq,) = torch.autograd.grad(out, (qg,), g)
    del out
    qs, ks, vs = (t[:, sl].detach().requires_grad_(True) for t in (q, k, v))
    want = nattn.na1d(qs, ks, vs, kernel, backend="reference")
    (dq_ref,) = torch.autograd.grad(want, (qs,), g[:, sl])
    torch.testing.assert_close(dq[:, sl][:, kernel:].float(), dq_ref[:, kernel:].float(), atol=3e-2, rtol=3e-2)
