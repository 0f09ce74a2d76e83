"""nattn.compat: NATTEN 0.14-0.17 op names (heads-first) and module signatures, checked
against the fused ops."""


import math

import pytest
import torch
import torch.nn.functional as F

import nattn
from nattn import compat


def _r(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


def _fused_heads_first(q, k, v, kernel, dilation, scale, rpb, na_dim):
    """The fused op on heads-first tensors (permuted in and out)."""
    out = nattn.neighborhood_attention(
        q.movedim(1, -2), k.movedim(1, -2), v.movedim(1, -2), kernel, dilation=dilation,
        scale=scale, rpb=rpb, backend="reference", na_dim=na_dim)
    return out.movedim(-2, 1)


# (na_dim, spatial, old positional window args, per-axis kernel, per-axis dilation)
OPS = [
    (1, (15,), (5, 2), (5,), (2,)),
    (1, (9,), (3, None), (3,), (1,)),
    (2, (9, 8), (3, 2), (3, 3), (2, 2)),
    (2, (7, 7), (5, 1), (5, 5), (1, 1)),
    (3, (7, 5, 6), (3, 5, 2, 1), (3, 5, 5), (2, 1, 1)),
    (3, (4, 7, 8), (3, 3, 1, 2), (3, 3, 3), (1, 2, 2)),
]
QKRPB = {1: compat.natten1dqkrpb, 2: compat.natten2dqkrpb, 3: compat.natten3dqkrpb}
QK = {1: compat.natten1dqk, 2: compat.natten2dqk, 3: compat.natten3dqk}
AV = {1: compat.natten1dav, 2: compat.natten2dav, 3: compat.natten3dav}


@pytest.mark.parametrize("with_rpb", [True, False])
@pytest.mark.parametrize("case", OPS, ids=str)
def test_old_ops_equal_fused_values_and_grads(case, with_rpb):
    na_dim, spatial, old_args, kernel, dilation = case
    heads, scale = 2, 0.3 + torch.rand(()).item()
    q, k, v = _r(2, heads, *spatial, 4), _r(2, heads, *spatial, 4), _r(2, heads, *spatial, 3)
    rpb = _r(heads, *(2 * x - 1 for x in kernel)) if with_rpb else None
    if with_rpb:
        logits = QKRPB[na_dim](q * scale, k, rpb, *old_args)
    else:
        logits = QK[na_dim](q * scale, k, *old_args)
    assert logits.shape == (2, heads, *spatial, torch.Size(kernel).numel())
    out = AV[na_dim](logits.softmax(-1), v, *old_args)
    ref = _fused_heads_first(q, k, v, kernel, dilation, scale, rpb, na_dim)
    assert out.shape == (2, heads, *spatial, 3) and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    leaves = [t for t in (q, k, v, rpb) if t is not None]
    grad_out = torch.randn_like(out)
    for g, w in zip(torch.autograd.grad(out, leaves, grad_out), torch.autograd.grad(ref, leaves, grad_out)):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


def test_old_ops_reject_heads_last_rank():
    with pytest.raises(ValueError, match=r"query must be heads-first \[B, H, X, Y, \.\.\.\] of rank 5"):
        compat.natten2dqkrpb(_r(2, 9, 9, 4, grad=False), _r(2, 9, 9, 4, grad=False), None, 3, 1)
    with pytest.raises(TypeError, match="attn must be a torch.Tensor"):
        compat.natten1dav([1.0], _r(2, 2, 9, 4, grad=False), 3, 1)


def _old_forward(m, x, kernel, dilation, na_dim):
    """NATTEN 0.14's forward, written out with the compat ops (heads-first, scaled query)."""
    b, c, h = x.shape[0], x.shape[-1], m.num_heads
    qkv = F.linear(x, m.qkv.weight, m.qkv.bias).reshape(*x.shape[:-1], 3, h, c // h)
    qkv = qkv.movedim(-3, 0).movedim(-2, 2)  # [3, B, H, *spatial, D]
    q, k, v = qkv[0] * m.scale, qkv[1], qkv[2]
    if na_dim == 3:
        window = (kernel[0], kernel[1], dilation[0], dilation[1])
    else:
        window = (kernel, dilation)
    attn = QKRPB[na_dim](q, k, m.rpb, *window).softmax(-1)
    out = AV[na_dim](attn, v, *window).movedim(1, -2).reshape(*x.shape)
    return F.linear(out, m.proj.weight, m.proj.bias)


@pytest.mark.parametrize("na_dim", [1, 2, 3])
def test_old_modules_positional_order_rpb_default_and_parity(na_dim):
    spatial = {1: (14,), 2: (9, 10), 3: (6, 7, 7)}[na_dim]
    if na_dim == 3:  # (dim, num_heads, kernel_size, kernel_size_d, dilation, dilation_d)
        m = compat.NeighborhoodAttention3D(12, 3, 3, 5, None, 1).double()
        kernel, dilation = (5, 3), (1, 1)
        assert m.kernel_size == (5, 3, 3) and m.dilation == (1, 1, 1)
    else:  # (dim, num_heads, kernel_size, dilation)
        cls = {1: compat.NeighborhoodAttention1D, 2: compat.NeighborhoodAttention2D}[na_dim]
        m = cls(12, 3, 3, 2).double()
        kernel, dilation = 3, 2
        assert m.kernel_size == (3,) * na_dim and m.dilation == (2,) * na_dim
    assert m.num_heads == 3 and m.embed_dim == 12 and m.stride == (1,) * na_dim
    assert m.rpb is not None and m.rpb.shape[0] == 3  # bias=True by default
    assert sorted(m.state_dict()) == ["proj.bias", "proj.weight", "qkv.bias", "qkv.weight", "rpb"]
    x = _r(2, *spatial, 12)
    y = m(x)
    ref = _old_forward(m, x, kernel, dilation, na_dim)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)
    gy = torch.randn_like(y)
    params = [x, m.rpb, m.qkv.weight]
    for g, w in zip(torch.autograd.grad(y, params, gy), torch.autograd.grad(ref, params, gy)):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


def test_old_module_keywords_small_input_and_checkpoint_load():
    m = compat.NeighborhoodAttention2D(dim=8, num_heads=2, kernel_size=5, dilation=None, bias=False,
                                       qkv_bias=False, qk_scale=0.0).double().eval()
    assert m.rpb is None and m.qkv.bias is None and m.dilation == (1, 1)
    assert m.scale == pytest.approx(4 ** -0.5)  # NATTEN's `qk_scale or head_dim ** -0.5`
    x = _r(1, 3, 4, 8, grad=False)  # smaller than the kernel: padded and cropped
    assert m(x).shape == x.shape and torch.isfinite(m(x)).all()
    old = {"qkv.weight": torch.randn(48, 16), "qkv.bias": torch.randn(48), "rpb": torch.randn(4, 13, 13),
           "proj.weight": torch.randn(16, 16), "proj.bias": torch.randn(16)}
    m2 = compat.NeighborhoodAttention2D(16, 4, 7)
    m2.load_state_dict(old)  # strict: exactly these keys and shapes
    torch.testing.assert_close(m2.rpb.detach(), old["rpb"], rtol=0, atol=0)


def test_old_module_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"bias=True \(relative positional bias\) requires odd kernel_size"):
        compat.NeighborhoodAttention2D(8, 2, 4)
    with pytest.raises(TypeError, match="bias .* must be a bool"):
        compat.NeighborhoodAttention1D(8, 2, 3, 1, "yes")
    compat.NeighborhoodAttention2D(8, 2, 4, bias=False)  # even kernels are fine without RPB


