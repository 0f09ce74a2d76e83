"""A query whose whole neighbourhood is masked to -inf (an RPB table used as a mask).

SEMANTICS.md: with extra keys the answer is attention over the extra keys alone; with no
finite logit anywhere the output is 0 and the LSE -inf. Gradients stay finite, and the
reference, flex (CPU forward) and the modules' unfused path agree.
"""

import warnings

import pytest
import torch

import nattn
from nattn.nn import na_explicit
from nattn.params import normalize
from oracle import oracle

FUNCS = {1: nattn.na1d, 2: nattn.na2d}
SHAPES = {1: ((11,), (5,)), 2: ((6, 7), (3, 5))}
NEG_INF = float("-inf")


def _inputs(na_dim, heads, heads_kv, extra):
    """Fresh random inputs; rpb masks all of head 0 and a random half of head 1's offsets
    (never offset 0: every query of head 1 keeps itself, so the oracle stays defined)."""
    seed = torch.randint(0, 2**31, ()).item()
    g = torch.Generator().manual_seed(seed)
    spatial, kernel = SHAPES[na_dim]

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    t = {"query": rnd(2, *spatial, heads, 8), "key": rnd(2, *spatial, heads_kv, 8),
         "value": rnd(2, *spatial, heads_kv, 6)}
    if extra:
        t["additional_keys"] = rnd(2, 3, heads_kv, 8)
        t["additional_values"] = rnd(2, 3, heads_kv, 6)
    rpb = rnd(heads, *(2 * k - 1 for k in kernel))
    rpb[0] = NEG_INF
    rpb[1].masked_fill_(torch.rand(rpb[1].shape, generator=g) < 0.5, NEG_INF)
    rpb[(1,) + tuple(k - 1 for k in kernel)] = 0.0
    t["rpb"] = rpb
    return seed, kernel, {n: x.requires_grad_(True) for n, x in t.items()}


def _run(na_dim, kernel, t, backend="reference"):
    return FUNCS[na_dim](t["query"], t["key"], t["value"], kernel, rpb=t["rpb"], backend=backend,
                         additional_keys=t.get("additional_keys"),
                         additional_values=t.get("additional_values"), return_lse=True)


def _grads(t, out, lse, g_out, g_lse):
    names = list(t)
    return dict(zip(names, torch.autograd.grad([out, lse], [t[n] for n in names], [g_out, g_lse])))


@pytest.mark.parametrize("na_dim", [1, 2])
def test_masked_neighbourhood_with_extra_keys_is_attention_over_extras(na_dim):
    seed, kernel, t = _inputs(na_dim, heads=4, heads_kv=2, extra=True)
    out, lse = _run(na_dim, kernel, t)
    want_out, want_lse = oracle(t["query"], t["key"], t["value"], kernel, (1,) * na_dim, (1,) * na_dim,
                                (False,) * na_dim, rpb=t["rpb"], extra_k=t["additional_keys"],
                                extra_v=t["additional_values"])
    # Head 0 sees only the extra keys (head 0 uses key/value head 0: GQA groups of 2).
    b, heads = out.shape[0], out.shape[-2]
    q0 = t["query"][..., :1, :].reshape(b, -1, 1, 8)
    extra_only = nattn.attention(q0, t["additional_keys"][..., :1, :], t["additional_values"][..., :1, :])
    torch.testing.assert_close(out[..., 0, :], extra_only.reshape(out[..., 0, :].shape),
                               msg=lambda m: f"seed {seed}: {m}")
    torch.testing.assert_close(out, want_out, msg=lambda m: f"seed {seed}: {m}")
    torch.testing.assert_close(lse, want_lse, msg=lambda m: f"seed {seed}: {m}")
    g_out, g_lse = torch.randn_like(out), torch.randn_like(lse)
    got = _grads(t, out, lse, g_out, g_lse)
    want = _grads(t, want_out, want_lse, g_out, g_lse)
    for name in t:
        assert torch.isfinite(got[name]).all(), f"seed {seed}: grad {name} not finite"
        torch.testing.assert_close(got[name], want[name], msg=lambda m: f"seed {seed}: grad {name}: {m}")


@pytest.mark.parametrize("na_dim", [1, 2])
def test_no_finite_logit_gives_zero_output_and_minus_inf_lse(na_dim):
    seed, kernel, t = _inputs(na_dim, heads=3, heads_kv=3, extra=False)
    out, lse = _run(na_dim, kernel, t)
    assert (out[..., 0, :] == 0).all() and (lse[..., 0] == NEG_INF).all(), f"seed {seed}"
    rest = {n: x[..., 1:, :] if n != "rpb" else x[1:] for n, x in t.items()}
    want_out, want_lse = oracle(rest["query"], rest["key"], rest["value"], kernel, (1,) * na_dim,
                                (1,) * na_dim, (False,) * na_dim, rpb=rest["rpb"])
    torch.testing.assert_close(out[..., 1:, :], want_out, msg=lambda m: f"seed {seed}: {m}")
    torch.testing.assert_close(lse[..., 1:], want_lse, msg=lambda m: f"seed {seed}: {m}")
    g_out, g_lse = torch.randn_like(out), torch.randn_like(lse)
    got = _grads(t, out, lse, g_out, g_lse)
    want = torch.autograd.grad([want_out, want_lse], [rest[n] for n in t], [g_out[..., 1:, :], g_lse[..., 1:]])
    for name, w in zip(t, want):
        assert torch.isfinite(got[name]).all(), f"seed {seed}: grad {name} not finite"
        head0 = got[name][0] if name == "rpb" else got[name][..., 0, :]
        assert (head0 == 0).all(), f"seed {seed}: grad {name} of the masked head"
        rest_grad = got[name][1:] if name == "rpb" else got[name][..., 1:, :]
        torch.testing.assert_close(rest_grad, w, msg=lambda m: f"seed {seed}: grad {name}: {m}")


@pytest.mark.parametrize("extra", [False, True])
def test_backends_and_unfused_path_agree_on_masked_rows(extra):
    seed, kernel, t = _inputs(2, heads=2, heads_kv=1, extra=extra)
    out, lse = _run(2, kernel, t)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex_out, flex_lse = _run(2, kernel, t, backend="flex")
    torch.testing.assert_close(flex_out, out, msg=lambda m: f"seed {seed}: flex: {m}")
    torch.testing.assert_close(flex_lse, lse, msg=lambda m: f"seed {seed}: flex: {m}")

    params = normalize(t["query"], t["key"], t["value"], 2, kernel)
    explicit = na_explicit(t["query"], t["key"], t["value"], params, t["rpb"],
                           t.get("additional_keys"), t.get("additional_values"))
    torch.testing.assert_close(explicit, out, msg=lambda m: f"seed {seed}: unfused: {m}")
    g_out = torch.randn_like(out)
    a = torch.autograd.grad(out, list(t.values()), g_out)
    b = torch.autograd.grad(explicit, list(t.values()), g_out)
    for name, x, y in zip(t, a, b):
        assert torch.isfinite(y).all(), f"seed {seed}: unfused grad {name} not finite"
        torch.testing.assert_close(y, x, msg=lambda m: f"seed {seed}: unfused grad {name}: {m}")
