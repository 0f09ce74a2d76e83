"""GPU tier: torch.compile over nattn on CUDA tensors. The CUDA dispatch (libnattn, the GPU's
capability, the tuner) broke the graph on torch 2.11 where the CPU's did not: one break per
NA call split every NAT/DiNAT model into ~35 graphs (sixth session), then three per call
("Unsupported method call", seventh session); compiled calls now choose inside the op
(nattn/backends/deferred.py). Each module here must trace to one graph and compile with
fullgraph=True, forward and backward equal to eager."""

import pytest
import torch

from nattn.nn import NeighborhoodAttention1D, NeighborhoodAttention2D, NeighborhoodAttention3D

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

MODULES = [
    (lambda: NeighborhoodAttention1D(64, 4, 9), (2, 40, 64)),
    (lambda: NeighborhoodAttention2D(64, 4, 7, dilation=2, rel_pos_bias=True), (2, 20, 18, 64)),
    (lambda: NeighborhoodAttention3D(64, 2, (3, 5, 5), is_causal=(True, False, False)), (1, 6, 10, 12, 64)),
]


@pytest.mark.parametrize("make,shape", MODULES, ids=["1d", "2d-dil-rpb", "3d-causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_na_modules_trace_to_one_graph_and_match_eager(make, shape, dtype):
    torch.manual_seed(0)
    m = make().cuda().to(dtype)
    x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(m)(x)
    reasons = [(str(r.reason), [str(f) for f in r.user_stack[-3:]]) for r in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    compiled = torch.compile(m, fullgraph=True)
    out = compiled(x)
    grad = torch.randn_like(out)
    (gx,) = torch.autograd.grad(out, x, grad)
    ref = m(x)
    (ref_gx,) = torch.autograd.grad(ref, x, grad)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert torch.isfinite(out).all() and torch.isfinite(gx).all()
    assert (out.float() - ref.float()).norm() <= tol * ref.float().norm()
    assert (gx.float() - ref_gx.float()).norm() <= tol * ref_gx.float().norm()


@pytest.mark.parametrize("make,shape", MODULES[1:2], ids=["2d-dil-rpb"])
def test_na_module_under_cuda_graphs_matches_eager(make, shape):
    """torch.compile(mode="reduce-overhead"): the NA ops are captured into CUDA graphs and
    replayed; three steps (warm-up, recording, replay) each equal eager, forward and backward."""
    torch.manual_seed(0)
    m = make().cuda().to(torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(m, mode="reduce-overhead", fullgraph=True)
    for step in range(3):
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # the module keeps the width
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(x)
        (gx,) = torch.autograd.grad(out, x, grad)
        out, gx = out.clone(), gx.clone()  # graph outputs are overwritten by the next replay
        ref = m(x)
        (ref_gx,) = torch.autograd.grad(ref, x, grad)
        assert torch.isfinite(out).all() and torch.isfinite(gx).all()
        assert (out.float() - ref.float()).norm() <= 2e-2 * ref.float().norm(), step
        assert (gx.float() - ref_gx.float()).norm() <= 2e-2 * ref_gx.float().norm(), step


def test_nat_model_under_autocast_one_graph_no_recompile(monkeypatch):
    """A NAT model compiled under bf16 autocast as a fresh process compiles it: one graph
    (fullgraph=True), and a second training step without recompiling. On torch 2.11 the
    models' autocast query broke the graph while its cache was empty (the break split the
    model into per-stage frames, a recompile then traced them with dynamic shapes, and
    inductor crashed in get_pw_red_splits: issue 13's crash), and the cache written while
    tracing made the second call recompile. The grouped parameter casts run in the graph."""
    import timm

    import nattn.models  # noqa: F401  (registers the models)
    from nattn import _eager

    monkeypatch.setattr(_eager, "_AUTOCAST_AVAILABLE", {})  # as in a fresh process
    torch.manual_seed(torch.seed() % 2**31)
    model = timm.create_model("nat_mini", num_classes=10, depths=(1, 1, 2, 1), drop_path_rate=0.0).cuda()
    x = torch.randn(2, 3, 64, 64, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for second in (False, True):
        with torch._dynamo.config.patch(error_on_recompile=second), torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled(x)
        out.float().square().mean().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = model(x)
    assert torch.isfinite(out).all()
    assert (out.float() - ref.float()).norm() <= 2e-2 * ref.float().norm()
