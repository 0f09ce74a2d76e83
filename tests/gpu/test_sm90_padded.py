"""GPU tier, Hopper family: head dims without an sm90 instance of their own (D != D_v, or
between the instances: 16, 48, 72, 96, ...) run it on the next instance with zero-padded
copies (csrc/src/sm90_padded.h). Forced with NATTN_FAMILY=sm90 (read by libnattn per call:
a call the family declines is an error), on fresh random problems of every other feature,
against the reference: output and LSE, the gradients of everything, a query range."""

import dataclasses
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from nattn.backends import get as get_backend  # noqa: E402
from nattn.params import NAParams  # noqa: E402
from gpu_cases import TOL, check, compare_gradients, functional_call, make_inputs, rel_err  # noqa: E402
from sm90_cases import fits_wide_rpb, sm90_sweep  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)

# (D, D_v): different head dims, head dims between the instances (32, 64, 128, 256), and
# above 128 (padded to 256).
BACKWARD_DIMS = [(64, 128), (128, 64), (32, 64), (64, 32), (32, 128), (96, 96), (48, 48), (72, 72), (80, 64),
                 (16, 16), (40, 24), (112, 112), (8, 56)]
WIDE_DIMS = [(192, 192), (160, 128), (128, 256), (256, 64), (64, 200)]
FORWARD_DIMS = BACKWARD_DIMS + WIDE_DIMS


def with_dims(cases, dims, seed):
    rng = random.Random(seed)
    return [dataclasses.replace(c, dim=d, dim_v=dv) for c in cases for d, dv in [rng.choice(dims)]]


FORWARD = with_dims(sm90_sweep(int(os.environ.get("NATTN_SM90_PADDED_CASES", "300")), seed=3131), FORWARD_DIMS, 1)
BACKWARD = with_dims(sm90_sweep(int(os.environ.get("NATTN_SM90_PADDED_BWD_CASES", "200")), seed=3232),
                     BACKWARD_DIMS, 2)
BACKWARD_WIDE = [fits_wide_rpb(c) for c in with_dims(sm90_sweep(60, seed=3434), WIDE_DIMS, 4)]
RANGED = with_dims([dataclasses.replace(c, extra=0) for c in sm90_sweep(30, seed=3333)], BACKWARD_DIMS, 3)


@pytest.mark.parametrize("case", FORWARD, ids=[f"{i}-{c}" for i, c in enumerate(FORWARD)])
def test_sm90_padded_forward(case, monkeypatch):
    monkeypatch.setenv("NATTN_FAMILY", "sm90")
    t, _ = make_inputs(case)
    with torch.no_grad():
        out, lse = functional_call(case, t, 0.0, "cuda")
        ref_out, ref_lse = functional_call(case, t, 0.0, "reference")
    check("out", out, ref_out, TOL[case.dtype])
    check("lse", lse, ref_lse, 1e-4)


@pytest.mark.parametrize("case", BACKWARD, ids=[f"{i}-{c}" for i, c in enumerate(BACKWARD)])
def test_sm90_padded_backward(case, monkeypatch):
    monkeypatch.setenv("NATTN_FAMILY", "sm90")
    compare_gradients(case, TOL[case.dtype])


@pytest.mark.parametrize("case", BACKWARD_WIDE, ids=[f"wide{i}-{c}" for i, c in enumerate(BACKWARD_WIDE)])
def test_sm90_padded_backward_above_128(case, monkeypatch):
    """Head dims above 128 train on the head-dim-256 backward through zero-padded copies."""
    monkeypatch.setenv("NATTN_FAMILY", "sm90")
    compare_gradients(case, TOL[case.dtype])


@pytest.mark.parametrize("case", RANGED, ids=[f"{i}-{c}" for i, c in enumerate(RANGED)])
def test_sm90_padded_query_range(case, monkeypatch):
    """Rows outside a query range read output 0, LSE +inf and dQ 0 through the padded
    copies too (the copies back carry zeros there); rows inside equal the whole call's."""
    monkeypatch.setenv("NATTN_FAMILY", "sm90")
    rng = random.Random(case.seed)
    query_range = tuple((lo, rng.randint(lo + 1, n)) for n in case.spatial for lo in [rng.randrange(n)])
    t, _ = make_inputs(case)
    q, k, v = (t[n].detach() for n in ("query", "key", "value"))
    rpb = t["rpb"].detach() if "rpb" in t else None
    params = NAParams(case.kernel, case.stride, case.dilation, case.causal,
                      case.scale if case.scale is not None else case.dim ** -0.5)
    impl = get_backend("cuda")
    out_r, lse_r = impl.na_forward(q, k, v, rpb, params, query_range=query_range)
    out_f, lse_f = impl.na_forward(q, k, v, rpb, params)
    keep = torch.ones(case.spatial, dtype=torch.bool, device="cuda")
    for a, (lo, hi) in enumerate(query_range):
        idx = torch.arange(case.spatial[a], device="cuda").view([-1 if i == a else 1 for i in range(len(case.spatial))])
        keep &= (idx >= lo) & (idx < hi)
    keep = keep.view(1, *case.spatial, 1)
    assert torch.equal(torch.where(keep.unsqueeze(-1), out_r, out_f), out_f)
    left = ~keep.expand_as(lse_r) & (lse_r != lse_f)
    assert torch.isinf(lse_r[left]).all() and (out_r[left.unsqueeze(-1).expand_as(out_r)] == 0).all()
    g = torch.Generator(device="cuda").manual_seed(case.seed + 1)
    g_out = torch.randn(out_f.shape, generator=g, device="cuda").to(out_f.dtype) * keep.unsqueeze(-1)
    dq, dk, dv, _ = impl.na_backward(q, k, v, rpb, out_r, lse_r, g_out, None, params, query_range=query_range)
    dq_f, dk_f, dv_f, _ = impl.na_backward(q, k, v, rpb, out_f, lse_f, g_out, None, params)
    for name, a, b in (("dq", dq, dq_f), ("dk", dk, dk_f), ("dv", dv, dv_f)):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, b) <= 8e-4, f"{name}: {rel_err(a, b):.2e}"
    assert (dq[(~keep).unsqueeze(-1).expand_as(dq)] == 0).all()
