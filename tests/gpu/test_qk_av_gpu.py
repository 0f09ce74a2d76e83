"""GPU tier: the unfused ops (na{1,2,3}d_qk / na{1,2,3}d_av) on CUDA tensors, against the
same ops in float64 on the CPU (values and gradients), and composed (softmax of the scaled
logits, then av) against the fused cuda op, on fresh random problems."""

import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import nattn  # noqa: E402
from cases import random_window  # noqa: E402
from gpu_cases import rel_err  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

QK = {1: nattn.na1d_qk, 2: nattn.na2d_qk, 3: nattn.na3d_qk}
AV = {1: nattn.na1d_av, 2: nattn.na2d_av, 3: nattn.na3d_av}
FUSED = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def cases(count, seed):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        na = 1 + i % 3
        spatial, kernel, stride, dilation, causal, rpb = random_window(
            rng, na, {1: 600, 2: 500, 3: 600}[na], {1: 17, 2: 7, 3: 5}[na], [1, 1, 2, 3],
            lambda r, kd: kd + r.choice([0, 1, 5]), causal_p=0.25, rpb_p=0.3)
        heads_kv = rng.choice([1, 2])
        out.append(dict(spatial=spatial, kernel=kernel, stride=stride, dilation=dilation, causal=causal,
                        rpb=rpb, batch=rng.choice([1, 2]), heads=heads_kv * rng.choice([1, 2]), heads_kv=heads_kv,
                        dim=rng.choice([16, 32, 64]), dtype=rng.choice([torch.float32, torch.float16, torch.bfloat16]),
                        seed=rng.randint(0, 2**31)))
    return out


CASES = cases(int(os.environ.get("NATTN_QK_AV_GPU_CASES", "60")), seed=2024)


def run(c, q, k, v, rpb):
    n = len(c["spatial"])
    args = (c["kernel"], c["stride"], c["dilation"], c["causal"])
    logits = QK[n](q, k, *args, rpb=rpb)
    weights = logits.float().softmax(-1).to(q.dtype)
    return logits, AV[n](weights, v, *args)


@pytest.mark.parametrize("c", CASES, ids=lambda c: f"{c['spatial']}-k{c['kernel']}-{str(c['dtype'])[6:]}")
def test_qk_av_on_cuda_match_float64_and_fused(c):
    g = torch.Generator().manual_seed(c["seed"])
    b, sp, h, hk, d = c["batch"], c["spatial"], c["heads"], c["heads_kv"], c["dim"]
    scale = d ** -0.5
    cpu = [torch.randn(*s, generator=g, dtype=torch.float64) for s in ((b, *sp, h, d), (b, *sp, hk, d), (b, *sp, hk, d))]
    rpb64 = torch.randn(h, *(2 * x - 1 for x in c["kernel"]), generator=g, dtype=torch.float64) if c["rpb"] else None
    gpu = [x.to("cuda", c["dtype"]).requires_grad_(True) for x in cpu]
    rpb = rpb64.to("cuda").float().requires_grad_(True) if rpb64 is not None else None
    # the 16-bit inputs, as float64 on the CPU: the reference sees exactly what the GPU sees
    ref_in = [x.detach().cpu().double().requires_grad_(True) for x in gpu]
    ref_rpb = rpb.detach().cpu().double().requires_grad_(True) if rpb is not None else None
    logits, out = run(c, gpu[0] * scale, gpu[1], gpu[2], rpb)
    ref_logits, ref_out = run(c, ref_in[0] * scale, ref_in[1], ref_in[2], ref_rpb)
    finite = torch.isfinite(ref_logits)
    assert torch.equal(torch.isfinite(logits.cpu()), finite)  # the same -inf slots (causal)
    tol = TOL[c["dtype"]]
    assert rel_err(logits.cpu()[finite], ref_logits[finite]) <= tol
    assert torch.isfinite(out).all() and rel_err(out.cpu(), ref_out) <= tol
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    leaves, ref_leaves = gpu + ([rpb] if rpb is not None else []), ref_in + ([ref_rpb] if ref_rpb is not None else [])
    grads = torch.autograd.grad(out, leaves, go.to("cuda", out.dtype))
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, go)
    for got, want in zip(grads, ref_grads):
        assert torch.isfinite(got).all() and rel_err(got.cpu(), want) <= 3 * tol
    # composed = fused (the cuda backend, or whatever the dispatch picks on this GPU)
    fused = FUSED[len(sp)](gpu[0], gpu[1], gpu[2], c["kernel"], c["stride"], c["dilation"], c["causal"], scale, rpb=rpb)
    assert rel_err(out.detach().cpu(), fused.detach().cpu().double()) <= 2 * tol


def cuda_inputs(c, g):
    """Fresh q, k, v (and the RPB table when the case has one) on the GPU, needing gradients."""
    q, k, v = (torch.randn(c["batch"], *c["spatial"], heads, c["dim"], generator=g, device="cuda",
                           dtype=c["dtype"]).requires_grad_(True) for heads in (c["heads"], c["heads_kv"], c["heads_kv"]))
    rpb = (torch.randn(c["heads"], *(2 * x - 1 for x in c["kernel"]), generator=g, device="cuda").requires_grad_(True)
           if c["rpb"] else None)
    return q, k, v, rpb


