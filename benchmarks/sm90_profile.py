"""One sm90 forward per named anchor problem, for Nsight Compute:

    NATTN_FAMILY=sm90 ncu --clock-control none -k regex:forward_kernel --section SpeedOfLight \\
        --section WarpStateStats --section ComputeWorkloadAnalysis python3 benchmarks/sm90_profile.py hunyuan-3d
"""

import sys

import torch

import nattn
from nattn.bench import ANCHORS

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}

for name in sys.argv[1:]:
    p = next(x for x in ANCHORS if x.name == name)
    q, k, v = (torch.randn(p.batch, *p.spatial, p.heads, p.dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    with torch.no_grad():
        FUNCS[p.na_dim](q, k, v, p.kernel, dilation=p.dilation, stride=p.stride, backend="cuda")
    torch.cuda.synchronize()
