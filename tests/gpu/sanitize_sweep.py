"""A small sweep of cuda-backend forward+backward calls, meant to run under
``compute-sanitizer --tool memcheck python tests/gpu/sanitize_sweep.py``: every
feature once (strides, GQA, D_v, RPB, causal, dilation, extra KV), all dtypes, 1/2/3-D."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from gpu_cases import poison_kernel_buffers, run_finite, sweep  # noqa: E402


def main(count=int(os.environ.get("NATTN_SANITIZE_CASES", "24"))):
    poison_kernel_buffers()  # unwritten output rows read NaN
    run_finite(sweep(count, seed=99))
    print(f"sanitize sweep: {count} cases ran")


if __name__ == "__main__":
    main()