@pytest.mark.parametrize("c", CASES[:24], ids=lambda c: f"{c['spatial']}-k{c['kernel']}-{str(c['dtype'])[6:]}")
def test_window_kernels_match_the_pytorch_path_and_repeat_bitwise(c, monkeypatch):
    """libnattn's window kernels (the default for these CUDA tensors) against the plain
    PyTorch path on the same CUDA inputs, values and gradients; the kernels' gradients
    (a fixed walk per key, no atomics) are bitwise equal across two runs."""
    from nattn import qk_av, qk_av_kernels

    assert qk_av_kernels.available(torch.empty(1, device="cuda", dtype=c["dtype"]), len(c["spatial"]), c["dim"])
    d = c["dim"]
    q, k, v, rpb = cuda_inputs(c, torch.Generator(device="cuda").manual_seed(c["seed"]))
    leaves = [q, k, v] + ([rpb] if rpb is not None else [])

    def both():
        logits, out = run(c, q * d ** -0.5, k, v, rpb)
        go = torch.randn(out.shape, generator=torch.Generator(device="cuda").manual_seed(1), device="cuda").to(out.dtype)
        return (logits, out) + torch.autograd.grad(out, leaves, go)

    fast = both()
    again = both()
    monkeypatch.setattr(qk_av, "USE_KERNELS", False)
    slow = both()
    tol = TOL[c["dtype"]]
    finite = torch.isfinite(slow[0])
    assert torch.equal(torch.isfinite(fast[0]), finite)
    assert rel_err(fast[0][finite].cpu(), slow[0][finite].cpu().double()) <= tol
    for got, want in zip(fast[1:], slow[1:]):
        assert torch.isfinite(got).all() and rel_err(got.cpu(), want.cpu().double()) <= 3 * tol
    for x, y in zip(fast[2:5], again[2:5]):  # dq, dk, dv
        assert torch.equal(x, y)


def test_window_kernels_on_a_dinat_layer():
    """A DiNAT-sized problem (many blocks, the kernels' grid-stride loops): composed unfused
    ops equal the fused op, forward and gradients."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 56, 56, 4, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    w = nattn.na2d_qk(q * 32 ** -0.5, k, 7, dilation=2).float().softmax(-1).to(q.dtype)
    out = nattn.na2d_av(w, v, 7, dilation=2)
    fused = nattn.na2d(q, k, v, 7, dilation=2)
    assert rel_err(out.detach().float().cpu(), fused.detach().float().cpu()) <= 2e-2
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), go)
    want = torch.autograd.grad(fused, (q, k, v), go)
    for x, y in zip(got, want):
        assert torch.isfinite(x).all() and rel_err(x.float().cpu(), y.float().cpu()) <= 4e-2


@pytest.mark.parametrize("c", CASES[24:36], ids=lambda c: f"{c['spatial']}-k{c['kernel']}-{str(c['dtype'])[6:]}")
def test_explicit_weights_path_on_window_kernels(c, monkeypatch):
    """nattn.nn.na_explicit (the modules' attention-dropout path) on the window kernels
    against its gather path, with the same weights hook (a fixed random mask), extra keys
    included; values and gradients."""
    from nattn import qk_av
    from nattn.nn.unfused import na_explicit
    from nattn.params import NAParams

    g = torch.Generator(device="cuda").manual_seed(c["seed"])
    b, sp, h, hk, d = c["batch"], c["spatial"], c["heads"], c["heads_kv"], c["dim"]
    q, k, v, rpb = cuda_inputs(c, g)
    xk, xv = (torch.randn(b, 3, hk, d, generator=g, device="cuda", dtype=c["dtype"]) for _ in range(2))
    params = NAParams(tuple(c["kernel"]), tuple(c["stride"]), tuple(c["dilation"]), tuple(c["causal"]), d ** -0.5)
    window = 1
    for x in c["kernel"]:
        window *= x
    mask = (torch.rand(b, *sp, h, window + 3, generator=g, device="cuda") > 0.2).to(c["dtype"]) / 0.8
    hook = lambda w: w * mask.reshape(w.shape)  # noqa: E731
    leaves = [q, k, v] + ([rpb] if rpb is not None else [])

    def run():
        out = na_explicit(q, k, v, params, rpb, xk, xv, weights_hook=hook)
        go = torch.randn(out.shape, generator=torch.Generator(device="cuda").manual_seed(3), device="cuda")
        return (out,) + torch.autograd.grad(out, leaves, go.to(out.dtype))

    fast = run()
    monkeypatch.setattr(qk_av, "USE_KERNELS", False)
    slow = run()
    tol = TOL[c["dtype"]]
    for got, want in zip(fast, slow):
        assert torch.isfinite(got).all() and rel_err(got.float().cpu(), want.float().cpu()) <= 3 * tol
