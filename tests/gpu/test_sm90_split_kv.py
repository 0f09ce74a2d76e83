"""GPU tier: the Hopper forward's split-KV (``backend="cuda:kv=<n>"``, or with a named tile
pair): n CTAs per query box over slices of its key boxes (along axis 0), merged through
their LSE. Fresh random 1-D, 2-D and 3-D problems (RPB, causal, stride, dilation, GQA, extra
keys, slices past the last key box, every tile pair) against the reference, output and LSE;
a problem the Hopper family cannot take fails with the reason."""

import os
import random
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import nattn  # noqa: E402
from gpu_cases import TOL, make_inputs, rel_err  # noqa: E402
from sm90_cases import random_sm90_case  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


# The tile pairs (SM90_TILES): 128-query pairs at every head dim; 64-query pairs at head dims
# <= 64 with RPB tables of <= 4096 entries per head (split-KV: not the 3-D one at 32).
PAIRS = {1: ["q128_k128", "q128_k64"], 2: ["q8x16_k8x16", "q8x16_k4x16", "q8x16_k8x8"],
         3: ["q2x8x8_k2x8x8", "q4x4x8_k2x4x16", "q4x8x4_k4x2x16", "q4x4x8_k4x2x16", "q2x8x8_k1x8x8"]}
SMALL_PAIRS = {1: ["q64_k128"], 2: ["q8x8_k7x16", "q8x8_k4x24"], 3: ["q2x4x8_k1x5x16"]}


def cases(count, seed):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        na = 1 + i % 3
        c = random_sm90_case(rng, na, wide=rng.random() < 0.5)
        rpb_entries = 1
        for k in c.kernel:
            rpb_entries *= 2 * k - 1
        # (the 3-D 64-query pair has no split-KV at head dim 32: registers)
        small = c.dim <= 64 and (not c.rpb or rpb_entries <= 4096) and not (na == 3 and c.dim == 32)
        pair = rng.choice([""] + PAIRS[na] + (SMALL_PAIRS[na] if small else []))
        out.append((c, pair, rng.choice([2, 3, 4, 8, 16])))
    return out


CASES = cases(int(os.environ.get("NATTN_SPLIT_KV_CASES", "300")), seed=6061)


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


def test_split_kv_where_the_hopper_family_cannot_run_fails_with_the_reason():
    q = torch.randn(1, 4096, 2, 64, device="cuda", dtype=torch.bfloat16)
    # dilation 9: above the copy engine's largest element stride (8)
    with pytest.raises(RuntimeError, match="names a Hopper configuration.*dilation above 8"):
        nattn.na1d(q, q, q, 129, dilation=9, backend="cuda:kv=4")


def test_split_kv_runs_head_dims_without_an_instance_zero_padded():
    q = torch.randn(1, 64, 64, 2, 48, device="cuda", dtype=torch.bfloat16)  # head dim 48: the 64 instance
    out = nattn.na2d(q, q, q, 33, backend="cuda:kv=4")
    torch.testing.assert_close(out, nattn.na2d(q, q, q, 33, backend="reference"), atol=2e-2, rtol=2e-2)


def test_split_kv_on_the_3d_64_query_pair_at_head_dim_32_is_declined_with_the_reason():
    q = torch.randn(1, 8, 16, 16, 2, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not built for the 3-D 64-query pairs"):
        nattn.na3d(q, q, q, 5, backend="cuda:q2x4x8_k1x5x16+kv=2")
    out = nattn.na3d(q, q, q, 5, backend="cuda:kv=2")  # the default choice skips that pair
    torch.testing.assert_close(out, nattn.na3d(q, q, q, 5, backend="reference"), atol=2e-2, rtol=2e-2)


# Problems whose 128-query boxes fill at most half the GPU, windows of >= 128 keys: libnattn
# splits them in two by itself (kv_splits left at 0); "cuda:kv=1" keeps them unsplit.
SMALL_GRIDS = [((4096,), 1, 2, 128, (2047,)), ((8, 16, 16), 1, 4, 128, (7, 7, 7)), ((32, 32), 1, 2, 64, (13, 13)),
               ((8, 24, 24), 1, 1, 64, (5, 9, 9)), ((1500,), 1, 3, 32, (301,))]


@pytest.mark.parametrize("spatial,batch,heads,dim,kernel", SMALL_GRIDS, ids=[str(s) for s, *_ in SMALL_GRIDS])
def test_small_grids_split_by_default(spatial, batch, heads, dim, kernel):
    if -(-torch.tensor(spatial).prod().item() // 128) * batch * heads * 2 > torch.cuda.get_device_properties(0).multi_processor_count:
        pytest.skip("this GPU's SMs are filled without a split")
    gen = torch.Generator(device="cuda").manual_seed(hash(spatial) % 1000)
    q, k, v = (torch.randn(batch, *spatial, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    fn = FUNCS[len(spatial)]
    with torch.no_grad():
        out, lse = fn(q, k, v, kernel, backend="cuda", return_lse=True)
        split = fn(q, k, v, kernel, backend="cuda:kv=2")
        unsplit, unsplit_lse = fn(q, k, v, kernel, backend="cuda:kv=1", return_lse=True)
        ref, ref_lse = fn(q, k, v, kernel, backend="reference", return_lse=True)
    assert torch.equal(out, split), "the default should be the same computation as kv=2"
    for got, got_lse in ((out, lse), (unsplit, unsplit_lse)):
        assert torch.isfinite(got).all()
        assert rel_err(got, ref) <= TOL[torch.bfloat16] and rel_err(got_lse, ref_lse) <= 1e-4
