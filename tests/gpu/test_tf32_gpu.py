"""GPU tier: float32 through TF32 tensor cores (libnattn's tensor-core family, its float32
instances; ABI 4) against the float64 reference, and float32 without TF32 exactly as before.

Run on a CUDA machine (SM80+) with ``pytest -m gpu tests/gpu/test_tf32_gpu.py -n 0``. Each sweep
case draws fresh random float32 inputs (every window feature: 1-D/2-D/3-D, odd and even
kernels, dilation, stride, causal, GQA, RPB, extra keys/values, D != D_v up to 128, strided
layouts) and runs the functional call on the cuda backend twice: with torch's TF32 switch on
(``torch.backends.cuda.matmul.allow_tf32``, which nattn reads on every call) and off. Output,
LSE and the gradients of every input (a random gradient into the LSE as well as the output)
are compared with the reference backend run in float64 on copies of the inputs:

* switch on: TF32 tolerances (relative L2 error TOL_TF32, gradients twice that; operands keep a
  10-bit mantissa, so errors are ~5e-4 relative per operand), and the result must differ from
  the exact one by more than fp32 rounding (the TF32 kernels ran);
* switch off: the tight float32 tolerance of test_cuda_vs_reference.py, and bit for bit the
  output of NATTN_FAMILY=simt (the SIMT family, as before this feature).

Besides: attention dropout with TF32 (the TF32 instances run it; switch off, the SIMT family
does, exactly), the switch flipped between calls in one process, determinism of the forward, the
largest shared-memory configuration (head dim 128 with a staged dRPB table), and (compute
capability 9.0) that NATTN_FAMILY=sm90 still runs float32 on the tensor-core family.
"""

import contextlib
import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import nattn  # noqa: E402
from gpu_cases import GpuCase, check, make_inputs, random_case, rel_err  # noqa: E402
from nattn import _call_cache, _tf32, dropout  # noqa: E402
from nattn._cuda import library  # noqa: E402
from nattn.backends import BACKENDS, choose_na_backend, heuristics  # noqa: E402
from nattn.params import normalize  # noqa: E402


pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability()[0] < 8:
    pytest.skip("TF32 runs on the tensor-core family (SM80+)", allow_module_level=True)
_LIB = library.load()
if _LIB is None or not getattr(_LIB, "tf32", None):
    pytest.skip("the loaded libnattn has no TF32 kernels: rebuild it (ABI 4)", allow_module_level=True)

CUDA, REF = BACKENDS["cuda"], BACKENDS["reference"]
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
HEAD_DIMS = (8, 16, 24, 32, 40, 64, 72, 96, 128)
# Relative L2 error allowed against float64: TF32 (gradients twice that) and exact float32
# (test_cuda_vs_reference.py's).
TOL_TF32, TOL_LSE_TF32 = 5e-3, 2e-3
TOL_F32, TOL_LSE_F32 = 2e-5, 1e-5
N_CASES = int(os.environ.get("NATTN_GPU_TF32_CASES", "300"))


@contextlib.contextmanager
def tf32(on: bool):
    """torch's switch for TF32 in float32 matmuls (the legacy attribute only: the tier runs in
    one process, and torch refuses to read allow_tf32 once the newer API has been mixed in)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        assert _tf32.allowed() is on
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch):
    for name in ("NATTN_FAMILY", "NATTN_TC_BOX"):
        monkeypatch.delenv(name, raising=False)
    with tf32(False):
        yield


def sweep(count, seed, wide=False):
    rng = random.Random(seed)
    # float32 problems the TF32 instances take: D and D_v <= 128
    return [random_case(rng, 1 + i % 3, wide, (torch.float32,), HEAD_DIMS) for i in range(count)]


CASES = sweep(N_CASES, 1357)
WIDE_CASES = sweep(int(os.environ.get("NATTN_GPU_TF32_WIDE_CASES", "24")), 2468, wide=True)
NAMES = ("query", "key", "value", "additional_keys", "additional_values", "rpb")


def inputs(case):
    """The case's float32 inputs (in its layout) and their names, all differentiable."""
    t, _ = make_inputs(case)
    return t, [n for n in NAMES if n in t]


def run(case, t, backend, dropout_p=0.0):
    return FUNCS[len(case.spatial)](
        t["query"], t["key"], t["value"], case.kernel, stride=case.stride, dilation=case.dilation,
        is_causal=case.causal, scale=case.scale, additional_keys=t.get("additional_keys"),
        additional_values=t.get("additional_values"), rpb=t.get("rpb"), backend=backend, return_lse=True,
        dropout_p=dropout_p,
    )


