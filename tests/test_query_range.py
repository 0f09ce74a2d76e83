"""The forward's query range (ABI 5, nattn.distributed's halo ranks): the problem struct's
packing and its checks, and the contract the halo relies on, run on the CPU with a stand-in
for the cuda backend that honours the range as the Hopper kernels do (rows outside it: output
0, LSE +inf) on top of the reference backend: the unchanged backward must then give the
range's outputs, and every input's gradient, exactly as NA on the whole region does."""

import math
import random

import pytest
import torch

from nattn._eager import NAFunction
from nattn.backends import BACKENDS
from nattn.backends.cuda import _QUERY_RANGE_SLOT, _set_query_range
from nattn.backends.reference import ReferenceBackend
from nattn._cuda import kernel_table
from nattn.distributed import halo
from nattn.params import NAParams


def test_query_range_is_the_last_abi_field():
    assert kernel_table.ABI_VERSION == 5
    assert _QUERY_RANGE_SLOT + 6 == kernel_table.NUM_PROBLEM_FIELDS
    assert kernel_table.ABI_PROBLEM_FIELDS[4] == _QUERY_RANGE_SLOT  # an ABI 4 library reads the prefix


def test_set_query_range_packs_lo_then_hi_and_checks_bounds():
    fields = [0] * kernel_table.NUM_PROBLEM_FIELDS
    _set_query_range(fields, ((2, 7), (0, 9)), (10, 9))
    assert fields[_QUERY_RANGE_SLOT:] == [2, 0, 0, 7, 9, 0]
    for bad in (((3, 3), (0, 9)), ((0, 11), (0, 9)), ((-1, 4), (0, 9)), ((0, 4),)):
        with pytest.raises(ValueError, match="query_range must hold one"):
            _set_query_range(fields, bad, (10, 9))


class RangedReference(ReferenceBackend):
    """The reference backend, honouring query_range as the Hopper forward does: rows outside
    the range (a whole box's worth is allowed, here: exactly the range) read output 0 and
    LSE +inf."""

    name = "cuda"

    def __init__(self):
        super().__init__()
        self.ranges, self.backward_ranges = [], []

    def na_forward(self, q, k, v, rpb, params, config=None, rng=None, query_range=None):
        out, lse = super().na_forward(q, k, v, rpb, params)
        if query_range is None:
            return out, lse
        self.ranges.append(tuple(query_range))
        keep = torch.ones(q.shape[1 : 1 + params.na_dim], dtype=torch.bool)
        for a, (lo, hi) in enumerate(query_range):
            idx = torch.arange(q.shape[1 + a])
            shape = [1] * params.na_dim
            shape[a] = -1
            keep &= ((idx >= lo) & (idx < hi)).view(shape)
        keep = keep.view(1, *keep.shape, 1)
        return out * keep.unsqueeze(-1), torch.where(keep, lse, torch.full_like(lse, math.inf))

    def na_backward(self, *args, query_range=None, **kwargs):
        self.backward_ranges.append(None if query_range is None else tuple(query_range))
        return super().na_backward(*args, **kwargs)


@pytest.mark.parametrize("seed", range(6))
def test_ranged_forward_and_backward_equal_the_whole_region(seed, monkeypatch):
    rng = random.Random(seed)
    na_dim = 1 + seed % 3
    spatial = tuple(rng.randint(6, 11) for _ in range(na_dim))
    kernel = tuple(rng.randint(2, 4) for _ in range(na_dim))
    dilation = tuple(rng.choice([1, 1, 2]) if spatial[a] >= 2 * kernel[a] else 1 for a in range(na_dim))
    stride = tuple(rng.randint(1, k) for k in kernel)
    causal = tuple(rng.random() < 0.3 for _ in range(na_dim))
    heads, heads_kv = rng.choice([(2, 2), (4, 2), (3, 1)])
    q = torch.randn(2, *spatial, heads, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, *spatial, heads_kv, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, *spatial, heads_kv, 8, dtype=torch.float64, requires_grad=True)
    rpb = None
    if not any(causal) and rng.random() < 0.5:
        rpb = torch.randn(heads, *[2 * kk - 1 for kk in kernel], dtype=torch.float64, requires_grad=True)
    axis = rng.randrange(na_dim)
    lo = rng.randrange(spatial[axis])
    hi = rng.randint(lo + 1, spatial[axis])
    query_range = tuple((lo, hi) if a == axis else (0, spatial[a]) for a in range(na_dim))
    params = NAParams(kernel, stride, dilation, causal, 8 ** -0.5)
    fake = RangedReference()
    monkeypatch.setitem(BACKENDS, "cuda", fake)
    inputs = (q, k, v) + ((rpb,) if rpb is not None else ())

    def sliced(t):
        return t.narrow(1 + axis, lo, hi - lo)

    out_r, lse_r = halo._RangedNA.apply(q, k, v, rpb, params, "cuda", query_range)
    assert fake.ranges == [query_range]
    g_out = torch.randn_like(sliced(out_r))
    g_lse = torch.randn_like(sliced(lse_r))
    grads_r = torch.autograd.grad([sliced(out_r), sliced(lse_r)], inputs, [g_out, g_lse])
    assert fake.backward_ranges == [query_range]
    out_f, lse_f = NAFunction.apply(q, k, v, rpb, params, "reference")  # the whole region
    grads_f = torch.autograd.grad([sliced(out_f), sliced(lse_f)], inputs, [g_out, g_lse])
    torch.testing.assert_close(sliced(out_r), sliced(out_f))
    torch.testing.assert_close(sliced(lse_r), sliced(lse_f))
    for got, want in zip(grads_r, grads_f):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want)
