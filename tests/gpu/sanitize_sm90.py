"""A small sweep of Hopper-family forwards for compute-sanitizer (memcheck, racecheck,
synccheck): ``NATTN_FAMILY=sm90 compute-sanitizer --tool racecheck python
tests/gpu/sanitize_sm90.py``. NATTN_FAMILY=sm90 makes any case the family declines an error."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import nattn  # noqa: E402
from gpu_cases import make_inputs  # noqa: E402
from sm90_cases import sm90_sweep  # noqa: E402

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def main(count=int(os.environ.get("NATTN_SANITIZE_CASES", "12"))):
    assert os.environ.get("NATTN_FAMILY") == "sm90", "run with NATTN_FAMILY=sm90"
    for case in sm90_sweep(count, seed=77):
        t, _ = make_inputs(case)
        with torch.no_grad():
            out, lse = FUNCS[len(case.spatial)](
                t["query"], t["key"], t["value"], case.kernel, stride=case.stride,
                dilation=case.dilation, is_causal=case.causal, scale=case.scale,
                additional_keys=t.get("additional_keys"), additional_values=t.get("additional_values"),
                rpb=t.get("rpb"), backend="cuda", return_lse=True)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), str(case)
    print(f"sm90 sanitize sweep: {count} cases ran")


if __name__ == "__main__":
    main()