def forward_backward(case, t, names, backend):
    """Output, LSE and the gradients of the named inputs, with a random gradient into both."""
    out, lse = run(case, t, backend)
    g = torch.Generator(device="cuda").manual_seed(case.seed + 1)
    g_out = torch.randn(out.shape, generator=g, device="cuda", dtype=torch.float32).to(out.dtype)
    g_lse = torch.randn(lse.shape, generator=g, device="cuda", dtype=torch.float32).to(lse.dtype)
    grads = torch.autograd.grad([out, lse], [t[n] for n in names], [g_out, g_lse])
    return out.detach(), lse.detach(), grads


def reference64(case, t, names):
    """The reference backend in float64 on copies of the float32 inputs."""
    t64 = {n: t[n].detach().double().requires_grad_(True) for n in names}
    return forward_backward(case, t64, names, "reference")


def check_all(case, names, got, want, tol, tol_lse):
    (o, l, gs), (o64, l64, gs64) = got, want
    check("out", o, o64, tol)
    check("lse", l, l64, tol_lse)
    for name, g, g64 in zip(names, gs, gs64):
        check(f"grad {name}", g, g64, 2 * tol)


def compare(case):
    t, names = inputs(case)
    params = normalize(t["query"], t["key"], t["value"], len(case.spatial), case.kernel, case.stride,
                       case.dilation, case.causal, case.scale, t.get("rpb"))
    assert CUDA.na_not_supported_reasons(t["query"], t["key"], t["value"], t.get("rpb"), params, True) == []
    want = reference64(case, t, names)
    with tf32(True):
        assert heuristics.runs_tensor_cores(t["query"], t["value"])
        fast = forward_backward(case, t, names, "cuda")
    exact = forward_backward(case, t, names, "cuda")
    check_all(case, names, fast, want, TOL_TF32, TOL_LSE_TF32)
    check_all(case, names, exact, want, TOL_F32, TOL_LSE_F32)
    # the switch chose the kernels: TF32 rounding shows in the output, well above fp32's
    assert rel_err(fast[0], exact[0]) > 1e-6, "allow_tf32 left the float32 output exact: TF32 did not run"
    return exact


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c}" for i, c in enumerate(CASES)])
def test_tf32_matches_float64_reference(case):
    compare(case)


@pytest.mark.parametrize("case", WIDE_CASES, ids=[f"wide{i}-{c}" for i, c in enumerate(WIDE_CASES)])
def test_tf32_matches_float64_reference_wide_windows(case):
    compare(case)


PLAIN_CASES = [c for c in CASES if not c.extra][:24]  # the extra keys' dense backward may use atomics


@pytest.mark.parametrize("case", PLAIN_CASES, ids=[f"{i}-{c}" for i, c in enumerate(PLAIN_CASES)])
def test_switch_off_is_the_simt_family_bit_for_bit(case, monkeypatch):
    """Without TF32 float32 runs the SIMT family as before: the same bits as NATTN_FAMILY=simt."""
    t, names = inputs(case)
    default = forward_backward(case, t, names, "cuda")
    monkeypatch.setenv("NATTN_FAMILY", "simt")
    simt = forward_backward(case, t, names, "cuda")
    assert torch.equal(default[0], simt[0]) and torch.equal(default[1], simt[1])
    for name, a, b in zip(names, default[2], simt[2]):
        if name != "rpb":  # dRPB: float atomics
            assert torch.equal(a, b), f"grad {name} differs from the SIMT family's"


def test_switch_is_read_on_every_call():
    """Flipping torch's switch between calls in one process flips the kernels: the same bits
    each time for each setting (the TF32 forward is deterministic)."""
    case = CASES[1]
    t, _ = inputs(case)
    outs = {}
    for on in (True, False, True, False, True):
        with tf32(on):
            with torch.no_grad():
                out, lse = run(case, t, "cuda")
        if on in outs:
            assert torch.equal(outs[on][0], out) and torch.equal(outs[on][1], lse), on
        outs[on] = (out, lse)
    assert rel_err(outs[True][0], outs[False][0]) > 1e-6


