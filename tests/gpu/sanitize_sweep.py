"""A small sweep of cuda-backend forward+backward calls, meant to run under
``compute-sanitizer --tool memcheck python tests/gpu/sanitize_sweep.py``: every
feature once (strides, GQA, D_v, RPB, causal, dilation, extra KV), all dtypes, 1/2/3-D."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import nattn  # noqa: E402
from gpu_cases import make_inputs, sweep  # noqa: E402

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def main(count=int(os.environ.get("NATTN_SANITIZE_CASES", "24"))):
    for case in sweep(count, seed=99):
        t, leaves = make_inputs(case)
        out, lse = FUNCS[len(case.spatial)](
            t["query"], t["key"], t["value"], case.kernel, stride=case.stride,
            dilation=case.dilation, is_causal=case.causal, scale=case.scale,
            additional_keys=t.get("additional_keys"), additional_values=t.get("additional_values"),
            rpb=t.get("rpb"), backend="cuda", return_lse=True)
        grads = torch.autograd.grad([out, lse], leaves, [torch.randn_like(out), torch.randn_like(lse)])
        torch.cuda.synchronize()
        assert all(torch.isfinite(g).all() for g in grads), str(case)
    print(f"sanitize sweep: {count} cases ran")


if __name__ == "__main__":
    main()
