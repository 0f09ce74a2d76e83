"""The reference backend against the brute-force float64 oracle, with every feature combined."""

import pytest
import torch

import nattn
from cases import sweep
from oracle import oracle

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def make_inputs(case, dtype, requires_grad=True):
    """Fresh random inputs for this case (seeded by the case, so failures reproduce)."""
    g = torch.Generator().manual_seed(case.seed)
    shape = (case.batch, *case.spatial)

    def rnd(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)

    t = {
        "query": rnd(*shape, case.heads, case.dim),
        "key": rnd(*shape, case.heads_kv, case.dim),
        "value": rnd(*shape, case.heads_kv, case.dim_v),
    }
    if case.extra:
        t["additional_keys"] = rnd(case.batch, case.extra, case.heads_kv, case.dim)
        t["additional_values"] = rnd(case.batch, case.extra, case.heads_kv, case.dim_v)
    if case.rpb:
        t["rpb"] = rnd(case.heads, *[2 * k - 1 for k in case.kernel])
    return t


def run_nattn(case, t, backend="reference"):
    return FUNCS[len(case.spatial)](
        t["query"], t["key"], t["value"], case.kernel, stride=case.stride,
        dilation=case.dilation, is_causal=case.causal, scale=case.scale,
        additional_keys=t.get("additional_keys"), additional_values=t.get("additional_values"),
        rpb=t.get("rpb"), backend=backend, return_lse=True,
    )


def run_oracle(case, t):
    return oracle(
        t["query"], t["key"], t["value"], case.kernel, case.stride, case.dilation, case.causal,
        scale=case.scale, rpb=t.get("rpb"), extra_k=t.get("additional_keys"),
        extra_v=t.get("additional_values"),
    )


def grads(t, out, lse, g_out, g_lse):
    """Gradients of <out, g_out> + <lse, g_lse> w.r.t. every input (the LSE gets a gradient too)."""
    loss = (out.double() * g_out).sum() + (lse.double() * g_lse).sum()
    names = list(t)
    return dict(zip(names, torch.autograd.grad(loss, [t[n] for n in names])))


def assert_close(name, got, want, rtol, atol):
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def check_case(case, dtype, tol, backend="reference"):
    t = make_inputs(case, dtype)
    out, lse = run_nattn(case, t, backend)
    assert out.dtype == dtype and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    t64 = {n: x.detach().double().requires_grad_(True) for n, x in t.items()}
    ref_out, ref_lse = run_oracle(case, t64)
    assert_close("out", out, ref_out, *tol)
    assert_close("lse", lse, ref_lse, *tol)
    g = torch.Generator().manual_seed(case.seed + 1)
    g_out = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    g_lse = torch.randn(ref_lse.shape, generator=g, dtype=torch.float64)
    got = grads(t, out, lse, g_out, g_lse)
    want = grads(t64, ref_out, ref_lse, g_out, g_lse)
    for name in t:
        assert_close(f"grad {name}", got[name], want[name], *tol)


CASES_64 = sweep(320, seed=1234)
CASES_LOW = sweep(80, seed=99)


@pytest.mark.parametrize("case", CASES_64, ids=str)
def test_float64_sweep(case):
    check_case(case, torch.float64, (1e-9, 1e-9))


@pytest.mark.parametrize("case", CASES_LOW[:40], ids=str)
def test_float32_sweep(case):
    check_case(case, torch.float32, (1e-4, 1e-4))


@pytest.mark.parametrize("case", CASES_LOW[40:60], ids=str)
def test_bfloat16_sweep(case):
    check_case(case, torch.bfloat16, (5e-2, 5e-2))


@pytest.mark.parametrize("case", CASES_LOW[60:], ids=str)
def test_float16_sweep(case):
    check_case(case, torch.float16, (1e-2, 1e-2))
