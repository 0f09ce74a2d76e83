"""The CPU scratch buffers (nattn/backends/scratch.py) and the tiled backend's use of them:
results never alias a buffer that the next call overwrites."""

import threading

import pytest
import torch

import nattn
from nattn.backends import scratch


@pytest.fixture(autouse=True)
def _fresh_buffers():
    scratch.release()
    yield
    scratch.release()


def test_a_name_is_reused_and_grown():
    a = scratch.take("x", (3, 4), torch.float32, torch.device("cpu"))
    b = scratch.take("x", (2, 5), torch.float32, torch.device("cpu"))
    assert a.shape == (3, 4) and b.shape == (2, 5)
    assert b.data_ptr() == a.data_ptr()  # the same memory, a smaller view
    assert scratch.held_bytes() == 12 * 4
    c = scratch.take("x", (5, 5), torch.float32, torch.device("cpu"))
    assert c.shape == (5, 5) and scratch.held_bytes() == 25 * 4
    d = scratch.take("x", (2, 2), torch.float64, torch.device("cpu"))  # another dtype: its own buffer
    assert d.dtype == torch.float64 and scratch.held_bytes() == 25 * 4 + 4 * 8
    scratch.release()
    assert scratch.held_bytes() == 0


def test_requests_beyond_the_limit_are_not_kept(monkeypatch):
    monkeypatch.setattr(scratch, "LIMIT_BYTES", 700)
    small = scratch.take("a", (100,), torch.float32, torch.device("cpu"))
    big = scratch.take("b", (100,), torch.float32, torch.device("cpu"))  # 400 + 400 bytes > 700
    assert scratch.held_bytes() == 400
    assert scratch.take("b", (100,), torch.float32, torch.device("cpu")).data_ptr() != big.data_ptr()
    assert scratch.take("a", (50,), torch.float32, torch.device("cpu")).data_ptr() == small.data_ptr()


def test_other_devices_get_fresh_tensors():
    t = scratch.take("x", (4,), torch.float32, torch.device("meta"))
    assert t.device.type == "meta" and scratch.held_bytes() == 0


def test_buffers_are_per_thread():
    mine = scratch.take("x", (8,), torch.float32, torch.device("cpu"))
    seen = {}

    def other():
        seen["ptr"] = scratch.take("x", (8,), torch.float32, torch.device("cpu")).data_ptr()
        seen["held"] = scratch.held_bytes()
        scratch.release()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["ptr"] != mine.data_ptr() and seen["held"] == 32
    assert scratch.held_bytes() == 32  # this thread's buffer is untouched


@pytest.mark.parametrize("dilation", [1, 2])
def test_tiled_results_survive_the_next_call(dilation):
    """Outputs, LSE and gradients of one call are unchanged by a second call with other
    inputs of the same shape (which reuses every scratch buffer)."""
    g = torch.Generator().manual_seed(0)

    def run():
        q, k, v = (torch.randn(2, 13, 11, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
                   for _ in range(3))
        rpb = torch.randn(4, 9, 9, generator=g, dtype=torch.float64, requires_grad=True)
        out, lse = nattn.na2d(q, k, v, 5, dilation=dilation, rpb=rpb, backend="tiled", return_lse=True)
        (out.sum() + lse.sum()).backward()
        return [out.detach(), lse.detach(), q.grad, k.grad, v.grad, rpb.grad]

    first = run()
    copies = [x.clone() for x in first]
    second = run()
    assert scratch.held_bytes() > 0  # the buffers were in use
    for kept, live, other in zip(copies, first, second):
        assert torch.equal(kept, live) and not torch.equal(live, other)


@pytest.mark.parametrize("small_product", [0, 1 << 62])
def test_tiled_under_torch_func_grad(small_product, monkeypatch):
    """functorch's transforms: no scratch buffers and no out= products on its wrappers, in
    either way of running the heads; gradients equal autograd's."""
    from nattn.backends import tiled_rows
    monkeypatch.setattr(tiled_rows, "SMALL_PRODUCT", small_product)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 9, 10, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = k[..., :2, :], v[..., :2, :]  # GQA

    def loss(q, k, v):
        return nattn.na2d(q, k, v, 5, backend="tiled").square().sum()

    got = torch.func.grad(loss, argnums=(0, 1, 2))(q, k, v)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want = torch.autograd.grad(loss(*leaves), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
