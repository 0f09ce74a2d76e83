"""GPU tier: the cuda backend against the reference backend on fresh random problems.

Run on a CUDA machine with ``pytest -m gpu tests/gpu``. Every case compares the output,
the LSE and the gradients of every input (q, k, v, RPB, extra keys/values), with a
random gradient flowing into the LSE as well as the output.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import nattn  # noqa: E402
from gpu_cases import TOL, data_seed, make_inputs, rel_err, sweep  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

N_CASES = int(os.environ.get("NATTN_GPU_CASES", "540"))
CASES = sweep(N_CASES)
WIDE_CASES = sweep(int(os.environ.get("NATTN_GPU_WIDE_CASES", "30")), seed=977, wide=True)
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
# Relative L2 error allowed: both backends accumulate in float32 from the same inputs;
# half-precision outputs differ by their final rounding.


def run(case, t, backend):
    return FUNCS[len(case.spatial)](
        t["query"], t["key"], t["value"], case.kernel, stride=case.stride,
        dilation=case.dilation, is_causal=case.causal, scale=case.scale,
        additional_keys=t.get("additional_keys"), additional_values=t.get("additional_values"),
        rpb=t.get("rpb"), backend=backend, return_lse=True,
    )


def check(name, got, want, tol):
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values from the cuda backend"
    err = rel_err(got, want)
    assert err <= tol, f"{name}: relative L2 error {err:.3e} > {tol:.1e}"


def compare(case):
    results = {}
    for backend in ("cuda", "reference"):
        t, leaves = make_inputs(case)
        if backend == "cuda":
            from nattn.backends import BACKENDS
            reasons = BACKENDS["cuda"].na_not_supported_reasons(
                t["query"], t["key"], t["value"], t.get("rpb"),
                nattn.params.normalize(t["query"], t["key"], t["value"], len(case.spatial),
                                       case.kernel, case.stride, case.dilation, case.causal,
                                       case.scale, t.get("rpb")), True)
            assert not reasons, f"cuda backend refused a supported case: {reasons}"
        out, lse = run(case, t, backend)
        g = torch.Generator(device="cuda").manual_seed(data_seed(case.seed + 1))
        g_out = torch.randn(out.shape, generator=g, device="cuda").to(out.dtype)
        g_lse = torch.randn(lse.shape, generator=g, device="cuda")
        grads = torch.autograd.grad([out, lse], leaves, [g_out, g_lse])
        results[backend] = (out.detach(), lse.detach(), grads)
    tol = TOL[case.dtype]
    (o_c, l_c, g_c), (o_r, l_r, g_r) = results["cuda"], results["reference"]
    check("out", o_c, o_r, tol)
    check("lse", l_c, l_r, 1e-5 if case.dtype == torch.float32 else 1e-4)
    names = ["grad_leaf%d" % i for i in range(len(g_c))]
    for name, gc, gr in zip(names, g_c, g_r):
        check(name, gc, gr, tol * 2)


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c}" for i, c in enumerate(CASES)])
def test_cuda_matches_reference(case):
    compare(case)


@pytest.mark.parametrize("case", WIDE_CASES, ids=[f"wide{i}-{c}" for i, c in enumerate(WIDE_CASES)])
def test_cuda_matches_reference_wide_windows(case):
    compare(case)
