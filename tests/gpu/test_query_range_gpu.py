"""GPU tier: the Hopper forward's query range (nattn.distributed's halo ranks compute only
their own queries). On fresh random problems the sm90 forward is forced (NATTN_FAMILY=sm90)
with a random range per axis: the range's rows must equal the whole problem's bit for bit
(the same boxes compute them), every other row is either computed the same way or left as
the backend filled it (output 0, LSE +inf), and the backward through the halo's Function
(the range in the backward too) gives the gradients of NA on the whole problem, gradients
only on the range's rows, up to the order of the fp32 sums."""

import dataclasses
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from nattn._eager import NAFunction  # noqa: E402
from nattn.backends import get as get_backend  # noqa: E402
from nattn.distributed.halo import _RangedNA  # noqa: E402
from nattn.params import NAParams  # noqa: E402
from gpu_cases import make_inputs, rel_err  # noqa: E402
from sm90_cases import SQUARE_PAIR, fits_wide_rpb, sm90_sweep, square_sweep  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)

CASES = [dataclasses.replace(c, extra=0) for c in sm90_sweep(int(os.environ.get("NATTN_QRANGE_CASES", "150")), seed=4343)]
# head dim 256: the backward's wide passes (backward_wide.cuh) walk the range too
CASES += [fits_wide_rpb(dataclasses.replace(c, extra=0)) for c in sm90_sweep(40, seed=4344, dims=(256,))]


ORDER_TOL = {torch.float16: 1e-4, torch.bfloat16: 8e-4}  # summation order only (16-bit ulps)


def params_of(case):
    return NAParams(case.kernel, case.stride, case.dilation, case.causal,
                    case.scale if case.scale is not None else case.dim ** -0.5)


def random_range(case, rng):
    out = []
    for n in case.spatial:
        lo = rng.randrange(n)
        out.append((lo, rng.randint(lo + 1, n)) if rng.random() < 0.7 else (0, n))
    return tuple(out)


def in_range_mask(case, query_range):
    keep = torch.ones(case.spatial, dtype=torch.bool, device="cuda")
    for a, (lo, hi) in enumerate(query_range):
        idx = torch.arange(case.spatial[a], device="cuda")
        shape = [1] * len(case.spatial)
        shape[a] = -1
        keep &= ((idx >= lo) & (idx < hi)).view(shape)
    return keep.view(1, *case.spatial, 1)


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c}" for i, c in enumerate(CASES)])
def test_sm90_query_range(case, monkeypatch):
    monkeypatch.setenv("NATTN_FAMILY", "sm90")  # a forward sm90 declines is an error (read per call)
    rng = random.Random(case.seed)
    query_range = random_range(case, rng)
    t, _ = make_inputs(case)
    q, k, v = (t[n].detach().requires_grad_() for n in ("query", "key", "value"))
    rpb = t["rpb"].detach().requires_grad_() if "rpb" in t else None
    params = params_of(case)
    impl = get_backend("cuda")
    with torch.no_grad():
        out_r, lse_r = impl.na_forward(q, k, v, rpb, params, query_range=query_range)
        out_f, lse_f = impl.na_forward(q, k, v, rpb, params)
    keep = in_range_mask(case, query_range)
    assert torch.equal(torch.where(keep.unsqueeze(-1), out_r, out_f), out_f), "range rows differ from the whole problem"
    assert torch.equal(torch.where(keep, lse_r, lse_f), lse_f)
    left = ~keep.expand_as(lse_r) & (lse_r != lse_f)  # rows the kernels did not compute
    assert torch.isinf(lse_r[left]).all() and (lse_r[left] > 0).all()
    assert (out_r[left.unsqueeze(-1).expand_as(out_r)] == 0).all()
    # backward: gradients only through the range's rows, against NA on the whole problem
    g = torch.Generator(device="cuda").manual_seed(case.seed + 1)
    g_out = torch.randn(out_f.shape, generator=g, device="cuda").to(out_f.dtype) * keep.unsqueeze(-1)
    g_lse = torch.randn(lse_f.shape, generator=g, device="cuda") * keep
    inputs = (q, k, v) + ((rpb,) if rpb is not None else ())
    o1, l1 = _RangedNA.apply(q, k, v, rpb, params, "cuda", query_range)
    got = torch.autograd.grad([o1, l1], inputs, [g_out, g_lse])
    o2, l2 = NAFunction.apply(q, k, v, rpb, params, "cuda")
    want = torch.autograd.grad([o2, l2], inputs, [g_out, g_lse])
    # The dK/dV walk starts at the range's first query, so its 64-query boxes group the sum
    # over queries differently (the out-of-range rows add exact zeros either way): the fp32
    # sums differ in rounding, and a 16-bit gradient by an ulp here and there (measured:
    # 1.0e-5 relative at fp16).
    for name, a, b in zip(("dq", "dk", "dv", "drpb"), got, want):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b) <= ORDER_TOL[case.dtype], f"{name}: {rel_err(a, b):.2e}"


# The square pair (its forward, dQ pass and own dK/dV pass clip their walks to the range).
SQUARE_CASES = [dataclasses.replace(c, extra=0) for c in square_sweep(int(os.environ.get("NATTN_QRANGE_CASES", "150")) // 4,
                                                                      seed=4345)]


@pytest.mark.parametrize("case", SQUARE_CASES, ids=[f"square{i}-{c}" for i, c in enumerate(SQUARE_CASES)])
def test_sm90_square_query_range(case, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV", "own")
    test_sm90_query_range(case, monkeypatch)
