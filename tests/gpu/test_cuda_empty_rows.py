"""GPU tier: queries whose whole neighbourhood is masked (an RPB table of -inf for one head),
with and without extra keys, on every kernel family (NATTN_FAMILY is read by libnattn on
every call): output 0 and LSE -inf without extra keys, attention over the extra keys alone
with them, finite gradients equal to the reference's (docs/semantics.md)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import nattn  # noqa: E402
from gpu_cases import TOL  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

FAMILIES = ["simt", "tc"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else [])


def run(backend, q, k, v, rpb, extra, seed):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, rpb, *extra)]
    qq, kk, vv, rr, *ex = leaves
    out, lse = nattn.na2d(qq, kk, vv, 5, rpb=rr, backend=backend, return_lse=True,
                          additional_keys=ex[0] if ex else None, additional_values=ex[1] if ex else None)
    g = torch.Generator(device="cuda").manual_seed(seed)
    g_out = torch.randn(out.shape, generator=g, device="cuda").to(out.dtype)
    grads = torch.autograd.grad([out], leaves, [g_out])
    return out.detach(), lse.detach(), grads


# fp32 runs the SIMT family only; the tensor-core families take fp16/bf16.
COMBOS = [(f, dt) for f in FAMILIES for dt in (torch.float32, torch.bfloat16, torch.float16)
          if f == "simt" or dt != torch.float32]


@pytest.mark.parametrize("family,dtype", COMBOS)
@pytest.mark.parametrize("with_extra", [False, True])
def test_fully_masked_rows(family, dtype, with_extra, monkeypatch):
    monkeypatch.setenv("NATTN_FAMILY", family)
    g = torch.Generator(device="cuda").manual_seed(11 + with_extra)
    b, n, h, d = 2, 16, 2, 32
    q, k, v = (torch.randn(b, n, n, h, d, generator=g, device="cuda").to(dtype) for _ in range(3))
    rpb = torch.randn(h, 9, 9, generator=g, device="cuda")
    rpb[0] = float("-inf")  # head 0: every neighbourhood masked
    extra = [torch.randn(b, 4, h, d, generator=g, device="cuda").to(dtype) for _ in range(2)] if with_extra else []
    out, lse, grads = run("cuda", q, k, v, rpb, extra, 5)
    ref_out, ref_lse, ref_grads = run("reference", q, k, v, rpb, extra, 5)
    assert torch.isfinite(out).all() and not torch.isnan(lse).any()
    if not with_extra:
        assert (out[..., 0, :] == 0).all() and (lse[..., 0] == float("-inf")).all()
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse[finite] - ref_lse[finite]).abs().max() < 1e-2
    for got, want in zip([out, *grads], [ref_out, *ref_grads]):
        assert torch.isfinite(got).all()
        err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
        assert err <= 2 * TOL[dtype], err
