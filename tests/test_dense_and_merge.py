"""Dense attention and merge_attentions against float64 ground truth, with gradients."""

import pytest
import torch

import nattn


def dense_truth(q, k, v, causal, scale):
    h, hk = q.shape[2], k.shape[2]
    kk = k.repeat_interleave(h // hk, 2)
    vv = v.repeat_interleave(h // hk, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bkhe->bqhe", s.softmax(-1), vv), s.logsumexp(-1).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,heads_kv,nk,dv", [(2, 2, 13, 8), (4, 1, 13, 5), (2, 1, 7, 8)])
def test_dense_attention_float64(causal, heads, heads_kv, nk, dv):
    nq = nk if causal else 11
    q = torch.randn(2, nq, heads, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, nk, heads_kv, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, nk, heads_kv, dv, dtype=torch.float64, requires_grad=True)
    out, lse = nattn.attention(q, k, v, is_causal=causal, scale=0.4, return_lse=True)
    ref_out, ref_lse = dense_truth(q, k, v, causal, 0.4)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * go).sum() + (lse * gl).sum(), (q, k, v))
    want = torch.autograd.grad((ref_out * go).sum() + (ref_lse * gl).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_merge_equals_attention_over_union():
    q = torch.randn(2, 9, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 20, 2, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 20, 2, 6, dtype=torch.float64, requires_grad=True)
    parts = [nattn.attention(q, k[:, a:b], v[:, a:b], return_lse=True) for a, b in [(0, 7), (7, 8), (8, 20)]]
    out, lse = nattn.merge_attentions([p[0] for p in parts], [p[1] for p in parts])
    ref_out, ref_lse = nattn.attention(q, k, v, return_lse=True)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    go = torch.randn_like(out)
    got = torch.autograd.grad((out * go).sum() + lse.sum(), (q, k, v))
    want = torch.autograd.grad((ref_out * go).sum() + ref_lse.sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_low_precision_dense_close_to_float64():
    q, k, v = (torch.randn(1, 33, 2, 16) for _ in range(3))
    ref, _ = dense_truth(q.double(), k.double(), v.double(), True, 0.25)
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 3e-3)]:
        out = nattn.attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, scale=0.25)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_merge_validates_lse_dtypes_and_types():
    o = torch.randn(1, 5, 2, 4)
    lse = torch.randn(1, 5, 2)
    with pytest.raises(TypeError, match=r"lse_tensors\[0\] must be float32.*int32"):
        nattn.merge_attentions([o, o], [lse.int(), lse.int()])
    with pytest.raises(TypeError, match=r"outputs\[1\] must be float32.*int64"):
        nattn.merge_attentions([o, o.long()], [lse, lse])
    with pytest.raises(ValueError, match=r"lse_tensors\[1\] dtype.*float64"):
        nattn.merge_attentions([o, o], [lse, lse.double()])
    with pytest.raises(TypeError, match=r"lse_tensors\[1\] must be a torch.Tensor"):
        nattn.merge_attentions([o, o], [lse, 0.0])


def test_merge_drops_empty_parts_with_finite_gradients():
    """A part with LSE -inf attended no key: it adds nothing (even a NaN output) and the
    gradients stay finite; every part empty gives zeros with LSE -inf."""
    dt = torch.float64
    full = torch.randn(2, 6, 3, 4, dtype=dt, requires_grad=True)
    full_lse = torch.randn(2, 6, 3, dtype=dt, requires_grad=True)
    nan_out = torch.full((2, 6, 3, 4), float("nan"), dtype=dt, requires_grad=True)
    empty_lse = torch.full((2, 6, 3), float("-inf"), dtype=dt, requires_grad=True)
    out, lse = nattn.merge_attentions([nan_out, full], [empty_lse, full_lse])
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(lse, full_lse)
    go, gl = torch.randn_like(out), torch.randn_like(lse)
    grads = torch.autograd.grad((out * go).sum() + (lse * gl).sum(), (nan_out, full, empty_lse, full_lse))
    for g in grads:
        assert torch.isfinite(g).all()
    torch.testing.assert_close(grads[1], go)
    torch.testing.assert_close(grads[3], gl)
    assert (grads[0] == 0).all() and (grads[2] == 0).all()

    out, lse = nattn.merge_attentions([nan_out, nan_out], [empty_lse, empty_lse])
    assert (out == 0).all() and (lse == float("-inf")).all()
    grads = torch.autograd.grad((out * go).sum() + (lse.exp() * gl).sum(), (nan_out, empty_lse))
    assert all(torch.isfinite(g).all() for g in grads)
