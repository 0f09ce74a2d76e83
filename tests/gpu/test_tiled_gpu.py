"""The tiled backend on CUDA tensors (only when named: backend="tiled") against the reference,
forward, LSE and every gradient, and with attention dropout (GPU tier: pytest -m gpu)."""

import pytest
import torch

from cases import sweep
from test_reference_vs_oracle import FUNCS, assert_close, make_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _run(case, t, backend, dropout_p=0.0):
    out, lse = FUNCS[len(case.spatial)](
        t["query"], t["key"], t["value"], case.kernel, stride=case.stride, dilation=case.dilation,
        is_causal=case.causal, scale=case.scale, additional_keys=t.get("additional_keys"),
        additional_values=t.get("additional_values"), rpb=t.get("rpb"), dropout_p=dropout_p,
        backend=backend, return_lse=True)
    g = torch.Generator().manual_seed(case.seed + 1)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)).sum() + (
        lse * torch.randn(lse.shape, generator=g, dtype=lse.dtype).to(lse.device)).sum()
    return out, lse, torch.autograd.grad(loss, list(t.values()))


@pytest.mark.parametrize("case", sweep(40, seed=2025), ids=str)
def test_tiled_on_cuda_matches_the_reference_on_cpu(case):
    t = make_inputs(case, torch.float64)
    on_gpu = {n: x.detach().cuda().requires_grad_(True) for n, x in t.items()}
    out, lse, grads = _run(case, on_gpu, "tiled")
    assert out.is_cuda
    ref_out, ref_lse, ref_grads = _run(case, t, "reference")
    assert_close("out", out.cpu(), ref_out, 1e-9, 1e-9)
    assert_close("lse", lse.cpu(), ref_lse, 1e-9, 1e-9)
    for name, a, b in zip(t, grads, ref_grads):
        assert_close(f"grad {name}", a.cpu(), b, 1e-9, 1e-9)


@pytest.mark.parametrize("case", sweep(8, seed=77), ids=str)
def test_tiled_dropout_on_cuda_matches_the_reference_on_cuda(case):
    t = {n: x.detach().cuda().requires_grad_(True) for n, x in make_inputs(case, torch.float64).items()}
    results = []
    for backend in ("tiled", "reference"):
        torch.manual_seed(case.seed)  # both draw the call's [seed, offset] from the CUDA generator
        results.append(_run(case, t, backend, dropout_p=0.3))
    (out, lse, grads), (ref_out, ref_lse, ref_grads) = results
    assert_close("out", out, ref_out, 1e-9, 1e-9)
    assert_close("lse", lse, ref_lse, 1e-9, 1e-9)
    for name, a, b in zip(t, grads, ref_grads):
        assert_close(f"grad {name}", a, b, 1e-9, 1e-9)
