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


def test_add_layer_norm_declines_cpu_tensors_and_the_switch(monkeypatch):
    x, r = torch.randn(5, 64), torch.randn(5, 64).bfloat16()
    assert fast_norm.add_layer_norm(x, r, torch.ones(64), None, 1e-5) is None
    assert fast_norm.fused_add_enabled()
    monkeypatch.setenv("NATTN_FUSED_ADD_NORM", "0")
    assert not fast_norm.fused_add_enabled()


def test_models_add_norm_is_add_then_norm_on_cpu():
    """The blocks' residual add with norm2 (``add_norm``) on the CPU: torch's add and norm, bit
    for bit, for both norms, at float32 and under bf16 autocast."""
    import importlib

    common = importlib.import_module("nattn.models._common")
    for cls in (common.LayerNorm, common.BranchLayerNorm):
        norm = cls(64)
        torch.nn.init.normal_(norm.weight)
        torch.nn.init.normal_(norm.bias)
        x, r = torch.randn(3, 7, 64), torch.randn(3, 7, 64)
        for amp in (False, True):
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=amp):
                rb = r.bfloat16() if amp else r
                s, h = norm.add_norm(x, rb)
                assert torch.equal(s, x + rb) and s.dtype == torch.float32
                assert torch.equal(h, norm(x + rb))


def _stage(seed=0):
    import importlib

    import timm

    importlib.import_module("nattn.models")
    torch.manual_seed(seed)
    model = timm.create_model("nat_mini").eval()
    for m in model.modules():  # non-trivial norms
        if isinstance(m, torch.nn.LayerNorm):
            torch.nn.init.normal_(m.weight)
            torch.nn.init.normal_(m.bias)
    return model.stages[0]


def test_chained_blocks_equal_the_blocks(monkeypatch):
    """A stage's chained blocks (each residual add moved into the next norm's ``add_norm``)
    give its blocks' output bit for bit; on the CPU the chain is off, and forcing it on runs
    torch's add and norm in the new order."""
    stage = _stage()
    x = torch.randn(2, 14, 14, stage.blocks[0].norm1.normalized_shape[0])
    from nattn.models import _common

    with torch.no_grad():
        assert not _common.chains_adds(stage.blocks, x)  # CPU tensors
        plain = stage(x)
        monkeypatch.setattr(_common, "chains_adds", lambda blocks, x: True)
        chained = stage(x)
    assert torch.equal(plain, chained)


def test_isotropic_blocks_chain(monkeypatch):
    """An isotropic model (its blocks are the sequence) chains them too, with the same logits."""
    import importlib

    import timm

    from nattn.models import _common

    importlib.import_module("nattn.models")
    torch.manual_seed(0)
    model = timm.create_model("nat_isotropic_small").eval()
    calls = []
    real = _common.NABlock.forward_chained

    def counted(self, x, pending):
        calls.append(1)
        return real(self, x, pending)

    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        plain = model(x)
        monkeypatch.setattr(_common, "chains_adds", lambda blocks, x: True)
        monkeypatch.setattr(_common.NABlock, "forward_chained", counted)
        chained = model(x)
    assert len(calls) == len(model.blocks)
    assert torch.equal(plain, chained)


def test_chain_needs_plain_adds_and_no_hooks():
    """Layer scale, stochastic depth at work or a forward hook (on the module or global) keeps
    a block on its own forward."""
    from timm.layers import DropPath

    from nattn.models._common import _hooked

    block = _stage().blocks[0]
    assert block._plain_adds() and not _hooked(block, block.norm1, block.norm2)
    block.gamma1 = block.gamma2 = torch.nn.Parameter(torch.ones(block.norm1.normalized_shape[0]))
    assert not block._plain_adds()
    block.gamma1 = block.gamma2 = None
    block.drop_path = DropPath(0.1)
    block.train()
    assert not block._plain_adds()
    block.eval()
    assert block._plain_adds()
    handle = block.norm2.register_forward_hook(lambda *args: None)
    assert _hooked(block.norm2) and not _hooked(block.norm1)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert _hooked(block.norm1)
    finally:
        handle.remove()
    assert not _hooked(block.norm1)
