"""torch.compile(fullgraph=True) of a NAT model on the CPU: forward and a training step
(loss and every parameter gradient) equal eager; a graph break anywhere in the model,
nattn's ops included, fails the compile. The GPU machine's throughput runs are separate
(benchmarks/model_throughput.py)."""

import pytest
import timm
import torch

import nattn.models  # noqa: F401  (registers the timm models)


def test_nat_mini_compiles_fullgraph_forward_and_training_step():
    torch.manual_seed(0)
    model = timm.create_model("nat_mini", num_classes=10, drop_path_rate=0.0)
    x = torch.randn(2, 3, 64, 64)
    compiled = torch.compile(model, fullgraph=True)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    model.train()
    loss = compiled(x).square().mean()
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    want_loss = model(x).square().mean()
    want_loss.backward()
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-3, atol=1e-5, msg=n)


def _casts_in_forward_graph(model, x):
    """One compiled training step under CPU bf16 autocast through AOT autograd with eager
    kernels (no inductor: the same numerics as eager); returns the output, the gradients
    and the number of dtype casts in the compiled forward and backward graphs."""
    from torch._dynamo.backends.common import aot_autograd

    casts = []
    cast_ops = (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)

    def counting_compiler(gm, _):  # AOT calls it for the forward graph, then the backward's
        casts.append(sum(n.target in cast_ops for n in gm.graph.nodes))
        return gm

    compiled = torch.compile(model, fullgraph=True, backend=aot_autograd(fw_compiler=counting_compiler))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = compiled(x)
    y.float().square().sum().backward()
    return y, {n: p.grad for n, p in model.named_parameters()}, casts


def test_compiled_grouped_casts_same_values_fewer_casts_no_recompile(monkeypatch):
    """While compiling, the blocks' parameters are cast in grouped ops of the graph
    (param_cast.traced_casts): logits and gradients bitwise those of autocast's own casts,
    far fewer casts in the forward graph (each cast weight is a kernel once inductor
    compiles it), and a second step runs without recompiling (a cache written while tracing
    once made every compiled model recompile on its second call)."""
    torch.manual_seed(torch.seed() % 2**31)
    depths = (2, 1, 2, 1)
    grouped = timm.create_model("nat_mini", num_classes=7, drop_path_rate=0.0, depths=depths)
    with torch.no_grad():  # gains and biases that are not round numbers in bf16
        for p in grouped.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    plain = timm.create_model("nat_mini", num_classes=7, drop_path_rate=0.0, depths=depths)
    plain.load_state_dict(grouped.state_dict())
    plain.group_casts = False
    x = torch.randn(2, 3, 48, 48)
    from nattn import _eager

    monkeypatch.setattr(_eager, "_AUTOCAST_AVAILABLE", {})  # as in a fresh process (torch 2.11 broke the graph there)
    torch._dynamo.reset()
    ya, ga, ca = _casts_in_forward_graph(grouped, x)
    yb, gb, cb = _casts_in_forward_graph(plain, x)
    assert ya.dtype == torch.bfloat16 and torch.isfinite(ya).all()
    assert torch.equal(ya, yb)
    for n in ga:
        assert torch.equal(ga[n], gb[n]), n
    blocks = sum(depths)
    # per block without groups: 4 Linears x (weight, bias) + 2 norms x (weight, bias), forward
    # and their gradients' casts back to float32
    assert len(ca) == len(cb) == 2, (ca, cb)
    assert ca[0] <= cb[0] - 10 * blocks and ca[1] <= cb[1] - 10 * blocks, (ca, cb)
    torch._dynamo.reset()
    compiled = torch.compile(grouped, fullgraph=True, backend="aot_eager")
    for second in (False, True):
        with torch._dynamo.config.patch(error_on_recompile=second), torch.autocast("cpu", dtype=torch.bfloat16):
            compiled(x).float().sum().backward()
