"""GPU tier: attention dropout on the cuda backend (libnattn's tensor-core family) against the
reference backend, the oracle of docs/semantics.md's "Attention dropout".

Run on a CUDA machine (SM80+) with ``pytest -m gpu tests/gpu/test_dropout_gpu.py -n 0``. Each
sweep case draws fresh random inputs and one ``rng`` tensor ([seed, offset]) and calls both
backends directly with it: output, LSE and dq/dk/dv/drpb (a random gradient into the LSE as
well as the output) must agree within the half-precision tolerances of
test_cuda_vs_reference.py. A wrong keep bit changes a weight by 1 / (1 - p) or drops it, far
outside those tolerances, so the comparison pins the mask of every pass; the forward's mask is
also read back exactly (uniform weights, one-hot values) and compared bit for bit with
nattn/dropout.py's, with its keep fraction. Besides: bitwise reproducibility under
``torch.manual_seed``, a different seed giving a different output, ``dropout_p = 0`` bitwise
equal to the plain call, CUDA-graph capture, dispatch (cuda chosen; float32 and head dim 256 on its SIMT family) and the
modules' fused path.
"""

import dataclasses
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import nattn  # noqa: E402
from gpu_cases import (TOL, check, compare_dropout, functional_call, make_inputs, random_case, rel_err,  # noqa: E402
                       seeded_forward_backward)
from nattn import dropout  # noqa: E402
from nattn.backends import BACKENDS, choose_na_backend  # noqa: E402
from nattn.params import normalize  # noqa: E402
from nattn.windows import WindowTable  # noqa: E402


pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability()[0] < 8:
    pytest.skip("dropout runs on the tensor-core family (SM80+)", allow_module_level=True)
if not BACKENDS["cuda"].supports_dropout:
    pytest.skip("the loaded libnattn has no attention dropout: rebuild it (ABI 3+)", allow_module_level=True)

CUDA, REF = BACKENDS["cuda"], BACKENDS["reference"]
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
PS = (0.1, 0.5, 0.9)
DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (8, 16, 24, 32, 40, 64, 72, 96, 128)
# Relative L2 error allowed (test_cuda_vs_reference.py's; gradients twice that).
N_CASES = int(os.environ.get("NATTN_GPU_DROPOUT_CASES", "300"))


def sweep(count, seed, wide=False):
    rng = random.Random(seed)
    # problems the tensor-core family takes: fp16/bf16, head dims <= 128
    return [(random_case(rng, 1 + i % 3, wide, DTYPES, HEAD_DIMS, extras=(0,)), PS[i % len(PS)])
            for i in range(count)]


CASES = sweep(N_CASES, 4321)
WIDE_CASES = sweep(int(os.environ.get("NATTN_GPU_DROPOUT_WIDE_CASES", "24")), 8765, wide=True)


@pytest.mark.parametrize("case,p", CASES, ids=[f"{i}-p{p}-{c}" for i, (c, p) in enumerate(CASES)])
def test_cuda_dropout_matches_reference(case, p):
    compare_dropout(case, p, TOL[case.dtype])


