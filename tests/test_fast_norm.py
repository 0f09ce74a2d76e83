"""CPU side of nattn/nn/fast_norm.py: which calls it declines before reaching libnattn (the
kernel itself: tests/gpu/test_layer_norm_gpu.py; its C checks: tests/test_cuda_abi.py)."""

import torch

from nattn.nn import fast_norm


def test_cpu_tensors_run_torch_norm():
    x = torch.randn(5, 64)
    assert fast_norm.layer_norm(x, torch.ones(64), torch.zeros(64), 1e-5) is None


def test_switch_is_read_per_call(monkeypatch):
    assert fast_norm.enabled()
    monkeypatch.setenv("NATTN_LAYER_NORM_KERNEL", "0")
    assert not fast_norm.enabled()
    monkeypatch.setenv("NATTN_LAYER_NORM_KERNEL", "1")
    assert fast_norm.enabled()


def test_models_norms_match_torch_on_cpu():
    """The models' LayerNorm on the CPU is torch's, bit for bit (the kernel is CUDA-only)."""
    import importlib

    from torch.nn import functional as F

    common = importlib.import_module("nattn.models._common")
    norm = common.LayerNorm(64)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 7, 64)
    with torch.no_grad():
        assert torch.equal(norm(x), F.layer_norm(x, (64,), norm.weight, norm.bias, 1e-5))
