"""The custom ops' autograd kernel (nattn/ops.py, ``_autograd_kernel``): a call that records
no gradient on plain tensors runs the implementation directly (no redispatch below
autograd: compiled graphs call the ops that way), anything that traces or observes the op
(fake tensors, dispatch modes) and any call that records a gradient takes torch's path, and
both give the reference's values."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from nattn import ops


@pytest.fixture
def redispatches(monkeypatch):
    """The number of times any op was redispatched from Python (torch's autograd kernel
    redispatches below autograd for a call that records no gradient)."""
    count = [0]
    original = torch._ops.OpOverload.redispatch

    def counted(self, *args, **kwargs):
        count[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch._ops.OpOverload, "redispatch", counted)
    return count


def _qkv(seed, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 6, 5, 3, 2, 8, generator=g, dtype=torch.float64, requires_grad=requires_grad)


def _call(qkv):
    return ops.na_qkv_forward(qkv, None, [3, 3], [1, 1], [1, 1], [0, 0], 8 ** -0.5, "reference")


def _reference(qkv):
    return ops._na_qkv_forward_impl(qkv.detach(), None, [3, 3], [1, 1], [1, 1], [0, 0], 8 ** -0.5, "reference")


def test_no_grad_call_runs_directly(redispatches):
    qkv = _qkv(torch.randint(0, 2**31, ()).item())
    with torch.no_grad():
        out, lse = _call(qkv)
    assert redispatches[0] == 0
    ref_out, ref_lse = _reference(qkv)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    # grad mode on, no input requiring a gradient: no graph either, same shortcut
    out2, _ = _call(qkv)
    assert redispatches[0] == 0 and out2.grad_fn is None and torch.equal(out2, ref_out)


def test_grad_call_records_the_graph(redispatches):
    qkv = _qkv(torch.randint(0, 2**31, ()).item(), requires_grad=True)
    out, lse = _call(qkv)
    assert out.grad_fn is not None and redispatches[0] == 1  # torch's Function, below autograd once
    (dqkv,) = torch.autograd.grad((out * out).sum(), qkv)
    ref = qkv.detach().clone().requires_grad_(True)
    q, k, v = ref.unbind(-3)
    from nattn.backends import get as get_backend
    from nattn.ops import _params
    r_out, _ = get_backend("reference").na_forward(q, k, v, None, _params([3, 3], [1, 1], [1, 1], [0, 0], 8 ** -0.5))
    (r_dqkv,) = torch.autograd.grad((r_out * r_out).sum(), ref)
    assert not torch.isnan(dqkv).any()
    torch.testing.assert_close(dqkv, r_dqkv, rtol=1e-10, atol=1e-12)


def test_fake_tensors_and_modes_take_torchs_path(redispatches):
    qkv = _qkv(torch.randint(0, 2**31, ()).item())
    with FakeTensorMode() as mode, torch.no_grad():
        out, lse = _call(mode.from_tensor(qkv))
    assert redispatches[0] == 1 and out.shape == (2, 6, 5, 2, 8) and lse.shape == (2, 6, 5, 2)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        _call(qkv)
    assert redispatches[0] == 2 and counter.get_total_flops() > 0


def test_params_cache_keeps_arguments_apart():
    a = ops._params([3, 3], [1, 1], [1, 1], [0, 1], 0.5)
    b = ops._params([3, 3], [1, 1], [1, 1], [1, 0], 0.5)
    c = ops._params([3, 3], [1, 1], [1, 1], [0, 1], 0.25)
    assert a is ops._params([3, 3], [1, 1], [1, 1], [False, True], 0.5)
    assert a.is_causal == (False, True) and b.is_causal == (True, False) and c.scale == 0.25 and a.scale == 0.5
    assert ops._params([5], [2], [3], [0], 1.0).kernel_size == (5,) and ops._params([5], [2], [3], [0], 1.0).stride == (2,)
