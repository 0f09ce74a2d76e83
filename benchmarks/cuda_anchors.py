"""Times the cuda backend on the anchor problems (nattn/bench/problems.py), beside the reference
backend and torch's dense SDPA, bf16, forward and forward+backward (ms, medians). libnattn runs its
tensor-core family here on SM80+; NATTN_FAMILY=simt times the SIMT kernels instead, and
NATTN_TC_BOX=model the tensor-core kernels with per-problem box shapes.

    python benchmarks/cuda_anchors.py            # the problems the SIMT kernels run in seconds
    python benchmarks/cuda_anchors.py --large    # also flux/hunyuan (forward only, slow)
"""

import argparse
import math

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import nattn

# name, spatial, batch, heads, head_dim, kernel, dilation (as in nattn/bench/problems.py)
ANCHORS = [
    ("dinat-s1-2d", (56, 56), 32, 4, 32, (7, 7), (1, 1)),
    ("dinat-s2-dil4", (28, 28), 32, 8, 32, (7, 7), (4, 4)),
    ("mid-2d-k13", (128, 128), 4, 8, 64, (13, 13), (1, 1)),
    ("video-3d", (16, 32, 32), 2, 8, 64, (5, 7, 7), (1, 1, 1)),
    ("1d-32k-w2048", (32768,), 1, 8, 128, (2048,), (1,)),
    ("flux-2d-w80", (256, 256), 1, 24, 128, (80, 80), (1, 1)),
    ("hunyuan-3d", (30, 48, 80), 1, 24, 128, (18, 24, 24), (1, 1, 1)),
]
LARGE = {"flux-2d-w80", "hunyuan-3d"}
REFERENCE_MAX_WORK = 1e10  # B*H*N*W*D above which the reference is not timed
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def bench(fn, grads=None, quick=False):
    try:
        return do_bench(fn, warmup=5 if quick else 25, rep=20 if quick else 100,
                        grad_to_none=grads, return_mode="median")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return float("nan")


def run(anchor, cuda_only=False):
    name, spatial, b, h, d, kernel, dil = anchor
    quick = name in LARGE
    na = FUNCS[len(spatial)]
    q, k, v = (torch.randn(b, *spatial, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(b, *spatial, h, d, device="cuda", dtype=torch.bfloat16)
    row = {"name": name}

    def fwd(backend):
        return lambda: na(q, k, v, kernel, dilation=dil, backend=backend)

    def fwd_bwd(backend):
        return lambda: na(q, k, v, kernel, dilation=dil, backend=backend).backward(g)

    with torch.no_grad():
        row["cuda fwd"] = bench(fwd("cuda"), quick=quick)
    row["cuda fwd+bwd"] = float("nan") if quick else bench(fwd_bwd("cuda"), [q, k, v])
    if cuda_only:
        return row
    work = b * h * math.prod(spatial) * math.prod(kernel) * d
    if work <= REFERENCE_MAX_WORK:
        with torch.no_grad():
            row["reference fwd"] = bench(fwd("reference"), quick=True)
    else:
        row["reference fwd"] = float("nan")
    # dense SDPA over all tokens: [B, H, N, D]
    qd, kd, vd = (t.detach().reshape(b, -1, h, d).transpose(1, 2).contiguous().requires_grad_(True)
                  for t in (q, k, v))
    gd = g.reshape(b, -1, h, d).transpose(1, 2).contiguous()
    with torch.no_grad():
        row["dense fwd"] = bench(lambda: F.scaled_dot_product_attention(qd, kd, vd), quick=quick)
    row["dense fwd+bwd"] = float("nan") if quick else bench(
        lambda: F.scaled_dot_product_attention(qd, kd, vd).backward(gd), [qd, kd, vd])
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="also the large-window 2-D/3-D problems")
    ap.add_argument("--only", default="", help="comma-separated anchor names")
    ap.add_argument("--cuda-only", action="store_true", help="time only the cuda backend")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    cols = ["cuda fwd", "cuda fwd+bwd"]
    if not a.cuda_only:
        cols += ["reference fwd", "dense fwd", "dense fwd+bwd"]
    from nattn._cuda import library

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, ms (median); "
          f"libnattn: {library.library_path()}")
    print("| name | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for anchor in ANCHORS:
        if (names and anchor[0] not in names) or (anchor[0] in LARGE and not a.large and not names):
            continue
        row = run(anchor, a.cuda_only)
        cells = ["-" if math.isnan(row[c]) else f"{row[c]:.3f}" for c in cols]
        print(f"| {row['name']} | " + " | ".join(cells) + " |", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