def test_largest_shared_memory_configuration():
    """Head dim 128 (2-warp blocks, 82.5 / 99 KiB) with a 25x25 window's RPB table for 4 query
    heads a KV head staged in the dK/dV pass (39 KiB more), D != D_v, GQA and dilation."""
    case = GpuCase(spatial=(40, 52), kernel=(25, 25), stride=(1, 1), dilation=(1, 2), causal=(False, False),
                   batch=2, heads=8, heads_kv=2, dim=128, dim_v=120, extra=0, rpb=True, dtype=torch.float32,
                   layout="plain", scale=None, seed=11)
    compare(case)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("i", range(12))
def test_tf32_dropout_matches_float64_reference(i, p):
    """Attention dropout runs on the TF32 instances: the same mask as the reference's (global
    indices, common/philox.cuh), TF32 tolerances. With the switch off the SIMT family runs it
    (float32 tolerances)."""
    case = sweep(12, 97531)[i]
    t, _ = inputs(case)
    q, k, v = (t[n].detach() for n in ("query", "key", "value"))
    rpb = t["rpb"].detach() if "rpb" in t else None
    params = normalize(q, k, v, len(case.spatial), case.kernel, case.stride, case.dilation, case.causal,
                       case.scale, rpb, dropout_p=p)
    assert CUDA.na_not_supported_reasons(q, k, v, rpb, params, True) == []
    rng = dropout.draw_rng("cuda")
    g = torch.Generator(device="cuda").manual_seed(case.seed + 1)
    g_out = torch.randn(*q.shape[:-1], v.shape[-1], generator=g, device="cuda")
    g_lse = torch.randn(q.shape[:-1], generator=g, device="cuda")
    with tf32(True):
        assert CUDA.na_not_supported_reasons(q, k, v, rpb, params, True) == []
        out, lse = CUDA.na_forward(q, k, v, rpb, params, rng=rng)
        grads = CUDA.na_backward(q, k, v, rpb, out, lse, g_out, g_lse, params, rng=rng)
    d = [None if x is None else x.double() for x in (q, k, v, rpb, g_out, g_lse)]
    out64, lse64 = REF.na_forward(d[0], d[1], d[2], d[3], params, rng=rng)
    grads64 = REF.na_backward(d[0], d[1], d[2], d[3], out64, lse64, d[4], d[5], params, rng=rng)
    check("out", out, out64, TOL_TF32)
    check("lse", lse, lse64, TOL_LSE_TF32)
    for name, gc, gr in zip(("dq", "dk", "dv", "drpb"), grads, grads64):
        if gr is None:
            assert gc is None
            continue
        check(name, gc, gr, 2 * TOL_TF32)
    out_exact, _ = CUDA.na_forward(q, k, v, rpb, params, rng=rng)  # switch off: the SIMT family
    check("out (TF32 off)", out_exact, out64, 5e-5)  # dropout scales the terms: test_dropout_simt_gpu.py


def test_dispatch_follows_the_switch(monkeypatch):
    """A float32 dropout call goes to cuda with TF32 on (the TF32 instances) and off (the SIMT
    family); the call cache keys the choice by the switch, so flipping it between calls runs
    the exact kernels again, bit for bit those of NATTN_FAMILY=simt."""
    _call_cache.clear()
    q = torch.randn(1, 24, 24, 2, 32, device="cuda")
    params = normalize(q, q, q, 2, 7, dropout_p=0.2)
    assert choose_na_backend(q, q, q, None, params) == "cuda"
    with tf32(True):
        assert choose_na_backend(q, q, q, None, params) == "cuda"
        torch.manual_seed(0)
        fast = nattn.na2d(q, q, q, 7, dropout_p=0.2)  # the functional call, cached under the switch
    torch.manual_seed(0)
    exact = nattn.na2d(q, q, q, 7, dropout_p=0.2)  # switch off: not the cached TF32 choice
    monkeypatch.setenv("NATTN_FAMILY", "simt")
    _call_cache.clear()
    torch.manual_seed(0)
    assert torch.equal(exact, nattn.na2d(q, q, q, 7, dropout_p=0.2))
    assert not torch.equal(fast, exact)


@pytest.mark.skipif(torch.cuda.get_device_capability() != (9, 0), reason="needs compute capability 9.0")
def test_hopper_cap_still_runs_float32_on_the_tensor_core_family(monkeypatch):
    """The Hopper family has no float32: NATTN_FAMILY=sm90 leaves TF32 calls on the tensor-core
    family (the same bits as without it)."""
    case = CASES[4]
    t, _ = inputs(case)
    with tf32(True), torch.no_grad():
        want = run(case, t, "cuda")
        monkeypatch.setenv("NATTN_FAMILY", "sm90")
        got = run(case, t, "cuda")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
