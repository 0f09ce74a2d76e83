"""GPU tier: the modules' packed q/k/v path on the cuda backend (nattn/_eager.py,
NAPackedFunction): the kernels write dq, dk and dv into strided views of one d(qkv). Fresh
random modules and inputs: against a float64 copy of the module on the reference backend,
and against the q/k/v path's gradients (which take the same kernels with contiguous dq / dk /
dv: bitwise equal without an RPB, whose gradient is summed with atomics); a layout's second
call (the backend's cached template and offsets, no views) against its first."""

import random

import pytest
import torch

from nattn import functional
from nattn.nn import NeighborhoodAttention1D, NeighborhoodAttention2D, NeighborhoodAttention3D

from gpu_cases import built_space, check

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

CLASSES = {1: NeighborhoodAttention1D, 2: NeighborhoodAttention2D, 3: NeighborhoodAttention3D}
SEED = random.randrange(2**31)
DTYPES, HEAD_DIMS = built_space((torch.bfloat16, torch.float16), (32, 64, 128))


def random_module(rng: random.Random):
    na_dim = rng.choice((1, 2, 2, 3))
    head_dim, heads = rng.choice(HEAD_DIMS), rng.choice((1, 2, 3))
    kernel = tuple(rng.choice((3, 5, 7) if na_dim < 3 else (3, 5)) for _ in range(na_dim))
    dilation = tuple(rng.choice((1, 1, 2)) for _ in range(na_dim))
    spatial = tuple(rng.randint(k * d, k * d + 9) for k, d in zip(kernel, dilation))
    rpb = rng.random() < 0.4
    causal = tuple(rng.random() < 0.2 for _ in range(na_dim)) if not rpb else (False,) * na_dim
    kw = dict(kernel_size=kernel, dilation=dilation, is_causal=causal, rel_pos_bias=rpb)
    return CLASSES[na_dim], head_dim * heads, heads, kw, (rng.randint(1, 2), *spatial)


@pytest.mark.parametrize("i", range(24))
def test_packed_path_against_float64_and_the_qkv_path(i, monkeypatch):
    rng = random.Random(SEED + i)
    cls, dim, heads, kw, lead = random_module(rng)
    dtype = rng.choice(DTYPES)
    torch.manual_seed(SEED + i)
    layer = cls(dim, heads, backend="cuda", **kw).cuda().to(dtype)
    ref = cls(dim, heads, backend="reference", **kw).cuda().double()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(*lead, dim, device="cuda")
    g = torch.randn(*lead, dim, device="cuda")

    def run(m, dt):
        xi = x.to(dt).requires_grad_()
        y = m(xi)
        y.backward(g.to(dt))
        grads = {n: p.grad for n, p in m.named_parameters()}
        m.zero_grad(set_to_none=True)
        return y.detach(), xi.grad, grads

    applied = []
    real = functional.NAPackedFunction.apply
    monkeypatch.setattr(functional.NAPackedFunction, "apply", lambda *a: applied.append(1) or real(*a))
    y, gx, gp = run(layer, dtype)
    assert applied == [1], "the module did not take the packed path"
    ry, rgx, rgp = run(ref, torch.float64)
    where = f"case {i} (seed {SEED}): {cls.__name__} dim {dim} heads {heads} {kw} {lead} {dtype}"

    def same_as_first(other, label):
        """The first run's output bitwise, and its gradients bitwise without an RPB (whose
        gradient is summed with atomics: x.grad close then)."""
        oy, ogx, ogp = other
        assert torch.equal(y, oy), f"{label}, {where}"
        if not kw["rel_pos_bias"]:
            assert torch.equal(gx, ogx), f"{label}, {where}"
            for name in gp:
                assert torch.equal(gp[name], ogp[name]), f"{name}, {label}, {where}"
        else:
            check(f"x.grad, {label}, {where}", ogx, gx, 1e-2)

    # A layout's first call goes through the q / k / v views; the next ones through the
    # backend's cached template and offsets (CudaBackend.na_forward_packed): the same results,
    # training and inference.
    same_as_first(run(layer, dtype), "the cached layout")
    with torch.no_grad():
        y_infer = [layer(x.to(dtype)) for _ in range(2)]
    assert all(torch.equal(t, y) for t in y_infer), where
    check(f"out, {where}", y, ry, 2e-2)
    check(f"x.grad, {where}", gx, rgx, 3e-2)
    for name in gp:
        check(f"{name}.grad, {where}", gp[name], rgp[name], 3e-2)

    monkeypatch.setattr(functional.NAPackedFunction, "apply", real)
    monkeypatch.setattr("nattn.nn.neighborhood_attention.na_packed_qkv", lambda *a, **k: None)
    same_as_first(run(layer, dtype), "the q/k/v path")
