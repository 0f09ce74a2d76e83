"""GPU tier: the Hopper forward's split-KV (``backend="cuda:kv=<n>"``, or with a named 1-D tile
pair): n CTAs per query box over slices of its key boxes, merged through their LSE. Fresh
random 1-D problems (RPB, causal, stride, dilation, GQA, extra keys, slices past the last key
box, both 1-D pairs) against the reference, output and LSE; a 2-D pair declines with the
reason."""

import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import nattn  # noqa: E402
from gpu_cases import make_inputs, rel_err  # noqa: E402
from sm90_cases import random_sm90_case  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


def cases(count, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        c = random_sm90_case(rng, 1, wide=rng.random() < 0.5)
        pair = rng.choice(["", "q128_k128", "q128_k64"] + (["q64_k128"] if c.dim <= 64 else []))
        out.append((c, pair, rng.choice([2, 3, 4, 8, 16])))
    return out


CASES = cases(int(os.environ.get("NATTN_SPLIT_KV_CASES", "240")), seed=6061)


def run(case, t, backend):
    with torch.no_grad():
        return FUNCS[len(case.spatial)](
            t["query"], t["key"], t["value"], case.kernel, stride=case.stride, dilation=case.dilation,
            is_causal=case.causal, scale=case.scale, additional_keys=t.get("additional_keys"),
            additional_values=t.get("additional_values"), rpb=t.get("rpb"), backend=backend, return_lse=True)


@pytest.mark.parametrize("case,pair,splits", CASES, ids=[f"{i}-kv{s}-{p or 'default'}-{c}" for i, (c, p, s) in enumerate(CASES)])
def test_split_kv_matches_the_reference(case, pair, splits):
    t, _ = make_inputs(case)
    name = f"cuda:{pair + '+' if pair else ''}kv={splits}"
    out, lse = run(case, t, name)
    ref_out, ref_lse = run(case, t, "reference")
    for what, got, want, tol in (("out", out, ref_out, TOL[case.dtype]), ("lse", lse, ref_lse, 1e-4)):
        assert torch.isfinite(got).all(), f"{what}: non-finite values"
        assert rel_err(got, want) <= tol, f"{what}: relative L2 error {rel_err(got, want):.3e}"


def test_split_kv_on_a_2d_pair_is_declined_with_the_reason():
    q = torch.randn(1, 64, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="split-KV .* runs on 1-D tile pairs only"):
        nattn.na2d(q, q, q, 33, backend="cuda:q8x16_k8x16+kv=4")