# ------------------------------------------------------------------ NATTEN 0.17's names
QK17 = {1: compat.functional.na1d_qk, 2: compat.functional.na2d_qk, 3: compat.functional.na3d_qk}
AV17 = {1: compat.functional.na1d_av, 2: compat.functional.na2d_av, 3: compat.functional.na3d_av}
FUSED17 = {1: compat.functional.na1d, 2: compat.functional.na2d, 3: compat.functional.na3d}
CASES17 = [  # (spatial, kernel, dilation, causal, extra, rpb)
    ((13,), (5,), (2,), (False,), 3, True),
    ((11,), (4,), (1,), (True,), 0, False),
    ((9, 11), (3, 5), (2, 1), (False, False), 2, True),
    ((8, 9), (4, 3), (1, 2), (True, False), 4, False),
    ((5, 6, 7), (3, 3, 5), (1, 2, 1), (False, False, False), 1, True),
    ((4, 5, 6), (2, 3, 4), (1, 1, 1), (True, True, False), 0, False),
]


@pytest.mark.parametrize("case", CASES17, ids=str)
def test_natten017_unfused_ops_compose_to_the_fused_op(case):
    """na{1,2,3}d_qk -> softmax -> na{1,2,3}d_av, heads-first with extra keys/values, equals
    nattn's fused op (values and gradients), and 0.17's fused op takes dilation fifth."""
    spatial, kernel, dilation, causal, extra, with_rpb = case
    n = len(spatial)
    torch.manual_seed(len(spatial) * 10 + extra)

    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    q, k, v = r(2, 3, *spatial, 4), r(2, 3, *spatial, 4), r(2, 3, *spatial, 5)
    ek, ev = (r(2, 3, extra, 4), r(2, 3, extra, 5)) if extra else (None, None)
    rpb = r(3, *(2 * x - 1 for x in kernel)) if with_rpb else None
    scale = 0.37
    logits = QK17[n](q * scale, k, kernel, dilation, additional_keys=ek, is_causal=causal, rpb=rpb)
    assert logits.shape == (2, 3, *spatial, math.prod(kernel) + extra)
    out = AV17[n](logits.softmax(-1), v, kernel, dilation, additional_values=ev, is_causal=causal)
    last = lambda t: None if t is None else t.movedim(1, -2)  # noqa: E731
    ref = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}[n](last(q), last(k), last(v), kernel, dilation=dilation, is_causal=causal,
                                                       scale=scale, rpb=rpb,
                                                       additional_keys=None if ek is None else ek.movedim(1, 2),
                                                       additional_values=None if ev is None else ev.movedim(1, 2)
                                                       ).movedim(-2, 1)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    leaves = [t for t in (q, k, v, ek, ev, rpb) if t is not None]
    go = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, leaves, go), torch.autograd.grad(ref, leaves, go)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    with_bias = {1: compat.functional.na1d_qk_with_bias, 2: compat.functional.na2d_qk_with_bias,
                 3: compat.functional.na3d_qk_with_bias}[n]
    if not any(causal):  # 0.15/0.16's name: the same logits
        torch.testing.assert_close(with_bias(q * scale, k, rpb, kernel, dilation, ek), logits, rtol=0, atol=0)
    fused17 = FUSED17[n](last(q), last(k), last(v), kernel, dilation, causal, rpb, scale,
                         None if ek is None else ek.movedim(1, 2), None if ev is None else ev.movedim(1, 2))
    torch.testing.assert_close(fused17.movedim(-2, 1), ref, rtol=0, atol=0)


