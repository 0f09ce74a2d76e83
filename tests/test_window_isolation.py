"""A NaN/Inf in a key or value reaches only the queries whose window holds it.

Out-of-window keys are kept out by selection, never by a zero probability times the
value (``0 * NaN = NaN``): causal windows near the start (invalid, clamped slots) in NA,
the causal triangle in dense attention, and the modules' unfused path. Each query that
does not attend the poisoned token gets the output and query gradient of a clean run.
"""

import random

import pytest
import torch

import nattn
from nattn.nn import na_explicit
from nattn.params import normalize
from oracle import mask_and_bias_index

FUNCS = {1: nattn.na1d, 2: nattn.na2d}
POISON = [float("nan"), float("inf"), float("-inf")]


def _causal_problem(rng, na_dim):
    """Random window arguments with a causal axis and (mostly) a stride > 1."""
    kernel, stride, dilation, spatial, causal = [], [], [], [], []
    for axis in range(na_dim):
        k = rng.randint(2, 5)
        d = rng.choice([1, 1, 2])
        kernel.append(k); dilation.append(d)
        spatial.append(rng.randint(k * d, k * d + 6))
        stride.append(rng.randint(1, k) if rng.random() < 0.3 else rng.randint(min(2, k), k))
        causal.append(axis == 0 or rng.random() < 0.5)
    return tuple(spatial), tuple(kernel), tuple(stride), tuple(dilation), tuple(causal)


def _poisoned(rng, x, token, where):
    y = x.detach().clone()
    flat = y.view(y.shape[0], -1, *y.shape[-2:])
    flat[rng.randrange(y.shape[0]), token, rng.randrange(y.shape[-2]), rng.randrange(y.shape[-1])] = where
    return y.requires_grad_(True)


def _check_isolated(seed, run, q, k, v, blind, rng):
    """``run(q, k, v) -> out``; ``blind [N]``: queries that must not see the poisoned token."""
    token_k, token_v = rng.choice(["k", "v", "kv"]), rng.choice(POISON)
    q = q.detach().requires_grad_(True)
    clean_out = run(q, k, v)
    g = torch.randn_like(clean_out)
    (clean_dq,) = torch.autograd.grad(clean_out, q, g)
    k2 = _poisoned(rng, k, blind.token, token_v) if "k" in token_k else k
    v2 = _poisoned(rng, v, blind.token, token_v) if "v" in token_k else v
    out = run(q, k2, v2)
    (dq,) = torch.autograd.grad(out, q, g)
    b = out.shape[0]
    rows = blind.rows
    msg = f"seed {seed}: {token_v} in {token_k} at token {blind.token}"
    for name, got, want in (("out", out, clean_out), ("dq", dq, clean_dq)):
        got, want = got.reshape(b, -1, *got.shape[-2:])[:, rows], want.reshape(b, -1, *want.shape[-2:])[:, rows]
        assert torch.isfinite(got).all(), f"{msg}: {name} of a query that does not attend it is not finite"
        torch.testing.assert_close(got, want, msg=lambda m: f"{msg}: {name}: {m}")


class _Blind:
    """A token to poison and the queries that must not see it; ``hard`` (if given and not
    empty) lists tokens an implementation is likely to touch, chosen half of the time."""

    def __init__(self, mask, rng, hard=()):
        candidates = [j for j in range(mask.shape[0]) if not mask[:, j].all()]
        hard = [j for j in hard if j in candidates]
        self.token = rng.choice(hard if hard and rng.random() < 0.5 else candidates)
        self.rows = (~mask[:, self.token]).nonzero().flatten()


def _clamped_slot_tokens(spatial, kernel, stride, dilation, causal):
    """Tokens that some query's causal window gathers into a slot it does not attend."""
    from nattn.windows import WindowTable

    table = WindowTable(spatial, kernel, stride, dilation, causal)
    key, valid, _ = table.chunk(0, table.num_tokens)
    return sorted(set(key[~valid].tolist()))


@pytest.mark.parametrize("na_dim", [1, 2])
@pytest.mark.parametrize("path", ["reference", "unfused"])
def test_causal_strided_na_isolates_non_finite_keys_and_values(na_dim, path):
    seed = torch.randint(0, 2**31, ()).item()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for _ in range(6):  # several random problems per draw
        spatial, kernel, stride, dilation, causal = _causal_problem(rng, na_dim)
        mask, _ = mask_and_bias_index(spatial, kernel, stride, dilation, causal)
        q, k, v = (torch.randn(2, *spatial, 2, 4, dtype=torch.float64) for _ in range(3))
        params = normalize(q, k, v, na_dim, kernel, stride, dilation, causal)

        def run(q, k, v):
            if path == "unfused":
                return na_explicit(q, k, v, params)
            return FUNCS[na_dim](q, k, v, kernel, stride, dilation, causal, backend="reference")

        _check_isolated(f"{seed} {spatial} k{kernel} s{stride} d{dilation} c{causal}", run, q, k, v,
                        _Blind(mask, rng, _clamped_slot_tokens(spatial, kernel, stride, dilation, causal)), rng)


@pytest.mark.parametrize("heads,heads_kv", [(2, 2), (4, 1)])
def test_dense_causal_isolates_future_keys_and_values(heads, heads_kv, monkeypatch):
    from nattn.backends import reference_dense

    seed = torch.randint(0, 2**31, ()).item()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    n = rng.randint(5, 40)
    monkeypatch.setattr(reference_dense, "CHUNK_ELEMENTS", rng.choice([1 << 22, 200, 3000]))  # several chunks
    q = torch.randn(2, n, heads, 4, dtype=torch.float64)
    k, v = (torch.randn(2, n, heads_kv, 4, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    _check_isolated(f"{seed} n{n}", lambda q, k, v: nattn.attention(q, k, v, is_causal=True),
                    q, k, v, _Blind(mask, rng), rng)
