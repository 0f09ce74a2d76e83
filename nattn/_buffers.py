"""Uninitialized buffers that libnattn's kernels fill (``torch.empty`` / ``torch.empty_like``):
the outputs, gradients and workspaces of the cuda backend, of the window ops
(nattn/qk_av_kernels.py) and of the LayerNorm kernel (nattn/nn/fast_norm.py).

They are reached through this module's names so that the GPU tests can hand out buffers
filled with NaN instead (tests/gpu/conftest.py): a kernel that leaves part of its output
unwritten, or reads a workspace row nothing wrote, then fails on every run, not only when
the caching allocator happens to return a block that an earlier test left NaN in (the strip
backward's delta under a query range did, once in a whole GPU tier)."""

import torch

empty = torch.empty
empty_like = torch.empty_like