@pytest.mark.parametrize("case,p", WIDE_CASES, ids=[f"wide{i}-p{p}-{c}" for i, (c, p) in enumerate(WIDE_CASES)])
def test_cuda_dropout_matches_reference_wide_windows(case, p):
    compare_dropout(case, p, TOL[case.dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("dilation", [1, 3])
def test_forward_mask_is_the_philox_mask(dtype, p, dilation):
    """Read the forward's keep mask back exactly: with scale 0 every weight is 1 / 8 (a 1-D
    window of 8 keys, distinct mod 8), and key j's value is the one-hot e_{(j / dilation) mod 8},
    so output channel c of query i is m_ij / (1 - p) / 8 for the key j of its window with
    (j / dilation) mod 8 = c. That mask must be nattn/dropout.py's bit for bit, and its
    keep fraction 1 - p."""
    b, n, h, kernel = 2, 1536, 4, 8
    q = torch.randn(b, n, h, 16, device="cuda", dtype=dtype)
    k = torch.randn(b, n, h, 16, device="cuda", dtype=dtype)
    v = torch.zeros(b, n, h, 16, device="cuda", dtype=dtype)
    slot = (torch.arange(n, device="cuda") // dilation) % kernel
    v[:, torch.arange(n, device="cuda"), :, slot] = 1
    params = normalize(q, k, v, 1, kernel, 1, dilation, False, 0.0, dropout_p=p)
    rng = dropout.draw_rng("cuda")
    out, _ = CUDA.na_forward(q, k, v, None, params, rng=rng)
    keys, valid, _ = WindowTable((n,), (kernel,), (1,), (dilation,), (False,), device="cuda").chunk(0, n)
    assert bool(valid.all())
    # [B, H, N, W]: the weight of query i on the w-th key of its window
    got = out.float().permute(0, 2, 1, 3)[:, :, torch.arange(n, device="cuda")[:, None], (keys // dilation) % kernel]
    scale = 1 / (1 - p) / kernel
    assert torch.all((got == 0) | ((got - scale).abs() <= 1e-2 * scale)), "weights other than 0 and 1/(1-p)/8"
    kept = got > 0
    bi = torch.arange(b, device="cuda").view(-1, 1, 1, 1)
    hi = torch.arange(h, device="cuda").view(1, -1, 1, 1)
    qi = torch.arange(n, device="cuda").view(1, 1, -1, 1)
    want = dropout.keep_mask(rng, p, bi, hi, qi, keys.view(1, 1, n, kernel))
    assert torch.equal(kept, want), f"{(kept != want).sum().item()} of {kept.numel()} keep bits differ"
    frac = kept.float().mean().item()
    assert abs(frac - (1 - p)) < 0.01, f"kept fraction {frac:.4f}, expected {1 - p}"


REPRO_CASES = [c for c, _ in sweep(12, 2468)]


@pytest.mark.parametrize("case", REPRO_CASES, ids=[str(c) for c in REPRO_CASES])
def test_bitwise_reproducible_under_manual_seed(case):
    """Outputs and gradients bit for bit under torch.manual_seed (dRPB aside: the dK/dV pass
    adds it with atomics); another seed changes the output; with extra keys too."""
    case = dataclasses.replace(case, extra=case.seed % 2 * 5)
    p = 0.5
    a, b = seeded_forward_backward(case, p, 7), seeded_forward_backward(case, p, 7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    n_exact = len(a[2]) - (1 if case.rpb else 0)  # the RPB's gradient is the last leaf
    for i, (ga, gb) in enumerate(zip(a[2], b[2])):
        if i < n_exact:
            assert torch.equal(ga, gb), f"gradient {i} differs between two seeded runs"
        else:
            check(f"grad {i}", ga, gb, 1e-5)
    c = seeded_forward_backward(case, p, 8)
    assert not torch.equal(a[0], c[0]), "another seed drew the same mask"
    assert rel_err(c[0], a[0]) > 0.05, "another seed changed the output too little for p = 0.5"


@pytest.mark.parametrize("case", REPRO_CASES[:6], ids=[str(c) for c in REPRO_CASES[:6]])
def test_functional_matches_reference_under_the_same_seed(case):
    """The functional API (autograd, extra keys merged through the LSE) on cuda and on the
    reference under the same torch.manual_seed: the same rng, so the same attention."""
    case = dataclasses.replace(case, extra=5)
    p = 0.3
    (o_c, l_c, g_c), (o_r, l_r, g_r) = seeded_forward_backward(case, p, 11), seeded_forward_backward(case, p, 11, "reference")
    tol = TOL[case.dtype]
    check("out", o_c, o_r, tol)
    check("lse", l_c, l_r, 1e-4)
    for i, (gc, gr) in enumerate(zip(g_c, g_r)):
        check(f"grad {i}", gc, gr, 2 * tol)


@pytest.mark.parametrize("case", REPRO_CASES[:6], ids=[str(c) for c in REPRO_CASES[:6]])
def test_zero_dropout_is_the_plain_call(case):
    """dropout_p = 0 draws nothing and runs the plain kernels: bitwise the call without it."""
    t, _ = make_inputs(case)
    with torch.no_grad():
        a = FUNCS[len(case.spatial)](t["query"], t["key"], t["value"], case.kernel, stride=case.stride,
                                     dilation=case.dilation, is_causal=case.causal, scale=case.scale,
                                     rpb=t.get("rpb"), backend="cuda", return_lse=True)
        state = torch.cuda.get_rng_state()
        b = functional_call(case, t, 0.0)
        assert torch.equal(state, torch.cuda.get_rng_state()), "dropout_p = 0 drew random numbers"
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cuda_graph_capture_replays_fresh_masks():
    """The kernels read seed and offset from the rng tensor on the device: a captured draw plus
    forward replays with a new mask each time, each the reference's for that replay's rng."""
    q, k, v = (torch.randn(2, 24, 24, 4, 32, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    params = normalize(q, k, v, 2, 7, dropout_p=0.5)
    CUDA.na_forward(q, k, v, None, params, rng=dropout.draw_rng("cuda"))  # load and warm up outside
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rng = dropout.draw_rng("cuda")
        out, _ = CUDA.na_forward(q, k, v, None, params, rng=rng)
    seen = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        want, _ = REF.na_forward(q, k, v, None, params, rng=rng.clone())
        check("graph replay", out, want, TOL[torch.bfloat16])
        seen.append(out.clone())
    assert not torch.equal(seen[0], seen[1]), "two replays drew the same mask"


def test_dispatch_takes_cuda_and_declines_hopper_configurations(monkeypatch):
    """fp16, float32 (TF32 off: the SIMT family) and head dim 256 (SIMT too) with dropout all
    go to cuda; a named Hopper configuration, or the Hopper family forced, declines it."""
    q = torch.randn(1, 16, 16, 2, 32, device="cuda", dtype=torch.float16)
    params = normalize(q, q, q, 2, 5, dropout_p=0.2)
    assert choose_na_backend(q, q, q, None, params) == "cuda"
    q32 = q.float()
    p32 = normalize(q32, q32, q32, 2, 5, dropout_p=0.2)
    assert choose_na_backend(q32, q32, q32, None, p32) == "cuda"
    assert CUDA.na_not_supported_reasons(q32, q32, q32, None, p32, True) == []
    q256 = torch.randn(1, 16, 16, 2, 256, device="cuda", dtype=torch.float16)
    p256 = normalize(q256, q256, q256, 2, 5, dropout_p=0.2)
    assert choose_na_backend(q256, q256, q256, None, p256) == "cuda"
    with pytest.raises(nattn.backends.NoBackendError, match="sm90 family"):
        nattn.na2d(q, q, q, 5, dropout_p=0.2, backend="cuda:kv=2")
    # libnattn itself declines a forced Hopper family (names the reason) on 9.0 GPUs
    if torch.cuda.get_device_capability() == (9, 0):
        monkeypatch.setenv("NATTN_FAMILY", "sm90")
        with pytest.raises(RuntimeError, match="dropout_p > 0 is not supported by the sm90 family"):
            CUDA.na_forward(q, q, q, None, params, rng=dropout.draw_rng("cuda"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_module_trains_with_fused_dropout(monkeypatch, dtype):
    """A module with attn_drop in training mode runs the fused cuda path (not na_explicit)."""
    import importlib

    from nattn.nn import NeighborhoodAttention2D
    module = importlib.import_module("nattn.nn.neighborhood_attention")

    def refuse(*a, **kw):
        raise AssertionError("the unfused path ran")

    monkeypatch.setattr(module, "na_explicit", refuse)
    torch.manual_seed(0)
    m = NeighborhoodAttention2D(64, 2, 7, attn_drop=0.3, rel_pos_bias=True).cuda().to(dtype)
    x = torch.randn(2, 20, 20, 64, device="cuda", dtype=dtype, requires_grad=True)
    m.train()
    y = m(x)
    y.float().sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all() and torch.isfinite(m.rpb.grad).all()
    m.eval()
    with torch.no_grad():
        assert not torch.equal(y.detach(), m(x))
