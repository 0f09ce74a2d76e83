"""nattn.nn.NeighborhoodAttention1D/2D/3D: shapes, gradients, RPB, errors, parity with
the functional API (the module must be exactly qkv -> na -> proj)."""

import pytest
import torch
import torch.nn.functional as F

import nattn
from nattn.nn import (
    NeighborhoodAttention1D, NeighborhoodAttention2D, NeighborhoodAttention3D, na_explicit,
)
from nattn.params import NAParams

CLASSES = {1: NeighborhoodAttention1D, 2: NeighborhoodAttention2D, 3: NeighborhoodAttention3D}
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
SPATIAL = {1: (13,), 2: (9, 11), 3: (5, 6, 7)}
KERNEL = {1: 5, 2: (3, 5), 3: (3, 3, 5)}


def _hand_built(m, x, extra=None):
    """The module rebuilt from its weights with the functional API."""
    b, c, h = x.shape[0], m.embed_dim, m.num_heads
    qkv = F.linear(x, m.qkv.weight, m.qkv.bias).reshape(*x.shape[:-1], 3, h, c // h)
    q, k, v = qkv.unbind(-3)
    ek = ev = None
    if extra is not None:
        kv = F.linear(extra, m.qkv.weight[c:], m.qkv.bias[c:]).reshape(b, extra.shape[1], 2, h, c // h)
        ek, ev = kv[:, :, 0], kv[:, :, 1]
    out = FUNCS[m.na_dim](q, k, v, m.kernel_size, m.stride, m.dilation, m.is_causal, m.scale,
                          additional_keys=ek, additional_values=ev, rpb=m.rpb)
    return F.linear(out.reshape(*x.shape[:-1], c), m.proj.weight, m.proj.bias)


@pytest.mark.parametrize("na_dim", [1, 2, 3])
@pytest.mark.parametrize("rpb", [False, True])
def test_shape_grad_and_parity(na_dim, rpb):
    torch.manual_seed(na_dim)
    m = CLASSES[na_dim](16, 2, KERNEL[na_dim], dilation=1 if na_dim == 3 else 2, rel_pos_bias=rpb).double()
    x = torch.randn(2, *SPATIAL[na_dim], 16, dtype=torch.float64, requires_grad=True)
    y = m(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, _hand_built(m, x), rtol=0, atol=1e-12)
    y.square().sum().backward()
    grads = [x.grad] + [p.grad for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    assert (m.rpb is not None) == rpb
    if rpb:
        assert tuple(m.rpb.shape) == (2, *(2 * k - 1 for k in m.kernel_size))


def test_rpb_changes_output_and_init():
    torch.manual_seed(0)
    m = NeighborhoodAttention2D(32, 4, 7, rel_pos_bias=True)
    assert 0.015 < m.rpb.std().item() < 0.025  # trunc normal, std 0.02 (bounds +-2, as timm/NAT)
    assert abs(m.rpb.mean().item()) < 0.005
    x = torch.randn(1, 8, 8, 32)
    y = m(x)
    with torch.no_grad():
        m.rpb.zero_()
    assert not torch.allclose(y, m(x))


@pytest.mark.parametrize("kw", [
    dict(kernel_size=4, stride=2), dict(kernel_size=(3, 5), is_causal=(True, False)),
    dict(kernel_size=5, dilation=(1, 2)), dict(kernel_size=2),
])
def test_parity_strided_causal_even(kw):
    torch.manual_seed(1)
    m = NeighborhoodAttention2D(12, 3, **kw).double()
    x = torch.randn(2, 10, 12, 12, dtype=torch.float64)
    torch.testing.assert_close(m(x), _hand_built(m, x), rtol=0, atol=1e-12)


def test_small_input_is_padded_like_nat():
    """Maps smaller than kernel*dilation are zero-padded at the end, then cropped."""
    torch.manual_seed(2)
    m = NeighborhoodAttention2D(8, 2, 7, dilation=2, rel_pos_bias=True).double()
    x = torch.randn(1, 5, 16, 8, dtype=torch.float64)
    padded = F.pad(x, (0, 0, 0, 0, 0, 9))  # H: 5 -> 14 = 7 * 2
    expected = _hand_built(m, padded)[:, :5]
    torch.testing.assert_close(m(x), expected, rtol=0, atol=1e-12)


def test_additional_tokens_match_functional():
    torch.manual_seed(3)
    m = NeighborhoodAttention2D(16, 4, 3, rel_pos_bias=True).double()
    x = torch.randn(2, 6, 5, 16, dtype=torch.float64)
    extra = torch.randn(2, 3, 16, dtype=torch.float64)
    y = m(x, additional_tokens=extra)
    torch.testing.assert_close(y, _hand_built(m, x, extra), rtol=0, atol=1e-12)
    assert not torch.allclose(y, m(x))


@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, dilation=2, rpb=True), dict(kernel_size=(4, 3), stride=(2, 1), is_causal=(True, False)),
    dict(kernel_size=3, extra=True, rpb=True),
])
def test_explicit_path_matches_fused(kw):
    """The unfused path (used for attention dropout) computes the same attention."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 7, 8, 4, 6, dtype=torch.float64) for _ in range(3))
    ks = kw["kernel_size"]
    params = NAParams(*(tuple(x) if isinstance(x, tuple) else (x, x) for x in (
        ks, kw.get("stride", 1), kw.get("dilation", 1), kw.get("is_causal", False))), 0.3)
    rpb = torch.randn(4, *(2 * k - 1 for k in params.kernel_size), dtype=torch.float64) if kw.get("rpb") else None
    ek = torch.randn(2, 3, 4, 6, dtype=torch.float64) if kw.get("extra") else None
    ev = torch.randn(2, 3, 4, 6, dtype=torch.float64) if kw.get("extra") else None
    want = nattn.na2d(q, k, v, params.kernel_size, params.stride, params.dilation, params.is_causal, 0.3,
                      additional_keys=ek, additional_values=ev, rpb=rpb)
    got = na_explicit(q, k, v, params, rpb, ek, ev)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_unfused_path_scales_first_and_accumulates_in_fp32():
    """fp16 inputs whose unscaled q.k passes fp16's 65504 while the scaled logits stay small:
    the unfused path (attention dropout) stays finite and matches the fused op computed in
    fp32 from the same fp16 inputs; it used to overflow to inf and NaN."""
    torch.manual_seed(3)
    q = (torch.randn(1, 6, 7, 2, 64) * 90).half()
    k = (torch.randn(1, 6, 7, 2, 64) * 90).half()
    v = torch.randn(1, 6, 7, 2, 64).half()
    params = NAParams((3, 5), (1, 1), (1, 1), (False, False), 1e-3)
    assert (q.float() @ k.float().transpose(-1, -2)).abs().max() > 65504  # overflows in fp16
    got = na_explicit(q, k, v, params)
    want = nattn.na2d(q.float(), k.float(), v.float(), (3, 5), scale=1e-3)
    assert torch.isfinite(got).all()
    err = ((got.float() - want).norm() / want.norm()).item()
    assert err < 2e-3, err


def test_attention_dropout_trains_and_eval_is_deterministic():
    torch.manual_seed(5)
    m = NeighborhoodAttention2D(16, 2, 3, attn_drop=0.5, rel_pos_bias=True)
    x = torch.randn(2, 6, 6, 16, requires_grad=True)
    m.train()
    y = m(x)
    y.sum().backward()
    assert m.rpb.grad is not None and torch.isfinite(m.rpb.grad).all()
    m.eval()
    torch.testing.assert_close(m(x), _hand_built(m, x))
    assert not torch.allclose(y, m(x))


def test_extra_repr():
    r = repr(NeighborhoodAttention3D(24, 3, (3, 5, 5), dilation=(1, 2, 2), rel_pos_bias=True))
    for part in ("embed_dim=24", "num_heads=3", "head_dim=8", "kernel_size=(3, 5, 5)",
                 "dilation=(1, 2, 2)", "rel_pos_bias=True"):
        assert part in r


@pytest.mark.parametrize("kw, err, match", [
    (dict(embed_dim=30, num_heads=4), ValueError, "divisible"),
    (dict(embed_dim=0), ValueError, "embed_dim"),
    (dict(embed_dim=16.0), ValueError, "embed_dim"),
    (dict(num_heads=0), ValueError, "num_heads"),
    (dict(kernel_size=1), ValueError, "kernel_size"),
    (dict(kernel_size=(3, 3, 3)), ValueError, "kernel_size"),
    (dict(kernel_size=3.0), TypeError, "kernel_size"),
    (dict(dilation=0), ValueError, "dilation"),
    (dict(stride=4), ValueError, "stride"),
    (dict(stride=0), ValueError, "stride"),
    (dict(is_causal=1), TypeError, "is_causal"),
    (dict(rel_pos_bias=True, kernel_size=4), ValueError, "odd kernel_size"),
    (dict(rel_pos_bias=True, stride=2), ValueError, "stride 1"),
    (dict(rel_pos_bias=True, is_causal=True), ValueError, "is_causal=False"),
    (dict(rel_pos_bias=1), TypeError, "rel_pos_bias"),
    (dict(attn_drop=1.5), ValueError, "attn_drop"),
    (dict(proj_drop=-0.1), ValueError, "proj_drop"),
    (dict(qk_scale="x"), TypeError, "qk_scale"),
    (dict(qk_scale=float("nan")), ValueError, "qk_scale must be a finite real number"),
    (dict(qk_scale=True), TypeError, "qk_scale"),
])
def test_bad_arguments(kw, err, match):
    args = dict(embed_dim=16, num_heads=2, kernel_size=3)
    args.update(kw)
    with pytest.raises(err, match=match):
        NeighborhoodAttention2D(**args)


def test_bad_inputs():
    m = NeighborhoodAttention2D(16, 2, 3)
    with pytest.raises(ValueError, match="expects input"):
        m(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="expects input"):
        m(torch.randn(2, 5, 5, 8))
    with pytest.raises(ValueError, match="additional_tokens"):
        m(torch.randn(2, 5, 5, 16), additional_tokens=torch.randn(2, 3, 8))
    with pytest.raises(TypeError, match="1D, NeighborhoodAttention2D"):
        nattn.nn.NeighborhoodAttentionND(16, 2, 3)


def test_dilation_none_means_one():
    """The original NAT code passes dilation=None to its attention layers."""
    a = nattn.nn.NeighborhoodAttention2D(embed_dim=16, num_heads=2, kernel_size=3, dilation=None)
    b = nattn.nn.NeighborhoodAttention2D(embed_dim=16, num_heads=2, kernel_size=3, dilation=1)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 6, 6, 16)
    assert a.dilation == (1, 1)
    torch.testing.assert_close(a(x), b(x))


@pytest.mark.parametrize("kw", [dict(kernel_size=(3, 5), dilation=(2, 1), rpb=True),
                                dict(kernel_size=(4, 3), stride=(2, 1), is_causal=(True, False), extra=True)])
def test_explicit_path_glue_around_the_window_kernels(kw, monkeypatch):
    """The CUDA route of na_explicit (window kernels: fp32 logits, RPB, extra keys, the hook
    on the weights), run here with the kernels' PyTorch twins (nattn.qk_av.na_qk / na_av) in their
    place, equals the gather route."""
    from nattn.nn import unfused

    kw = dict(kw)
    kernel, rpb_on, extra = kw.pop("kernel_size"), kw.pop("rpb", False), kw.pop("extra", False)
    params = NAParams(kernel, kw.get("stride", (1, 1)), kw.get("dilation", (1, 1)), kw.get("is_causal", (False, False)),
                      16 ** -0.5)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 9, 8, 4, 16, generator=g).requires_grad_(True)
    k, v = (torch.randn(2, 9, 8, 2, 16, generator=g).requires_grad_(True) for _ in range(2))
    rpb = torch.randn(4, *(2 * x - 1 for x in kernel), generator=g).requires_grad_(True) if rpb_on else None
    xk, xv = (torch.randn(2, 5, 2, 16, generator=g) for _ in range(2)) if extra else (None, None)
    mask = torch.rand(2, 9, 8, 4, kernel[0] * kernel[1] + (5 if extra else 0), generator=g) > 0.3
    hook = lambda w: w * mask.reshape(w.shape) / 0.7  # noqa: E731
    leaves = [t for t in (q, k, v, rpb) if t is not None]

    def run():
        out = unfused.na_explicit(q, k, v, params, rpb, xk, xv, weights_hook=hook)
        return (out,) + torch.autograd.grad(out.square().sum(), leaves)

    want = run()

    class QK:
        @staticmethod
        def apply(qs, key, p):
            return nattn.qk_av.na_qk(qs, key, p.kernel_size, p.stride, p.dilation, p.is_causal, na_dim=2)

    class AV:
        @staticmethod
        def apply(w, value, p):
            return nattn.qk_av.na_av(w, value, p.kernel_size, p.stride, p.dilation, p.is_causal, na_dim=2)

    monkeypatch.setattr(unfused, "_window_kernels", lambda q, v, na_dim: True)
    monkeypatch.setattr(unfused, "KernelQK", QK)
    monkeypatch.setattr(unfused, "KernelAV", AV)
    got = run()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
