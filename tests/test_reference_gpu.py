"""The reference backend on CUDA tensors matches the float64 oracle (GPU tier: pytest -m gpu)."""

import pytest
import torch

from cases import sweep
from oracle import oracle
from test_reference_vs_oracle import make_inputs, run_nattn

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", sweep(40, seed=2024), ids=str)
def test_reference_on_cuda(case):
    t = {n: x.detach().cuda().requires_grad_() for n, x in make_inputs(case, torch.float32).items()}
    out, lse = run_nattn(case, t, "reference")
    assert out.is_cuda and lse.is_cuda
    t64 = {n: x.detach().double().cpu() for n, x in t.items()}
    ref_out, ref_lse = oracle(t64["query"], t64["key"], t64["value"], case.kernel, case.stride,
                              case.dilation, case.causal, case.scale, t64.get("rpb"),
                              t64.get("additional_keys"), t64.get("additional_values"))
    torch.testing.assert_close(out.double().cpu(), ref_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse.double().cpu(), ref_lse, rtol=1e-4, atol=1e-4)
