"""Attention dropout (``dropout_p``) on the functional NA calls, through the reference backend
(the oracle the kernels will be tested against): forward and every gradient against an
independent dense brute force with the same mask (nattn/dropout.py), the LSE without dropout,
statistics, reproducibility under ``torch.manual_seed``, argument errors, backends that
decline it, and calls without dropout unchanged."""

import contextlib
import random

import pytest
import torch

import nattn
from cases import random_case
from nattn import dropout
from nattn.backends import BACKENDS, AUTO_ORDER, NoBackendError, choose_na_backend, na_backend_reasons
from nattn.backends.reference import ReferenceBackend
from nattn.params import normalize
from nattn.windows import WindowTable
from oracle import mask_and_bias_index

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


@contextlib.contextmanager
def seeded(seed):
    """``torch.manual_seed(seed)`` inside, the global generator restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def call_rng(seed, device="cpu"):
    """The ``[seed, offset]`` a dropout call makes right after ``torch.manual_seed(seed)``."""
    with seeded(seed):
        return dropout.draw_rng(device)


def make_inputs(case, dtype=torch.float64):
    g = torch.Generator().manual_seed(case.seed)
    shape = (case.batch, *case.spatial)

    def rnd(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)

    t = {"query": rnd(*shape, case.heads, case.dim), "key": rnd(*shape, case.heads_kv, case.dim),
         "value": rnd(*shape, case.heads_kv, case.dim_v)}
    if case.extra:
        t["additional_keys"] = rnd(case.batch, case.extra, case.heads_kv, case.dim)
        t["additional_values"] = rnd(case.batch, case.extra, case.heads_kv, case.dim_v)
    if case.rpb:
        t["rpb"] = rnd(case.heads, *[2 * k - 1 for k in case.kernel])
    return t


def run_nattn(case, t, p, **kw):
    return FUNCS[len(case.spatial)](
        t["query"], t["key"], t["value"], case.kernel, stride=case.stride, dilation=case.dilation,
        is_causal=case.causal, scale=case.scale, additional_keys=t.get("additional_keys"),
        additional_values=t.get("additional_values"), rpb=t.get("rpb"), return_lse=True, dropout_p=p, **kw)


def brute_force(case, t, p, rng):
    """Dense float64 attention over the full neighbourhood mask (tests/oracle.py), every weight
    multiplied by the keep mask over 1 - p where it meets V; the LSE without the mask.
    Element (b, h, i, j): i the row-major query token, j the key token or N + extra index."""
    q, k, v = t["query"], t["key"], t["value"]
    b, *spatial, h, d = q.shape
    hk, dv = k.shape[-2], v.shape[-1]
    scale = d ** -0.5 if case.scale is None else case.scale
    mask, offsets = mask_and_bias_index(spatial, case.kernel, case.stride, case.dilation, case.causal)
    qf = q.double().reshape(b, -1, h, d)
    kf = k.double().reshape(b, -1, hk, d).repeat_interleave(h // hk, dim=2)
    vf = v.double().reshape(b, -1, hk, dv).repeat_interleave(h // hk, dim=2)
    logits = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    if "rpb" in t:
        idx = [o.clamp(0, 2 * case.kernel[x] - 2) for x, o in enumerate(offsets.unbind(-1))]
        bias = t["rpb"].double()[(slice(None),) + tuple(idx)]
        logits = logits + torch.where(mask, bias, torch.zeros((), dtype=torch.float64))[None]
    logits = logits.masked_fill(~mask, float("-inf"))
    if "additional_keys" in t:
        ek = t["additional_keys"].double().repeat_interleave(h // hk, dim=2)
        ev = t["additional_values"].double().repeat_interleave(h // hk, dim=2)
        logits = torch.cat([logits, torch.einsum("bqhd,bkhd->bhqk", qf, ek) * scale], dim=-1)
        vf = torch.cat([vf, ev], dim=1)
    n, n_keys = logits.shape[-2], logits.shape[-1]
    keep = dropout.keep_mask(rng, p, torch.arange(b).view(-1, 1, 1, 1), torch.arange(h).view(1, -1, 1, 1),
                             torch.arange(n).view(1, 1, -1, 1), torch.arange(n_keys).view(1, 1, 1, -1))
    lse = torch.logsumexp(logits, dim=-1)
    weights = torch.softmax(logits, dim=-1) * keep / (1 - p)
    out = torch.einsum("bhqk,bkhe->bqhe", weights, vf)
    return out.reshape(b, *spatial, h, dv), lse.permute(0, 2, 1).reshape(b, *spatial, h), keep


def loss_grads(t, out, lse, g_out, g_lse):
    loss = (out.double() * g_out).sum() + (lse.double() * g_lse).sum()
    names = list(t)
    return dict(zip(names, torch.autograd.grad(loss, [t[n] for n in names])))


def _case(seed, na_dim, **force):
    case = random_case(random.Random(seed), na_dim, max_tokens=90)
    for name, value in force.items():
        setattr(case, name, value)
    return case


# Random problems over every feature (windows, stride, dilation, causal, RPB, GQA, D_v, extra
# keys), plus a few with extra keys and RPB forced in.
CASES = [_case(1000 + i, 1 + i % 3) for i in range(18)]
CASES += [_case(2000 + i, 1 + i % 3, extra=3) for i in range(3)]
CASES += [_case(3000 + i, 2, heads=4, heads_kv=2, extra=2) for i in range(2)]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_and_gradients_match_brute_force(case):
    p = [0.1, 0.3, 0.5, 0.8][case.seed % 4]
    t = make_inputs(case)
    seed = case.seed % 10007
    with seeded(seed):
        out, lse = run_nattn(case, t, p, backend="reference")
    rng = call_rng(seed)
    t64 = {n: x.detach().clone().requires_grad_(True) for n, x in t.items()}
    want_out, want_lse, keep = brute_force(case, t64, p, rng)
    assert 0 < keep.double().mean() < 1 or keep.numel() < 20
    torch.testing.assert_close(out, want_out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    g = torch.Generator().manual_seed(case.seed + 1)
    g_out = torch.randn(want_out.shape, generator=g, dtype=torch.float64)
    g_lse = torch.randn(want_lse.shape, generator=g, dtype=torch.float64)
    got = loss_grads(t, out, lse, g_out, g_lse)
    want = loss_grads(t64, want_out, want_lse, g_out, g_lse)
    for name in t:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-9, msg=lambda m: f"grad {name}: {m}")


def test_gradcheck_with_every_input():
    """torch.autograd.gradcheck (float64) with the seed fixed inside the function: q, k, v,
    RPB and extra keys/values, GQA, dilation, then stride and a causal axis; the LSE output
    has a gradient too."""
    g = torch.Generator().manual_seed(5)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)  # noqa: E731
    q, k, v = rnd(1, 4, 6, 2, 2), rnd(1, 4, 6, 1, 2), rnd(1, 4, 6, 1, 3)
    rpb, ek, ev = rnd(2, 5, 5), rnd(1, 2, 1, 2), rnd(1, 2, 1, 3)

    def with_rpb(q, k, v, rpb, ek, ev):
        with seeded(78):
            return nattn.na2d(q, k, v, 3, dilation=(1, 2), rpb=rpb, additional_keys=ek, additional_values=ev,
                              return_lse=True, dropout_p=0.25)

    def causal(q, k, v, ek, ev):
        with seeded(77):
            return nattn.na2d(q, k, v, (3, 2), stride=(2, 1), is_causal=(False, True), additional_keys=ek,
                              additional_values=ev, return_lse=True, dropout_p=0.4)

    assert torch.autograd.gradcheck(with_rpb, (q, k, v, rpb, ek, ev), fast_mode=True)
    assert torch.autograd.gradcheck(causal, (q, k, v, ek, ev), fast_mode=True)


def test_lse_is_the_lse_without_dropout():
    case = _case(4000, 2, extra=4)
    t = make_inputs(case)
    with torch.no_grad():
        _, lse_drop = run_nattn(case, t, 0.6)
        out, lse = run_nattn(case, t, 0.0)
    torch.testing.assert_close(lse_drop, lse, rtol=0, atol=1e-12)
    # the lse of a forward-only call and of a recorded one agree too
    _, lse_graph = run_nattn(case, t, 0.6)
    torch.testing.assert_close(lse_graph, lse, rtol=0, atol=1e-12)


def test_kept_fraction_and_unbiased_output():
    """Many calls on one problem: the mean output approaches the output without dropout (each
    element within 6 standard deviations of the mask's variance), and the kept fraction of a
    call's weights is ~ 1 - p."""
    p, calls = 0.3, 200
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 9, 11, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        want, lse = nattn.na2d(q, k, v, 5, return_lse=True)
        with seeded(123):
            mean = sum(nattn.na2d(q, k, v, 5, dropout_p=p) for _ in range(calls)) / calls
    # per element: Var(out) = p / (1 - p) * sum_j P_ij^2 v_j^2 (independent keeps)
    mask, _ = mask_and_bias_index((9, 11), (5, 5), (1, 1), (1, 1), (False, False))
    logits = torch.einsum("bqhd,bkhd->bhqk", q.reshape(2, -1, 2, 4), k.reshape(2, -1, 2, 4)) * 0.5
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
    var = p / (1 - p) * torch.einsum("bhqk,bkhe->bqhe", probs ** 2, v.reshape(2, -1, 2, 4) ** 2)
    z = (mean - want).reshape(var.shape) / (var / calls).sqrt()
    assert z.abs().max() < 6, z.abs().max()
    assert 0.5 < (z ** 2).mean() < 1.6
    # kept fraction of one call over its 2 * 99 * 2 * 25 weights + a larger call's
    rng = call_rng(5)
    table = WindowTable((9, 11), (5, 5), (1, 1), (1, 1), (False, False))
    key_idx, _, _ = table.chunk(0, 99)
    factor = dropout.weight_factor(rng, p, 2, 2, 1, torch.arange(99), key_idx, torch.float64)
    assert set(factor.unique().tolist()) <= {0.0, 1 / (1 - p)}
    kept = (factor > 0).double().mean().item()
    assert abs(kept - (1 - p)) < 0.05


def test_same_seed_reproduces_outputs_and_gradients_successive_calls_differ():
    case = _case(5000, 3, extra=2)
    t = make_inputs(case, torch.float32)

    def once(seed):
        for x in t.values():
            x.grad = None
        with seeded(seed):
            out, lse = run_nattn(case, t, 0.5)
            (out.sum() + lse.sum()).backward()
        return out.detach(), {n: x.grad.clone() for n, x in t.items()}

    out1, g1 = once(42)
    out2, g2 = once(42)
    assert torch.equal(out1, out2)
    for n in g1:
        assert torch.equal(g1[n], g2[n]), n
    out3, _ = once(43)
    assert not torch.equal(out1, out3)
    with seeded(42):  # two successive calls under one seed: different masks
        first = run_nattn(case, t, 0.5)[0]
        second = run_nattn(case, t, 0.5)[0]
        rng_a, rng_b = dropout.draw_rng("cpu"), dropout.draw_rng("cpu")
    assert torch.equal(first, out1) and not torch.equal(first, second)
    assert not torch.equal(rng_a, rng_b)


def test_gradient_masks_follow_the_forward():
    """A dropped weight passes no gradient to its value: with every other weight dropped too,
    dV is exactly the brute force's, and a value row no query keeps gets a zero gradient."""
    g = torch.Generator().manual_seed(11)
    q, k = (torch.randn(1, 12, 1, 4, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 12, 1, 4, generator=g, dtype=torch.float64, requires_grad=True)
    with seeded(3):
        out = nattn.na1d(q, k, v, 3, dropout_p=0.9)
    out.sum().backward()
    keep = dropout.keep_mask(call_rng(3), 0.9, 0, 0, torch.arange(12).view(-1, 1), torch.arange(12).view(1, -1))
    mask, _ = mask_and_bias_index((12,), (3,), (1,), (1,), (False,))
    never_kept = ~(keep & mask).any(0)
    assert never_kept.any()  # at p = 0.9 some key is dropped by all three of its queries
    assert (v.grad[0, never_kept] == 0).all()
    assert (v.grad[0, ~never_kept] != 0).any()


def test_dropout_p_validation():
    q = k = v = torch.randn(1, 8, 2, 4)
    for bad in (-0.1, 1.0, 1.5, float("nan"), float("inf"), -1):
        with pytest.raises(ValueError, match=r"dropout_p must be a float in \[0, 1\)"):
            nattn.na1d(q, k, v, 3, dropout_p=bad)
    for bad in ("0.1", True, torch.tensor(0.1), None, [0.1]):
        with pytest.raises(TypeError, match=r"dropout_p must be a float in \[0, 1\)"):
            nattn.na1d(q, k, v, 3, dropout_p=bad)
    with pytest.raises(ValueError, match="dropout_p"):
        normalize(q, k, v, 1, 3, dropout_p=1.0)
    nattn.na1d(q, k, v, 3, dropout_p=0)  # an int 0 is fine: no dropout
    # nothing was drawn for a rejected call
    state = torch.get_rng_state()
    with pytest.raises(ValueError):
        nattn.na1d(q, k, v, 3, dropout_p=2.0)
    assert torch.equal(state, torch.get_rng_state())


def test_backends_without_dropout_decline_it():
    q = k = v = torch.randn(1, 10, 2, 8)
    for name in ("flex", "cuda", "cuda:kv=2"):
        if name.split(":")[0] not in BACKENDS:
            continue
        # a libnattn with dropout (tc family, ABI 3) declines these CPU tensors for their device
        # (tests/test_cuda_dropout.py has its dropout checks); without one, for the dropout
        has_it = BACKENDS[name.split(":")[0]].supports_dropout
        why = "needs CUDA tensors" if has_it else "does not support dropout_p > 0"
        with pytest.raises(NoBackendError, match=rf"{name.split(':')[0]}\S*: {why}"):
            nattn.na1d(q, k, v, 3, backend=name, dropout_p=0.1)
        nattn.na1d(q, k, v, 3, backend="reference", dropout_p=0.1)
    params = normalize(q, k, v, 1, 3, dropout_p=0.2)
    reasons = na_backend_reasons(q, k, v, None, params)
    assert reasons["reference"] == []
    assert all("dropout_p > 0" in " ".join(r) or BACKENDS[n].supports_dropout
               for n, r in reasons.items() if n != "reference")


def test_automatic_dispatch_skips_backends_without_dropout(monkeypatch):
    class Fast(ReferenceBackend):
        name = "fast"
        supports_dropout = False

    monkeypatch.setitem(BACKENDS, "fast", Fast())
    monkeypatch.setattr("nattn.backends.AUTO_ORDER", ["fast"] + list(AUTO_ORDER))
    q = k = v = torch.randn(1, 10, 2, 8)
    assert choose_na_backend(q, k, v, None, normalize(q, k, v, 1, 3)) == "fast"
    with_dropout = [n for n in AUTO_ORDER if BACKENDS[n].supports_dropout][0]  # tiled on the CPU
    assert choose_na_backend(q, k, v, None, normalize(q, k, v, 1, 3, dropout_p=0.1)) == with_dropout
    with nattn.autotune():  # tuning does not reach calls with dropout
        assert choose_na_backend(q, k, v, None, normalize(q, k, v, 1, 3, dropout_p=0.1)) == with_dropout
    with seeded(1):
        out = nattn.na1d(q, k, v, 3, dropout_p=0.3)
    with seeded(1):
        want = nattn.na1d(q, k, v, 3, dropout_p=0.3, backend=with_dropout)
    assert torch.equal(out, want)


def test_zero_dropout_changes_nothing(monkeypatch):
    case = _case(6000, 2, extra=3)
    t = make_inputs(case, torch.float32)
    out0, lse0 = run_nattn(case, t, 0.0)
    (out0.sum() + lse0.sum()).backward()
    g0 = {n: x.grad.clone() for n, x in t.items()}
    for x in t.values():
        x.grad = None

    def fail(*args, **kwargs):
        raise AssertionError("a call without dropout reached the dropout path")

    monkeypatch.setattr(nattn.functional, "draw_rng", fail)
    monkeypatch.setattr(nattn.functional, "na_dropout_forward_only", fail)
    monkeypatch.setattr(nattn.functional.NADropoutFunction, "apply", fail)
    monkeypatch.setattr(nattn.functional, "dense_dropout_forward_only", fail)
    monkeypatch.setattr(nattn.functional.DenseDropoutFunction, "apply", fail)
    state = torch.get_rng_state()
    out = FUNCS[2](t["query"], t["key"], t["value"], case.kernel, stride=case.stride, dilation=case.dilation,
                   is_causal=case.causal, scale=case.scale, additional_keys=t.get("additional_keys"),
                   additional_values=t.get("additional_values"), rpb=t.get("rpb"), return_lse=True)
    assert torch.equal(state, torch.get_rng_state())  # no generator draw
    assert torch.equal(out[0], out0) and torch.equal(out[1], lse0)
    (out[0].sum() + out[1].sum()).backward()
    for n, x in t.items():
        assert torch.equal(x.grad, g0[n]), n
    out_zero = run_nattn(case, t, 0.0)
    assert torch.equal(out_zero[0], out0)
    with torch.no_grad():
        assert torch.equal(run_nattn(case, t, 0)[0], out0)


def test_inference_call_and_meta_tensors():
    case = _case(7000, 1, extra=2)
    t = make_inputs(case)
    with torch.no_grad(), seeded(8):
        out, _ = run_nattn(case, t, 0.2)
    with seeded(8):
        out_graph, _ = run_nattn(case, t, 0.2)
    assert torch.equal(out, out_graph)  # the same mask with and without autograd
    q = torch.empty(1, 16, 2, 8, device="meta")
    out = nattn.na1d(q, q, q, 3, dropout_p=0.5)
    assert out.shape == q.shape and out.device.type == "meta"


def test_custom_ops_with_dropout():
    """The ops carry dropout_p and the rng tensor (a pure function of its inputs), through
    opcheck and through torch.compile(fullgraph=True) on the same numbers as eager."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 6, 5, 2, 4, generator=g, requires_grad=True)
    k = torch.randn(1, 6, 5, 1, 4, generator=g, requires_grad=True)
    v = torch.randn(1, 6, 5, 1, 3, generator=g, requires_grad=True)
    rng = torch.tensor([123456789, 987654321])
    op = torch.ops.nattn.na_forward.default
    torch.library.opcheck(op, (q, k, v, None, [3, 2], [1, 2], [1, 2], [True, False], 0.5, "reference", 0.3, rng))
    qd = q.reshape(1, 30, 2, 4).detach().requires_grad_()
    kd = k.reshape(1, 30, 1, 4).detach().requires_grad_()
    vd = v.reshape(1, 30, 1, 3).detach().requires_grad_()
    torch.library.opcheck(torch.ops.nattn.attention_forward.default,
                          (qd, kd, vd, True, 0.3, "reference", 0.4, rng, 7))
    ek, ev = k[:, 0].detach().requires_grad_(), v[:, 0].detach().requires_grad_()

    def f(q, k, v, ek, ev):
        return nattn.na2d(q, k, v, 3, additional_keys=ek, additional_values=ev, dropout_p=0.4)

    with seeded(4):
        eager = f(q, k, v, ek, ev)
        eager_grads = torch.autograd.grad(eager.sum(), (q, k, v, ek, ev))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with seeded(4):
        out = compiled(q, k, v, ek, ev)
        grads = torch.autograd.grad(out.sum(), (q, k, v, ek, ev))
    torch.testing.assert_close(out, eager)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


def test_chunked_walk_draws_the_same_mask(monkeypatch):
    """Chunks of a few queries (the reference's memory bound) give the one-chunk result: the
    mask depends on global indices only."""
    case = _case(8000, 2, extra=3)
    t = make_inputs(case)
    with seeded(21):
        out, lse = run_nattn(case, t, 0.35)
        grads = torch.autograd.grad(out.sum() + lse.sum(), list(t.values()))
    from nattn.backends import reference_dense, reference_math
    monkeypatch.setattr(reference_math, "CHUNK_ELEMENTS", 1)  # one query per chunk
    monkeypatch.setattr(reference_dense, "CHUNK_ELEMENTS", 1)
    with seeded(21):
        out_c, lse_c = run_nattn(case, t, 0.35)
        grads_c = torch.autograd.grad(out_c.sum() + lse_c.sum(), list(t.values()))
    torch.testing.assert_close(out_c, out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse_c, lse, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_c, grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
def test_dense_reference_with_dropout(is_causal, monkeypatch):
    """The dense reference (NA's extra keys; causal too) against a brute force, in several
    chunks (small causal chunks included), keys numbered from ``key_offset``."""
    from nattn.backends import reference_dense
    monkeypatch.setattr(reference_dense, "CAUSAL_CHUNK", 4)
    g = torch.Generator().manual_seed(12)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)  # noqa: E731
    q, k, v = rnd(2, 11, 4, 3), rnd(2, 11, 2, 3), rnd(2, 11, 2, 5)
    rng, p, offset, scale = torch.tensor([31, 41]), 0.35, 1000, 0.7
    out, lse = reference_dense.forward(q, k, v, is_causal, scale, p, rng, offset)
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, dim=2)) * scale
    if is_causal:
        logits = logits.masked_fill(torch.ones(11, 11, dtype=torch.bool).triu(1), float("-inf"))
    keep = dropout.keep_mask(rng, p, torch.arange(2).view(-1, 1, 1, 1), torch.arange(4).view(1, -1, 1, 1),
                             torch.arange(11).view(1, 1, -1, 1), torch.arange(offset, offset + 11).view(1, 1, 1, -1))
    want = torch.einsum("bhqk,bkhe->bqhe", torch.softmax(logits, -1) * keep / (1 - p), v.repeat_interleave(2, dim=2))
    want_lse = torch.logsumexp(logits, -1).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    g_out, g_lse = torch.randn_like(out), torch.randn_like(lse)
    got = reference_dense.backward(q, k, v, out, lse, g_out, g_lse, is_causal, scale, p, rng, offset)
    ref = torch.autograd.grad((want * g_out).sum() + (want_lse * g_lse).sum(), (q, k, v))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