def test_natten017_functional_errors_and_alias():
    q = torch.randn(1, 2, 8, 8, 4)
    with pytest.raises(ValueError, match="heads-first"):
        compat.functional.na2d_qk(q[0], q[0], 3)
    with pytest.raises(ValueError, match=r"additional_keys must be \[B, H, E, D\]"):
        compat.functional.na2d_qk(q, q, 3, additional_keys=torch.randn(1, 3, 2, 4))
    with pytest.raises(ValueError, match="xformers_kwargs"):
        compat.functional.na2d(q.movedim(1, -2), q.movedim(1, -2), q.movedim(1, -2), 3, xformers_kwargs={"a": 1})
    compat.install_natten_alias()
    try:
        import natten.functional as nf
        assert nf.na2d_qk is compat.functional.na2d_qk and nf.natten2dqkrpb is compat.functional.natten2dqkrpb
    finally:
        compat.uninstall_natten_alias()


def test_natten017_module_keywords():
    """rel_pos_bias= and is_causal= (NATTEN 0.16/0.17) beside 0.14's bias=; 3-D tuples."""
    m = compat.NeighborhoodAttention2D(16, 2, 3, rel_pos_bias=False, is_causal=(True, False))
    assert m.rpb is None and m.is_causal == (True, False)
    assert compat.NeighborhoodAttention2D(16, 2, 3, rel_pos_bias=True).rpb.shape == (2, 5, 5)
    assert compat.NeighborhoodAttention2D(16, 2, 3).rpb is not None  # 0.14's default: on
    m3 = compat.NeighborhoodAttention3D(16, 2, (3, 5, 5), dilation=(1, 2, 1), rel_pos_bias=True)
    assert m3.kernel_size == (3, 5, 5) and m3.dilation == (1, 2, 1) and m3.rpb.shape == (2, 5, 9, 9)
    with pytest.raises(TypeError, match="either bias"):
        compat.NeighborhoodAttention2D(16, 2, 3, bias=True, rel_pos_bias=True)
    with pytest.raises(TypeError, match="rel_pos_bias must be a bool"):
        compat.NeighborhoodAttention2D(16, 2, 3, rel_pos_bias=1)
    with pytest.raises(TypeError, match="kernel_size_d"):
        compat.NeighborhoodAttention3D(16, 2, (3, 3, 3), kernel_size_d=5)
    x = torch.randn(2, 6, 7, 16)
    torch.testing.assert_close(m(x), m(x))
