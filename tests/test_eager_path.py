"""The eager fast path (nattn/_eager.py): plain eager calls skip the custom ops, and give the
same outputs and gradients; anything observing the op still goes through them."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import nattn
from nattn import _eager, ops


def _inputs(seed, rpb=True):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 7, 6, 4, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(4, 9, 9, generator=g, dtype=torch.float64, requires_grad=True) if rpb else None
    return q, k, v, bias


def _grads(fn, q, k, v, bias, use):
    out, lse = fn(q, k, v, bias)
    w_out, w_lse = torch.randn_like(out), torch.randn_like(lse)
    loss = {"out": (out * w_out).sum(), "lse": (lse * w_lse).sum(),
            "both": (out * w_out).sum() + (lse * w_lse).sum()}[use]
    leaves = [t for t in (q, k, v, bias) if t is not None]
    return (out, lse) + torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("use", ["out", "lse", "both"])
def test_eager_matches_custom_op(use):
    seed = torch.randint(0, 2**31, ()).item()
    q, k, v, bias = _inputs(seed)

    def eager(q, k, v, bias):
        return nattn.na2d(q, k, v, 5, dilation=(1, 1), rpb=bias, return_lse=True)

    def custom(q, k, v, bias):
        return ops.na_forward(q, k, v, bias, [5, 5], [1, 1], [1, 1], [0, 0], 8 ** -0.5, "reference")

    torch.manual_seed(seed)
    a = _grads(eager, q, k, v, bias, use)
    torch.manual_seed(seed)
    b = _grads(custom, q, k, v, bias, use)
    for x, y in zip(a, b):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_plain_eager_calls_skip_the_custom_op(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the custom op ran on the eager path")

    monkeypatch.setattr(ops, "na_forward", fail)
    q, k, v, _ = _inputs(0, rpb=False)
    nattn.na2d(q, k, v, 3).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_observers_get_the_custom_op():
    q, k, v, _ = _inputs(1, rpb=False)
    assert _eager.eager_ok(q, k, v, None)
    with FlopCounterMode(display=False) as counter:
        assert not _eager.eager_ok(q, k, v, None)
        nattn.na2d(q, k, v, 3)
    assert counter.get_total_flops() > 0  # the counter saw nattn::na_forward
    traced = torch.jit.trace(lambda q, k, v: nattn.na2d(q, k, v, 3), (q.detach(), k.detach(), v.detach()),
                             check_trace=False)
    assert "nattn::na_forward" in str(traced.graph)


def test_extra_keys_eager_matches_custom_op():
    g = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    q, k, v = (torch.randn(1, 6, 5, 2, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ek, ev = (torch.randn(1, 3, 2, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = nattn.na2d(q, k, v, 3, additional_keys=ek, additional_values=ev)
    grads = torch.autograd.grad(out.square().sum(), (q, ek))
    with FlopCounterMode(display=False):  # forces the custom-op path
        out2 = nattn.na2d(q, k, v, 3, additional_keys=ek, additional_values=ev)
        grads2 = torch.autograd.grad(out2.square().sum(), (q, ek))
    torch.testing.assert_close(out, out2, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, grads2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_a_torch_without_the_probes_takes_the_custom_op(monkeypatch):
    q, k, v, _ = _inputs(2, rpb=False)
    monkeypatch.setattr(_eager, "_function_modes", _eager._probe("_no_such_torch_function"))
    assert not _eager.eager_ok(q, k, v, None)
    out = nattn.na2d(q, k, v, 3)  # still correct, through the custom op
    with FlopCounterMode(display=False):
        ref = nattn.na2d(q, k, v, 3)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_torch_func_grad_matches_autograd():
    q, k, v, bias = _inputs(torch.randint(0, 2**31, ()).item())
    w = torch.randn(2, 7, 6, 4, 8, dtype=torch.float64)

    def loss(q, k, v, bias):
        out, lse = nattn.na2d(q, k, v, 5, rpb=bias, return_lse=True)
        return (out * w).sum() + lse.sum()

    got = torch.func.grad(loss, argnums=(0, 1, 2, 3))(q.detach(), k.detach(), v.detach(), bias.detach())
    want = torch.autograd.grad(loss(q, k, v, bias), (q, k, v, bias))
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_double_backward_raises_instead_of_dropping_terms():
    q, k, v, _ = _inputs(4, rpb=False)
    out = nattn.na2d(q, k, v, 3)
    (g,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    assert g.requires_grad  # behind an error node, as on the custom-op path
    with pytest.raises(RuntimeError, match="no double backward"):
        g.sum().backward()
    # first-order use of create_graph=True stays correct
    torch.testing.assert_close(g.detach(), torch.autograd.grad(nattn.na2d(q, k, v, 3).square().sum(), q)[0])


def test_autocast_does_not_reach_the_backends():
    q, k, v, bias = _inputs(5)
    q, k, v, bias = (t.detach().float().requires_grad_() for t in (q, k, v, bias))
    ref = nattn.na2d(q, k, v, 5, rpb=bias)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = nattn.na2d(q, k, v, 5, rpb=bias)  # eager path: same numbers as without autocast
        (g,) = torch.autograd.grad(out.square().sum(), q)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=0, atol=0)


def test_plain_calls_use_the_function_without_setup_context(monkeypatch):
    """Eager calls go through NAFunctionFast (no per-call argument binding); functorch
    transforms through NAFunction, whose separate setup_context they need. Both give the same
    gradients (the backward is shared)."""
    from nattn import _eager, functional

    used = []

    def spy():
        cls = _eager.na_function()
        used.append(cls.__name__)
        return cls

    monkeypatch.setattr(functional, "na_function", spy)
    q, k, v, _ = _inputs(5, rpb=False)
    want = torch.autograd.grad(nattn.na2d(q, k, v, 5).sum(), q)[0]
    got = torch.func.grad(lambda q: nattn.na2d(q, k.detach(), v.detach(), 5).sum())(q.detach())
    assert used == ["NAFunctionFast", "NAFunction"]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_calls_that_record_no_graph_skip_the_function(monkeypatch):
    """Inference calls (grad mode off, or no input that requires grad) call the backend's
    forward directly, without an autograd Function, and give the Function's results; calls
    that need a graph still go through it, autocast stays off for the backend either way."""
    from nattn import functional

    used = []

    def spy():
        used.append("function")
        return _eager.na_function()

    monkeypatch.setattr(functional, "na_function", spy)
    q, k, v, bias = _inputs(torch.randint(0, 2**31, ()).item())
    want = nattn.na2d(q, k, v, 5, rpb=bias, return_lse=True)
    assert used == ["function"] and want[0].grad_fn is not None
    with torch.no_grad():
        got = nattn.na2d(q, k, v, 5, rpb=bias, return_lse=True)
    plain = nattn.na2d(q.detach(), k.detach(), v.detach(), 5, rpb=bias.detach(), return_lse=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = nattn.na2d(q.detach(), k.detach(), v.detach(), 5, rpb=bias.detach(), return_lse=True)
    assert used == ["function"], "no-graph calls went through the autograd Function"
    for out in (got, plain, cast):
        assert out[0].grad_fn is None and not out[0].requires_grad and out[0].dtype == torch.float64
        for x, y in zip(out, want):
            torch.testing.assert_close(x, y.detach(), rtol=0, atol=0)


def test_autocast_is_disabled_only_around_backends_that_recast():
    """The reference runs torch matmuls (autocast must not recast them: its region is turned
    off around the call); the cuda backend runs none and skips the region."""
    from nattn.backends import BACKENDS

    q = torch.randn(1, 4, 2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _eager._no_autocast(q, BACKENDS["cuda"]) is _eager._NULL
        with _eager._no_autocast(q, BACKENDS["reference"]):
            assert not torch.is_autocast_enabled("cpu")
        assert torch.is_autocast_enabled("cpu")
        out = nattn.na1d(q, q, q, 3, backend="reference")
    assert out.dtype == torch.float32  # the inputs' dtype, not autocast's
    assert BACKENDS["cuda"].configured("kv=2").autocast_neutral
