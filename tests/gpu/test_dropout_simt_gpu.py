"""GPU tier: attention dropout on libnattn's SIMT family against the reference backend, the
oracle of docs/semantics.md's "Attention dropout".

Every test sets ``NATTN_FAMILY=simt`` (read by libnattn on every call), so float16/bfloat16
problems run the SIMT kernels too, on any GPU (SM50 on: no tensor cores needed). Run with ``pytest -m gpu tests/gpu/test_dropout_simt_gpu.py -n 0``.

- A sweep of random problems (float32, float16, bfloat16; 1-D/2-D/3-D; odd and even kernels,
  dilation, stride, causal, GQA, RPB, strided layouts, head dims up to 256; p in {0.1, 0.5,
  0.9}) calls both backends directly with one ``rng`` tensor: output, LSE and dq/dk/dv/drpb
  must agree within the tolerances of test_cuda_vs_reference.py (float32 a little wider).
- The keep mask of every pass is read back exactly and compared bit for bit with
  nattn/dropout.py's: with q = 0 every weight of a (non-causal or causal) window is
  1 / |window|, keys' values are one-hot by their window slot, and the backward's inputs are
  chosen so that the output, dq and dv hold single mask bits (or exact sums of them).
- Bitwise reproducibility under ``torch.manual_seed``, the functional API with extra keys, and
  the dispatch (cuda takes float32 and head-dim-256 dropout, which only the SIMT family runs).
"""

import dataclasses
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import nattn  # noqa: E402
from gpu_cases import check, compare_dropout, random_case, seeded_forward_backward  # noqa: E402
from nattn import _call_cache, dropout  # noqa: E402
from nattn._cuda import library  # noqa: E402
from nattn.backends import BACKENDS, choose_na_backend  # noqa: E402
from nattn.params import normalize  # noqa: E402
from nattn.windows import WindowTable  # noqa: E402


pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
_LIB = library.load()
if _LIB is None or _LIB.abi < 3:
    pytest.skip("the loaded libnattn has no attention dropout: rebuild it (ABI 3+)", allow_module_level=True)

