"""GPU tier: the casts an eager NAT training step issues under CUDA bf16 autocast. CUDA
autocast promotes addcmul's inputs to its widest dtype through cast kernels, so the blocks'
residual add of a dropped-path branch (NABlock._add_branch) runs outside autocast: no
forward cast widens a bf16 activation to float32, and the step's values equal those of the
promoted op. Fresh random weights and inputs."""

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nattn.models  # noqa: F401  (registers the timm models)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
timm = pytest.importorskip("timm")


class _Widenings(TorchDispatchMode):
    """bf16 -> float32 casts of tensors with at least `size` elements issued from a block's
    residual add (the stem's and downsamplers' LayerNorms widen their bf16 conv outputs
    under autocast, as torch's autocast lists say)."""

    def __init__(self, size):
        super().__init__()
        self.size, self.count = size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func is torch.ops.aten._to_copy.default and args[0].dtype == torch.bfloat16
                and out.dtype == torch.float32 and args[0].numel() >= self.size
                and any(f.name == "_add_branch" for f in traceback.extract_stack())):
            self.count += 1
        return out


def test_no_activation_widening_casts_in_the_forward():
    torch.manual_seed(torch.seed() % 2**31)
    model = timm.create_model("nat_mini", num_classes=10, drop_path_rate=0.3, depths=(2, 1, 2, 1)).cuda().train()
    x = torch.randn(4, 3, 64, 64, device="cuda")
    smallest = 4 * 2 * 2 * 512  # the last stage's activations
    with _Widenings(smallest) as seen, torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(x)
    assert seen.count == 0
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    y.float().square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_branch_add_equals_the_promoted_op():
    from nattn.models._common import NABlock

    seed = torch.seed() % 2**31
    blk = NABlock(64, 2, 7, drop_path=0.5, layer_scale=0.5).cuda().train()
    x = torch.randn(64, 9, 9, 64, device="cuda", requires_grad=True)
    y = torch.randn(64, 9, 9, 64, device="cuda").to(torch.bfloat16).requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.manual_seed(seed)
        out = blk._add_branch(x, y, blk.gamma1)
    torch.manual_seed(seed)
    mask = y.new_empty(64, 1, 1, 1).bernoulli_(0.5).div_(0.5)
    want = torch.addcmul(x, y.float(), (mask * blk.gamma1).float())
    assert out.dtype == torch.float32 and torch.equal(out, want)
    out.backward(torch.ones_like(out))
    assert y.grad.dtype == torch.bfloat16 and x.grad.dtype == torch.float32
