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