CUDA, REF = BACKENDS["cuda"], BACKENDS["reference"]
PS = (0.1, 0.5, 0.9)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Relative L2 error allowed (test_cuda_vs_reference.py's; float32 a little wider: dropout's
# 1 / (1 - p) scales the terms; gradients twice that). A wrong keep bit moves a weight by
# 1 / (1 - p) - 1 or more; the read-back tests below pin every bit exactly.
TOL = {torch.float32: 5e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
N_CASES = int(os.environ.get("NATTN_GPU_SIMT_DROPOUT_CASES", "150"))


@pytest.fixture(autouse=True)
def simt_dropout(monkeypatch):
    """Cap libnattn at its SIMT family for one test; the call cache forgets the backend choices
    made under it (the functional API caches them)."""
    monkeypatch.delenv("NATTN_SIMT_DROPOUT", raising=False)  # older libraries' opt-in: not needed
    monkeypatch.setenv("NATTN_FAMILY", "simt")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # the reference's fp32 exact
    _call_cache.clear()
    if "simt" not in _LIB.dropout_families:
        pytest.skip("the loaded libnattn predates SIMT dropout by default: rebuild it")
    yield
    _call_cache.clear()


def sweep(count, seed):
    rng = random.Random(seed)
    # every dtype and head dim (the SIMT family takes them all), no extra keys
    return [(random_case(rng, 1 + i % 3, dtypes=DTYPES, extras=(0,)), PS[i % len(PS)]) for i in range(count)]


CASES = sweep(N_CASES, 5791)


@pytest.mark.parametrize("case,p", CASES, ids=[f"{i}-p{p}-{c}" for i, (c, p) in enumerate(CASES)])
def test_simt_dropout_matches_reference(case, p):
    compare_dropout(case, p, TOL[case.dtype], 1e-5 if case.dtype == torch.float32 else 1e-4)


# ------------------------------------------------------------------ exact mask read-back
# (spatial, kernel, stride, dilation, causal): every window is a box of consecutive group
# coordinates, so a key's slot sum_a ((x_a // d_a) % k_a) * prod(k_{a+1:}) is distinct within
# any window (and so is a query's among the queries sharing a slot pattern).
READBACK = [
    ((300,), (8,), (1,), (1,), (False,)),
    ((300,), (7,), (3,), (3,), (True,)),
    ((20, 26), (3, 5), (1, 2), (2, 1), (True, False)),
    ((9, 10, 12), (2, 3, 3), (1, 1, 3), (1, 2, 1), (False, False, True)),
]


def slots(spatial, kernel, dilation, device):
    """Every token's slot (the formula above), [N]."""
    n = 1
    for s in spatial:
        n *= s
    t = torch.arange(n, device=device)
    coords = []
    for s in reversed(spatial):
        coords.append(t % s)
        t = t // s
    coords.reverse()
    slot = torch.zeros(n, dtype=torch.long, device=device)
    for c, k, d in zip(coords, kernel, dilation):
        slot = slot * k + (c // d) % k
    return slot


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("problem", READBACK, ids=[f"{len(r[0])}d-{i}" for i, r in enumerate(READBACK)])
def test_every_pass_draws_the_philox_mask(problem, p, dtype):
    """With W = prod(kernel) (at most 18 here) and n_i the keys of query i's window, q = 0
    makes every weight P_ij = 1 / n_i. Values: v_j = e_{slot(j)} + e_{2W}; output gradients:
    dO_i = e_{W + slot(i)} + e_{2W}; keys: k_j = e_{slot(j)}. Then with m the keep mask and
    s = 1 / (1 - p):
      out_i[slot(j)] = m_ij s / n_i      (the forward's bits, one per channel)
      out_i[2W]      = S_i = sum_j m_ij s / n_i = delta_i   (dO_i . out_i)
      dq_i[slot(j)]  = P_ij (m_ij s dP_ij - delta_i) with dP_ij = dO_i . v_j = 1
                                           (the dQ pass's bits, one per channel)
      dv_j[W + c]    = sum over queries i with slot(i) = c of m_ij s / n_i, dv_j[2W] over all
                                           (the dK/dV pass's bits, exact sums)
    and dk = 0. The backward runs on the reference's output and LSE, so each pass is checked
    on its own. Query heads 4 on 2 KV heads (GQA: the dK/dV pass walks both query heads)."""
    spatial, kernel, stride, dilation, causal = problem
    dev = "cuda"
    b, h, hk = 2, 4, 2
    wsize = 1
    for k in kernel:
        wsize *= k
    n = 1
    for s in spatial:
        n *= s
    d = -(-wsize // 8) * 8
    dv_ = -(-(2 * wsize + 1) // 8) * 8
    slot = slots(spatial, kernel, dilation, dev)
    q = torch.zeros(b, *spatial, h, d, device=dev, dtype=dtype)
    k = torch.zeros(b, *spatial, hk, d, device=dev, dtype=dtype)
    v = torch.zeros(b, *spatial, hk, dv_, device=dev, dtype=dtype)
    g_out = torch.zeros(b, *spatial, h, dv_, device=dev, dtype=dtype)
    tok = torch.arange(n, device=dev)
    k.view(b, n, hk, d)[:, tok, :, slot] = 1
    v.view(b, n, hk, dv_)[:, tok, :, slot] = 1
    v[..., 2 * wsize] = 1
    g_out.view(b, n, h, dv_)[:, tok, :, wsize + slot] = 1
    g_out[..., 2 * wsize] = 1
    params = normalize(q, k, v, len(spatial), kernel, stride, dilation, causal, 1.0, dropout_p=p)
    rng = dropout.draw_rng(dev)
    out, lse = CUDA.na_forward(q, k, v, None, params, rng=rng)
    out_r, lse_r = REF.na_forward(q, k, v, None, params, rng=rng)
    dq, dk, dv, _ = CUDA.na_backward(q, k, v, None, out_r, lse_r, g_out, None, params, rng=rng)

    keys, valid, _ = WindowTable(spatial, kernel, stride, dilation, causal, device=dev).chunk(0, n)  # [N, W]
    bi = torch.arange(b, device=dev).view(-1, 1, 1, 1)
    hi = torch.arange(h, device=dev).view(1, -1, 1, 1)
    qi = tok.view(1, 1, -1, 1)
    keep = dropout.keep_mask(rng, p, bi, hi, qi, keys.view(1, 1, n, -1)) & valid  # [B, H, N, W]
    count = valid.sum(-1).double()  # n_i
    s = 1.0 / (1.0 - p)
    weight = keep.double() * s / count[:, None]  # m_ij s / n_i, [B, H, N, W]
    unit = s / count.max().item()  # the smallest nonzero weight a bit carries
    atol = 0.25 * unit / (1.0 if dtype == torch.float32 else 2.0)  # half a bit's weight at most

    # forward: one bit per channel of out_i[:W], the row sum in out_i[2W]
    kslot = slot[keys]  # [N, W]
    want = torch.zeros(b, h, n, dv_, dtype=torch.float64, device=dev)
    want.scatter_add_(3, kslot.expand(b, h, n, -1) * valid, weight)
    want[..., 2 * wsize] = weight.sum(-1)
    got_out = out.double().view(b, n, h, dv_).permute(0, 2, 1, 3)
    assert float((got_out - want).abs().max()) < atol, "forward: output is not the Philox mask's"
    got_keep = got_out[..., :wsize].gather(3, kslot.expand(b, h, n, -1)) > 0.5 * unit
    assert torch.equal(got_keep & valid, keep), f"forward: {int((got_keep & valid != keep).sum())} keep bits differ"
    check("lse", lse, lse_r, 1e-5)
    frac = keep.sum().item() / (valid.sum().item() * b * h)
    assert abs(frac - (1 - p)) < 0.02, f"kept fraction {frac:.4f}, expected {1 - p}"

    # dQ pass: dq_i[slot(j)] = P_ij (m_ij s - delta_i), delta_i = sum_j m_ij s / n_i
    delta = weight.sum(-1, keepdim=True)
    ds = (keep.double() * s - delta) / count[:, None] * valid
    want_dq = torch.zeros(b, h, n, d, dtype=torch.float64, device=dev)
    want_dq.scatter_add_(3, kslot.expand(b, h, n, -1) * valid, ds)
    got_dq = dq.double().view(b, n, h, d).permute(0, 2, 1, 3)
    assert float((got_dq - want_dq).abs().max()) < atol, "dQ pass: dq is not the Philox mask's"

    # dK/dV pass: dv_j[W + slot(i)] += m_ij s / n_i over the queries i of every query head of
    # j's KV head; dv_j[2W] the same over all of them; dk = 0
    want_dv = torch.zeros(b, hk, n * dv_, dtype=torch.float64, device=dev)
    target = keys * dv_ + (wsize + slot)[:, None]  # [N, W]: (key, channel) of each element
    groups = h // hk
    for hh in range(h):
        w = (weight[:, hh] * valid).reshape(b, -1)
        want_dv[:, hh // groups].scatter_add_(1, target.reshape(1, -1).expand(b, -1), w)
        want_dv[:, hh // groups].scatter_add_(1, (keys * dv_ + 2 * wsize).reshape(1, -1).expand(b, -1), w)
    want_dv = want_dv.view(b, hk, n, dv_)
    got_dv = dv.double().view(b, n, hk, dv_).permute(0, 2, 1, 3)
    dv_atol = atol * (1.0 if dtype == torch.float32 else 4.0)  # sums of up to ~W weights, rounded once
    assert float((got_dv - want_dv).abs().max()) < dv_atol, "dK/dV pass: dv is not the Philox mask's"
    assert float(dk.double().abs().max()) < 1e-6, "dk must vanish with q = 0"


# ------------------------------------------------------------------ the functional API
REPRO_CASES = [c for c, _ in sweep(9, 1357)]


@pytest.mark.parametrize("case", REPRO_CASES, ids=[str(c) for c in REPRO_CASES])
def test_bitwise_reproducible_and_matches_reference_with_extra_keys(case):
    """Outputs and gradients bit for bit under torch.manual_seed (dRPB aside: atomics); another
    seed changes the output; the functional API (extra keys merged through the LSE) on cuda and
    on the reference under the same seed agree."""
    case = dataclasses.replace(case, extra=5)
    p = 0.5
    a, b2 = seeded_forward_backward(case, p, 7), seeded_forward_backward(case, p, 7)
    assert torch.equal(a[0], b2[0]) and torch.equal(a[1], b2[1])
    n_exact = len(a[2]) - (1 if case.rpb else 0)  # the RPB's gradient is the last leaf
    for i, (ga, gb) in enumerate(zip(a[2], b2[2])):
        if i < n_exact:
            assert torch.equal(ga, gb), f"gradient {i} differs between two seeded runs"
    c = seeded_forward_backward(case, p, 8)
    assert not torch.equal(a[0], c[0]), "another seed drew the same mask"
    r = seeded_forward_backward(case, p, 7, "reference")
    tol = TOL[case.dtype]
    check("out", a[0], r[0], tol)
    check("lse", a[1], r[1], 1e-5 if case.dtype == torch.float32 else 1e-4)
    for i, (gc, gr) in enumerate(zip(a[2], r[2])):
        check(f"grad {i}", gc, gr, 2 * tol)


def test_dispatch_takes_what_only_the_simt_family_runs(monkeypatch):
    """float32 without TF32 and head dim 256 with dropout run on cuda (its SIMT family) with
    libnattn's default family choice, and agree with the reference under the same seed."""
    monkeypatch.delenv("NATTN_FAMILY")
    _call_cache.clear()
    q = torch.randn(1, 16, 16, 2, 32, device="cuda")
    params = normalize(q, q, q, 2, 5, dropout_p=0.2)
    q256 = torch.randn(1, 12, 12, 2, 256, device="cuda", dtype=torch.float16)
    p256 = normalize(q256, q256, q256, 2, 5, dropout_p=0.2)
    assert choose_na_backend(q, q, q, None, params) == "cuda"
    assert choose_na_backend(q256, q256, q256, None, p256) == "cuda"
    for x, tol in ((q, TOL[torch.float32]), (q256, TOL[torch.float16])):
        torch.manual_seed(1)
        out = nattn.na2d(x, x, x, 5, dropout_p=0.2)
        torch.manual_seed(1)
        check("na2d", out.float(), nattn.na2d(x, x, x, 5, dropout_p=0.2, backend="reference").float(), tol)
