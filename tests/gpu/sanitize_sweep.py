"""A small sweep of cuda-backend forward+backward calls, meant to run under
``compute-sanitizer --tool memcheck python tests/gpu/sanitize_sweep.py``: every
feature once (strides, GQA, D_v, RPB, causal, dilation, extra KV), all dtypes, 1/2/3-D."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpu_cases import functional_call, make_inputs, poison_kernel_buffers, sweep  # noqa: E402


def main(count=int(os.environ.get("NATTN_SANITIZE_CASES", "24"))):
    poison_kernel_buffers()  # unwritten output rows read NaN
    for case in sweep(count, seed=99):
        t, leaves = make_inputs(case)
        out, lse = functional_call(case, t, 0.0)
        grads = torch.autograd.grad([out, lse], leaves, [torch.randn_like(out), torch.randn_like(lse)])
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), str(case)
        assert all(torch.isfinite(g).all() for g in grads), str(case)
    print(f"sanitize sweep: {count} cases ran")


if __name__ == "__main__":
    main()
