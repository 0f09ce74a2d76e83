"""GPU tier: the dRPB of the tensor-core, SIMT and Hopper backwards in fixed point
(csrc/include/nattn/common/drpb_fixed.cuh): bitwise equal from run to run, accurate per head
when the heads' gradients differ by many orders of magnitude (each head has its own scale),
zero for a zero gradient, NaN for a head whose gradient holds a NaN. Each family forced with
NATTN_FAMILY (the Hopper one on a compute capability 9.0 GPU with it built). Fresh random
problems each run (NATTN_DRPB_SEED reruns a given one); float64 references (the reference
backend, and float64 window sums of dS and |dS| per table entry, which bound each entry's
rounding)."""

import os
import random

import pytest
import torch

import nattn
from nattn._cuda import library
from nattn.windows import WindowTable

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
    pytest.skip("needs an SM80+ GPU (the tensor-core family)", allow_module_level=True)
_LIB = library.load()
FAMILIES = ["tc", "simt"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) and _LIB is not None
                             and any(f == "sm90" for f, _, _ in _LIB.kernels) else [])

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
SEED = int(os.environ.get("NATTN_DRPB_SEED") or random.randrange(2**31))  # a failure names its seed: rerun it


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


def drpb(q, k, v, rpb, grad, kw, backend="cuda", dtype=None, with_out=False):
    dtype = dtype or q.dtype
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    bias = rpb.detach().to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
    out = FUNCS[q.dim() - 3](*leaves, rpb=bias, backend=backend, **kw)
    out.backward(grad.to(out.dtype))
    return (bias.grad, out.detach()) if with_out else bias.grad


def window_drpb(q, k, v, rpb, grad, out, kw):
    """float64 dRPB of the backward the kernels run, per head: sum(dS) and sum(|dS|) over each
    table entry's terms, and the terms' count and largest |dS|. dS = P (dP - delta) from the
    16-bit inputs and 16-bit gradient the kernels see, with delta = rowsum(dO * out) on the
    kernels' own 16-bit output (as their backward takes it). Window slots from
    nattn.windows (stride 1, no causality: what problem() draws)."""
    b, *spatial, heads, dim = q.shape
    n = len(spatial)
    table = WindowTable(spatial, kw["kernel_size"], (1,) * n, kw["dilation"], (False,) * n, device=q.device)
    key, valid, ridx = table.chunk(0, table.num_tokens)  # [N, W] each
    group = heads // k.shape[-2]
    qf, do, o = (t.double().reshape(b, -1, heads, dim) for t in (q, grad.to(q.dtype), out))
    kf, vf = (t.double().reshape(b, -1, k.shape[-2], dim).repeat_interleave(group, 2) for t in (k, v))
    size = rpb[0].numel()
    kept = valid.expand(b, *valid.shape)  # the real terms of every batch row
    idx = ridx.expand(b, *ridx.shape)[kept]
    sums, abs_sums, counts, largest = [], [], [], []
    for h in range(heads):  # one head at a time: [B, N, W, D] gathers
        s = (qf[:, :, h, None, :] * kf[:, key, h]).sum(-1) * dim ** -0.5 + rpb[h].double().flatten()[ridx]
        p = torch.softmax(s.masked_fill(~valid, float("-inf")), -1)
        dp = (do[:, :, h, None, :] * vf[:, key, h]).sum(-1)
        ds = (p * (dp - (do[:, :, h] * o[:, :, h]).sum(-1, keepdim=True)))[kept]
        zeros = torch.zeros(size, dtype=torch.float64, device=q.device)
        sums.append(zeros.index_add(0, idx, ds))
        abs_sums.append(zeros.index_add(0, idx, ds.abs()))
        counts.append(zeros.index_add(0, idx, torch.ones_like(ds)))
        largest.append(ds.abs().max())
    return torch.stack(sums), torch.stack(abs_sums), torch.stack(counts), torch.stack(largest)


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
    """Heads whose gradients differ by up to 1e9 (bf16; 1e6 in fp16): each table entry of
    each head within the rounding of its own terms (a scale shared by the heads would round
    the smallest one's away: errors near the entries themselves).

    Per entry e of head h, |dRPB - float64| <= 2^-7 sum|dS| (the Hopper dK/dV pass sums its
    16-bit dS^T: 2^-9 relative a term for bf16) + count * (2^-21 max_h |dS| (the fixed-point
    steps, >= 21 fraction bits) + 2^-24 (fp16's subnormal spacing, a 16-bit dS term's
    absolute floor)) + 1e-5 max_h |dRPB| (float32 products). A relative norm alone failed
    on cancelling entries (sum|dS| >> |sum dS|) with a correct kernel (sm90, bf16, 1-D:
    2.8e-2 against 2e-2, thirty-second session)."""
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
    got, out = drpb(q, k, v, rpb, grad, kw, with_out=True)
    want, abs_sum, count, largest = window_drpb(q, k, v, rpb, grad, out, kw)
    got = got.double().flatten(1)
    assert torch.isfinite(got).all(), f"seed {SEED}, case {i}: non-finite dRPB"
    for h in range(heads):
        bound = (2.0 ** -7 * abs_sum[h] + count[h] * (2.0 ** -21 * largest[h] + 2.0 ** -24)
                 + 1e-5 * want[h].abs().max())
        err = (got[h] - want[h]).abs()
        worst = int((err - bound).argmax())
        assert (err <= bound).all(), (
            f"seed {SEED}, case {i}, head {h} (gradient scale {magnitude[h]:.1e}), entry {worst}: "
            f"|error| {err[worst]:.3e} > bound {bound[worst]:.3e} (dRPB {want[h][worst]:.3e}, "
            f"sum|dS| {abs_sum[h][worst]:.3e})")
    # window_drpb is the reference backend's dRPB where both see the same output
    grad16 = grad.to(dtype).float()
    ref, ref_out = drpb(q, k, v, rpb, grad16, kw, backend="reference", dtype=torch.float64, with_out=True)
    exact = window_drpb(q, k, v, rpb, grad16, ref_out, kw)[0]
    assert torch.allclose(exact, ref.flatten(1), rtol=1e-9, atol=1e-12 * float(ref.abs().max())), \
        "window_drpb disagrees with the reference backend"


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
