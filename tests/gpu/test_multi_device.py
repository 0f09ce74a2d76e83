"""GPU tier, two GPUs in one process: each family's kernels run on the second device after the
first. Kernels with more than 48 KiB of dynamic shared memory must be opted in on every device
(csrc/include/nattn/common/smem_opt_in.cuh); opting in once per process made the second
GPU's launches fail. Runs where two CUDA devices are visible (kind nvidia-h200-x2)."""

import pytest
import torch

import nattn
from gpu_cases import TOL, check

pytestmark = pytest.mark.gpu
if torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA devices", allow_module_level=True)

# (spatial, kernel, dilation, heads, head dim, rpb): each family's largest shared-memory users
# at these head dims (tc's dK/dV pass stages the bias; the Hopper passes always exceed 48 KiB)
PROBLEMS = [
    ((12, 14), (5, 7), (1, 2), 2, 64, True),
    ((10, 9), (3, 3), (2, 1), 2, 128, False),
    ((4, 6, 8), (3, 3, 5), (1, 2, 1), 2, 64, True),
]


def _run(device, q, k, v, rpb, kernel, dilation, g):
    leaves = [t.to(device).requires_grad_(True) for t in (q, k, v)]
    bias = rpb.to(device).requires_grad_(True) if rpb is not None else None
    fn = nattn.na2d if len(kernel) == 2 else nattn.na3d
    out = fn(*leaves, kernel, dilation=dilation, rpb=bias, backend="cuda")
    out.backward(g.to(device))
    grads = [t.grad for t in leaves] + ([bias.grad] if bias is not None else [])
    return [out.detach()] + grads


@pytest.mark.parametrize("family", ["tc", "sm90", ""])
@pytest.mark.parametrize("spatial,kernel,dilation,heads,dim,with_rpb", PROBLEMS)
def test_second_device_after_first(monkeypatch, family, spatial, kernel, dilation, heads, dim, with_rpb):
    if family == "sm90" and any(torch.cuda.get_device_capability(i) != (9, 0) for i in (0, 1)):
        pytest.skip("the Hopper family needs compute capability 9.0 on both devices")
    monkeypatch.setenv("NATTN_FAMILY", family)
    dtype = torch.bfloat16
    q, k, v = (torch.randn(1, *spatial, heads, dim, dtype=dtype) for _ in range(3))
    rpb = torch.randn(heads, *(2 * kk - 1 for kk in kernel)) if with_rpb else None
    g = torch.randn(1, *spatial, heads, dim, dtype=dtype)
    fn = nattn.na2d if len(kernel) == 2 else nattn.na3d
    leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    bias = rpb.double().requires_grad_(True) if rpb is not None else None
    want_out = fn(*leaves, kernel, dilation=dilation, rpb=bias, backend="reference")
    want_out.backward(g.double())
    want = [want_out.detach()] + [t.grad for t in leaves] + ([bias.grad] if bias is not None else [])
    names = ["out", "dq", "dk", "dv", "drpb"]
    for device in ("cuda:0", "cuda:1"):  # device 0 first: the launchers' opt-ins happen there
        got = _run(device, q, k, v, rpb, kernel, dilation, g)
        assert all(t.device == torch.device(device) for t in got)
        for name, a, b in zip(names, got, want):
            check(f"{device} {name}", a.double().cpu(), b, TOL[dtype] if name == "out" else 2 * TOL[dtype])
