"""The flex backend on CUDA with gradients: a random sweep against the reference.

Run on the device: ``python -m pytest -m gpu tests/gpu/test_flex_gpu.py``.
The big sweep drives an eager FlexBackend directly (forward and the recompute backward,
LSE gradient included) so that 100+ shapes cost no compilation; a smaller sweep goes
through ``nattn.naXd(backend="flex")`` with the compiled kernel, extra keys/values and
autograd end to end, against the float64 oracle.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

import nattn  # noqa: E402
from nattn.backends import BACKENDS  # noqa: E402
from nattn.params import NAParams  # noqa: E402
from cases import sweep  # noqa: E402
from test_reference_vs_oracle import assert_close, grads, make_inputs, run_nattn, run_oracle  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def _cuda_case(case):
    """Head dims compiled flex accepts on CUDA (power of two >= 16)."""
    case.dim = max(16, case.dim)
    case.dim_v = max(16, case.dim_v)
    return case


SWEEP = [_cuda_case(c) for c in sweep(120, seed=4242)]
# Each compiled case costs a flex compilation (forward and backward): keep the list short,
# but cover 1-D/2-D/3-D, RPB, GQA, D_v != D and extra keys in both precisions.
COMPILED = [(_cuda_case(c), dt) for c, dt in zip(sweep(6, seed=31), [torch.float32, torch.bfloat16] * 3)]
COMPILED[0][0].extra = 3  # extra keys: the LSE feeds the merge, so its gradient is non-zero
COMPILED[3][0].extra = 5
COMPILED[4][0].dim_v = 32  # D_v != D


def _params(case, dim):
    scale = dim ** -0.5 if case.scale is None else case.scale
    return NAParams(case.kernel, case.stride, case.dilation, case.causal, scale)


@pytest.mark.parametrize("case, dtype", COMPILED, ids=lambda x: str(x))
def test_compiled_flex_autograd_vs_oracle(case, dtype):
    tol = (2e-4, 2e-4) if dtype == torch.float32 else (6e-2, 6e-2)
    t = {n: x.detach().cuda().requires_grad_(True) for n, x in make_inputs(case, dtype).items()}
    out, lse = run_nattn(case, t, backend="flex")
    t64 = {n: x.detach().double().cpu().requires_grad_(True) for n, x in t.items()}
    ref_out, ref_lse = run_oracle(case, t64)  # the oracle builds its mask on the CPU
    assert_close("out", out.cpu(), ref_out, *tol)
    assert_close("lse", lse.cpu(), ref_lse, *tol)
    g = torch.Generator().manual_seed(case.seed + 1)
    g_out = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    g_lse = torch.randn(ref_lse.shape, generator=g, dtype=torch.float64)
    got = grads(t, out, lse, g_out.cuda(), g_lse.cuda())
    want = grads(t64, ref_out, ref_lse, g_out, g_lse)
    for name in t:
        assert_close(f"grad {name}", got[name].cpu(), want[name], *tol)


def test_auto_dispatch_picks_flex_or_faster_on_cuda():
    q = torch.randn(1, 16, 16, 2, 32, device="cuda", dtype=torch.bfloat16)
    params = NAParams((5, 5), (1, 1), (1, 1), (False, False), 0.2)
    from nattn.backends import choose_na_backend

    assert choose_na_backend(q, q, q, None, params) != "reference"


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def test_backward_runs_the_compiled_kernel():
    """nattn's flex fwd+bwd (the composite path: flex's own compiled backward under autograd)
    must run compiled flex, not torch's eager flex (which materializes every score): no graph
    break, and not far from flex's own autograd on row-major tokens."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from nattn.backends.flex_mask import NeighborhoodMask

    torch.manual_seed(0)
    shape = (4, 48, 48, 4, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    breaks = _graph_breaks()

    def nattn_step():
        out = nattn.na2d(q, k, v, 7, backend="flex")
        torch.autograd.grad(out, (q, k, v), g)

    mask = NeighborhoodMask((48, 48), (7, 7), (1, 1), (1, 1), (False, False), "cuda", tile=(1, 1),
                            group_by_dilation=False)
    n = 48 * 48
    block_mask = create_block_mask(mask.mask_mod(), None, None, n, n, device="cuda", _compile=True)
    compiled = torch.compile(flex_attention)
    qf, kf, vf = (t.detach().reshape(4, n, 4, 64).transpose(1, 2).requires_grad_(True) for t in (q, k, v))
    gf = g.reshape(4, n, 4, 64).transpose(1, 2)

    def flex_step():
        out = compiled(qf, kf, vf, block_mask=block_mask)
        torch.autograd.grad(out, (qf, kf, vf), gf)

    def ms(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / 10

    t_nattn, t_flex = ms(nattn_step), ms(flex_step)
    print(f"fwd+bwd: nattn flex {t_nattn:.3f} ms, flex's own autograd {t_flex:.3f} ms")
    assert _graph_breaks() == breaks, "graph break: flex ran (partly) eagerly"
    # The tile permutations (copies) on top: well under 3x, unless eager.
    assert t_nattn < 3 * t_flex + 0.5, (t_nattn, t_flex)


# Last: 120 cases, the slowest part; the compiled (composite) path above runs first.
@pytest.mark.parametrize("case", SWEEP, ids=str)
def test_eager_flex_forward_backward_vs_reference(case):
    from nattn.backends.flex import FlexBackend

    flex, ref = FlexBackend(compile=False), BACKENDS["reference"]
    t = {n: x.detach().cuda() for n, x in make_inputs(case, torch.float32, requires_grad=False).items()}
    q, k, v, rpb = t["query"], t["key"], t["value"], t.get("rpb")
    params = _params(case, case.dim)
    out, lse = flex.na_forward(q, k, v, rpb, params)
    r_out, r_lse = ref.na_forward(q.double(), k.double(), v.double(), None if rpb is None else rpb.double(), params)
    assert_close("out", out, r_out, 1e-4, 1e-4)
    assert_close("lse", lse, r_lse, 1e-4, 1e-4)
    g = torch.Generator(device="cuda").manual_seed(case.seed)
    g_out = torch.randn(out.shape, generator=g, device="cuda")
    g_lse = torch.randn(lse.shape, generator=g, device="cuda")
    got = flex.na_backward(q, k, v, rpb, out, lse, g_out, g_lse, params)
    want = ref.na_backward(q.double(), k.double(), v.double(), None if rpb is None else rpb.double(),
                           r_out, r_lse, g_out.double(), g_lse.double(), params)
    for name, a, b in zip(("dq", "dk", "dv", "drpb"), got, want):
        if b is None:
            assert a is None
            continue
        assert_close(name, a, b, 2e-4, 2e-4)
