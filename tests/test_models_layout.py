"""The NA models' data path makes no layout copies: channels-last activations go into qkv,
NA runs on the heads-last view of its output and proj reads NA's output, forward and
backward, with no .contiguous() round trips. Counted with a dispatch mode around a training
step whose NA calls go to a do-nothing backend (the backends' own work is theirs); the only
copies allowed are the Swin-style 2x2 patch merging of DiNAT_s (a reshape of a permute)."""

import collections
import os
import sys
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nattn  # noqa: F401
import nattn.models  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import host_overhead  # noqa: E402
from backend_registry import temporarily_registered  # noqa: E402

timm = pytest.importorskip("timm")
COPIES = {"aten.copy_.default", "aten.clone.default", "aten._to_copy.default"}
ALLOWED = {"dinat_s.py"}  # the patch merging's permute + reshape (as timm's Swin)
# Copies with no nattn frame on the stack run in autograd's backward: DiNAT_s's three patch
# merges each copy their gradient back through the permute; nothing else may.
BACKWARD_COPIES = {"dinat_s_tiny": 3}


class CopyCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.where = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in COPIES:
            frames = [f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_stack()
                      if "/models/" in f.filename or "/nattn/" in f.filename]
            self.where[frames[-1] if frames else "torch"] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def null_backend():
    """The do-nothing backend, registered for one test only (it would otherwise join the
    automatic order of every later test in this process)."""
    with temporarily_registered(host_overhead.null_backend()):
        yield


@pytest.mark.parametrize("name", ["nat_mini", "dinat_mini", "dinat_s_tiny", "nat_isotropic_small"])
def test_a_training_step_makes_no_layout_copies(name, null_backend):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10)
    for m in model.modules():
        if hasattr(m, "kernel_size") and hasattr(m, "backend"):
            m.backend = "null"
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 224, 224).to(memory_format=torch.channels_last).requires_grad_(True)
    counter = CopyCounter()
    with counter:
        model(x).sum().backward()
    backward = counter.where.pop("torch", 0)
    assert backward == BACKWARD_COPIES.get(name, 0), counter.where
    unexpected = {k: n for k, n in counter.where.items() if k.split(":")[0] not in ALLOWED}
    assert not unexpected, unexpected
