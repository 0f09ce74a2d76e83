"""One sm90 forward (with --backward: forward + backward) per named anchor problem, for Nsight
Compute:

    NATTN_FAMILY=sm90 ncu --clock-control none -k regex:forward_kernel --section SpeedOfLight \\
        --section WarpStateStats --section ComputeWorkloadAnalysis python3 benchmarks/sm90_profile.py hunyuan-3d
    NATTN_FAMILY=sm90 ncu ... -k regex:backward_dkv_kernel ... python3 benchmarks/sm90_profile.py --backward flux-2d-w80

`--rpb`: every call with a relative positional bias (float32 [H, 2k-1, ...]; its gradient under
`--backward`), as NAT / DiNAT layers run. NATTN_FAMILY=tc profiles the tensor-core family the same
way. (benchmarks/ncu_stalls.py summarises where the warps wait.)
"""

import sys

import torch

import nattn
from nattn.bench import ANCHORS

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}

backward = "--backward" in sys.argv[1:]
with_rpb = "--rpb" in sys.argv[1:]
for name in (a for a in sys.argv[1:] if not a.startswith("--")):
    p = next(x for x in ANCHORS if x.name == name)
    q, k, v = (torch.randn(p.batch, *p.spatial, p.heads, p.dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=backward) for _ in range(3))
    rpb = (torch.randn(p.heads, *(2 * w - 1 for w in p.kernel), device="cuda", requires_grad=backward)
           if with_rpb else None)
    with torch.set_grad_enabled(backward):
        out = FUNCS[p.na_dim](q, k, v, p.kernel, dilation=p.dilation, stride=p.stride, rpb=rpb,
                                   backend="cuda")
    if backward:
        out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
