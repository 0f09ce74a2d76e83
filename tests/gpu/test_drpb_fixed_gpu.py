"""GPU tier: the dRPB of the tensor-core, SIMT and Hopper backwards in fixed point
(csrc/include/nattn/common/drpb_fixed.cuh): bitwise equal from run to run, accurate per head
when the heads' gradients differ by many orders of magnitude (each head has its own scale),
zero for a zero gradient, NaN for a head whose gradient holds a NaN. Each family forced with
NATTN_FAMILY (the Hopper one on a compute capability 9.0 GPU with it built). Fresh random
problems each run; float64 reference."""

import random

import pytest
import torch

import nattn
from nattn._cuda import library

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
    pytest.skip("needs an SM80+ GPU (the tensor-core family)", allow_module_level=True)
_LIB = library.load()
FAMILIES = ["tc", "simt"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) and _LIB is not None
                             and any(f == "sm90" for f, _, _ in _LIB.kernels) else [])

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
SEED = random.randrange(2**31)


@pytest.fixture(autouse=True, params=FAMILIES)
def family(request, monkeypatch):
    monkeypatch.setenv("NATTN_FAMILY", request.param)  # libnattn reads it on every call
    return request.param


def problem(rng: random.Random, na_dim: int, dtype, min_heads: int = 1):
    kernel = tuple(rng.choice((3, 5, 7) if na_dim < 3 else (3, 5)) for _ in range(na_dim))
    dilation = tuple(rng.choice((1, 1, 2)) for _ in range(na_dim))
    spatial = tuple(k * d + rng.randint(0, 9) for k, d in zip(kernel, dilation))
    heads_kv = rng.choice((1, 2))
    heads = heads_kv * rng.choice([g for g in (1, 2, 3) if heads_kv * g >= min_heads])
    dim = rng.choice((32, 64))
    g = torch.Generator(device="cuda").manual_seed(rng.randrange(2**31))
    q = torch.randn(rng.randint(1, 3), *spatial, heads, dim, device="cuda", generator=g).to(dtype)
    k = torch.randn(q.shape[0], *spatial, heads_kv, dim, device="cuda", generator=g).to(dtype)
    v = torch.randn(q.shape[0], *spatial, heads_kv, dim, device="cuda", generator=g).to(dtype)
    rpb = torch.randn(heads, *(2 * w - 1 for w in kernel), device="cuda", generator=g)
    grad = torch.randn(*q.shape, device="cuda", generator=g)
    return q, k, v, rpb, grad, dict(kernel_size=kernel, dilation=dilation)


def drpb(q, k, v, rpb, grad, kw, backend="cuda", dtype=None):
    dtype = dtype or q.dtype
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    bias = rpb.detach().to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
    out = FUNCS[q.dim() - 3](*leaves, rpb=bias, backend=backend, **kw)
    out.backward(grad.to(out.dtype))
    return bias.grad


@pytest.mark.parametrize("i", range(12))
def test_drpb_is_bitwise_repeatable(i, family):
    rng = random.Random(SEED + i)
    dtypes = (torch.float32, torch.bfloat16) if family == "simt" else (torch.bfloat16, torch.float16)
    args = problem(rng, 1 + i % 3, rng.choice(dtypes))
    first = drpb(*args)
    assert torch.isfinite(first).all()
    for _ in range(2):
        assert torch.equal(drpb(*args), first), f"seed {SEED}, case {i}: dRPB differs between runs"


@pytest.mark.parametrize("i", range(8))
def test_drpb_per_head_scale(i, family):
    """Heads whose gradients differ by up to 1e9 (bf16; 1e6 in fp16): each head's dRPB within
    rounding of float64 (a scale shared by the heads would round the smallest one's away)."""
    rng = random.Random(SEED + 100 + i)
    dtype = torch.float16 if i % 2 else torch.bfloat16
    q, k, v, rpb, grad, kw = problem(rng, 1 + i % 3, dtype, min_heads=2)
    heads = q.shape[-2]
    # fp16 values below ~6e-5 are subnormal: the gradient's rounding (and the Hopper pass's
    # 16-bit dS^T, which it sums) would dominate the comparison
    low = -6 if dtype == torch.bfloat16 else (-3 if family == "tc" else -1)
    magnitude = torch.tensor([10.0 ** rng.uniform(low, 3) for _ in range(heads)], device="cuda")
    magnitude[rng.randrange(heads)] = 10.0 ** low
    grad = grad * magnitude.view(*([1] * (grad.dim() - 2)), heads, 1)
    got = drpb(q, k, v, rpb, grad, kw)
    # the float64 reference on the same 16-bit q / k / v (the gradient is rounded to 16 bits
    # only in the kernel's run)
    want = drpb(q, k, v, rpb, grad, kw, backend="reference", dtype=torch.float64)
    for h in range(heads):
        err = (got[h].double() - want[h]).norm() / want[h].norm().clamp_min(1e-300)
        tol = 2e-2 if q.dtype == torch.bfloat16 else 4e-3
        assert err < tol, f"seed {SEED}, case {i}, head {h} (gradient scale {magnitude[h]:.1e}): rel err {err:.2e}"


def test_drpb_zero_and_nan_gradients():
    rng = random.Random(SEED + 999)
    q, k, v, rpb, grad, kw = problem(rng, 2, torch.bfloat16, min_heads=2)
    assert torch.equal(drpb(q, k, v, rpb, torch.zeros_like(grad), kw), torch.zeros_like(rpb))
    heads = q.shape[-2]
    grad = grad.clone()
    grad[0, 0, 0, heads - 1, 0] = float("nan")
    got = drpb(q, k, v, rpb, grad, kw)
    assert torch.isnan(got[heads - 1]).all(), "a NaN gradient must not vanish from dRPB"
    assert torch.isfinite(got[: heads - 1]).all()
