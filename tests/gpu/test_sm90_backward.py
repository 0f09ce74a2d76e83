"""GPU tier, Hopper family: the sm90 backward (dQ, dK, dV, dRPB, the gradients of the extra
keys/values and of the LSE) against the reference on fresh random problems it must take.
Run with NATTN_FAMILY=sm90 (tests/gpu/run_device.sh does): libnattn then fails any forward
or backward the Hopper family declines instead of running another family, so a pass means
the sm90 kernels computed every gradient."""

import dataclasses
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import nattn  # noqa: E402
from nattn._cuda.kernel_table import FAMILY_BY_NAME, SM90_BACKWARD_TILES, Instance  # noqa: E402
from gpu_cases import TOL, GpuCase, check, compare_gradients, forward_backward  # noqa: E402
from sm90_cases import (SQUARE_PAIR, STRIP_PAIRS, VIDEO_STRIPS, WHOLE_GROUP_LAYERS, dilated_1d_sweep,  # noqa: E402
                        fits_wide_rpb, narrow_strip_sweep, sm90_sweep, square_sweep, strip_sweep)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)
if os.environ.get("NATTN_FAMILY") != "sm90":
    pytest.skip("run with NATTN_FAMILY=sm90 (tests/gpu/run_device.sh does)", allow_module_level=True)

CASES = sm90_sweep(int(os.environ.get("NATTN_SM90_BWD_CASES", "1000")), seed=6161)
WIDE = sm90_sweep(int(os.environ.get("NATTN_SM90_BWD_WIDE_CASES", "60")), seed=7272, wide=True)


def gradients(case, backend, leaves_of=None, heads_first_grad=False):
    return forward_backward(case, backend, leaves_of, heads_first_grad)


def compare(case, heads_first_grad=False):
    compare_gradients(case, TOL[case.dtype], heads_first_grad)


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c}" for i, c in enumerate(CASES)])
def test_sm90_backward_matches_reference(case):
    compare(case)


@pytest.mark.parametrize("case", WIDE, ids=[f"wide{i}-{c}" for i, c in enumerate(WIDE)])
def test_sm90_backward_wide_windows(case):
    compare(case)


# Each backward pair of an NA dim with several forced (NATTN_SM90_TILE, forward and backward)
# on fresh cases of that NA dim: the default runs whichever walks fewer steps
# (src/sm90_dispatch.cu, backward_steps).
_MANY = [n for n in (1, 2, 3) if sum(m == n for m, _ in SM90_BACKWARD_TILES) > 1]
PAIRS = [(n, t, Instance("sm90", "bfloat16", n, 64, t).tile_name) for n, t in SM90_BACKWARD_TILES if n in _MANY]
_BUILT = FAMILY_BY_NAME["sm90"].tile_has_head_dim  # (q16x8_k4x24: head dims 32 and 64)
PAIR_CASES = [(pair, c) for i, (n, t, pair) in enumerate(PAIRS)
              for c in [c for c in sm90_sweep(300, seed=9191 + i) if len(c.spatial) == n and _BUILT(t, c.dim)][
                  :int(os.environ.get("NATTN_SM90_BWD_PAIR_CASES", "90"))]
              # head dim 256 (the wide passes over the pair's 64-token box; forced only: the
              # default keeps the first pair there)
              + [fits_wide_rpb(c) for c in sm90_sweep(60, seed=9292 + i, dims=(256,)) if len(c.spatial) == n
                 and _BUILT(t, 256)][:12]]


@pytest.mark.parametrize("pair,case", PAIR_CASES, ids=[f"{p}-{i}-{c}" for i, (p, c) in enumerate(PAIR_CASES)])
def test_sm90_backward_every_pair(pair, case, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", pair)  # read by libnattn on every call
    compare(case)


HEADS_FIRST = [dataclasses.replace(c, layout=layout) for c, layout in
               zip(sm90_sweep(60, seed=5151), ["heads_major", "plain", "fused"] * 20)]


@pytest.mark.parametrize("case", HEADS_FIRST, ids=[f"hf{i}-{c}" for i, c in enumerate(HEADS_FIRST)])
def test_sm90_backward_heads_first_grad_out(case):
    """The output's gradient heads-first (its tensor map merges heads with the batch) with
    q / k / v heads-first, heads-last or sliced from one projection."""
    compare(case, heads_first_grad=True)


SMALL = [dataclasses.replace(c, layout="plain") for c in sm90_sweep(80, seed=8383)
         if c.batch * c.heads * math.prod(c.spatial) <= 6000][:12]


@pytest.mark.parametrize("case", SMALL, ids=[f"f64-{i}-{c}" for i, c in enumerate(SMALL)])
def test_sm90_backward_against_float64(case):
    """The same gradients against the reference run in float64 on float64 copies of the
    inputs: the error budget is the 16-bit rounding of the inputs' products alone."""
    o_c, l_c, g_c = gradients(case, "cuda")

    def as_double(t, leaves):
        double = {name: x.detach().double().requires_grad_(True) for name, x in t.items()}
        by_id = {id(x): double[name] for name, x in t.items()}
        return double, [by_id[id(x)] for x in leaves]

    o_r, l_r, g_r = gradients(case, "reference", as_double)
    tol = TOL[case.dtype]
    check("out", o_c, o_r.to(o_c.dtype), tol)
    check("lse", l_c, l_r.float(), 1e-4)
    for i, (gc, gr) in enumerate(zip(g_c, g_r)):
        check(f"grad_leaf{i}", gc, gr, 2 * tol)


ATOMIC = sm90_sweep(int(os.environ.get("NATTN_SM90_BWD_ATOMIC_CASES", "300")), seed=9494)


@pytest.mark.parametrize("case", ATOMIC, ids=[f"atomic{i}-{c}" for i, c in enumerate(ATOMIC)])
def test_sm90_backward_kv_parallel_dq(case, monkeypatch):
    """NATTN_SM90_DQ=atomic: dQ accumulated in fp32 from the dK/dV pass (KV-parallel)."""
    monkeypatch.setenv("NATTN_SM90_DQ", "atomic")  # read by libnattn on every call
    compare(case)


DILATED_1D = dilated_1d_sweep(int(os.environ.get("NATTN_SM90_BWD_DILATED_CASES", "60")), seed=8383)


@pytest.mark.parametrize("dq", ["pass", "atomic"])
@pytest.mark.parametrize("case", DILATED_1D, ids=[f"dil{i}-{c}" for i, c in enumerate(DILATED_1D)])
def test_sm90_backward_dilated_1d_boxes_in_pieces(case, dq, monkeypatch):
    """1-D at dilation 3 to 8: the 128-key and 64-query boxes copied in pieces. The
    KV-parallel dQ's bulk reductions take one box: above dilation 4 it runs the dQ pass."""
    monkeypatch.setenv("NATTN_SM90_DQ", dq)
    compare(case)


@pytest.mark.parametrize("rpb", [False, True])
def test_sm90_backward_is_deterministic(rpb):
    """Two backward runs of one problem give bitwise equal gradients (no atomics on dQ,
    dK, dV; dRPB summed in fixed point: its table, 2 x 65 x 65 floats a KV head, is staged)."""
    assert_deterministic(spatial=(40, 56), kernel=(33, 33), dim=64, rpb=rpb, seed=31)


@pytest.mark.parametrize("pair", ["q16x8_k4x24", "q32x4_k7x16"])
def test_sm90_backward_wide_key_boxes_is_deterministic(pair, monkeypatch):
    """The same on the pairs with 96- and 112-token column boxes (forced here; the first is
    the default backward of a 13x13 window at head dim 64)."""
    monkeypatch.setenv("NATTN_SM90_TILE", pair)
    assert_deterministic(spatial=(64, 48), kernel=(13, 13), dim=64, rpb=False, seed=37)


def assert_deterministic(spatial, kernel, dim, rpb, seed):
    """Two backward runs of a 2-D GQA problem (4 query heads, 2 KV heads) give bitwise equal
    gradients."""
    case = GpuCase(spatial=spatial, kernel=kernel, stride=(1, 1), dilation=(1, 1), causal=(False, False),
                   batch=2, heads=4, heads_kv=2, dim=dim, dim_v=dim, extra=0, rpb=rpb, dtype=torch.bfloat16,
                   layout="plain", scale=None, seed=seed)
    first = gradients(case, "cuda")[2]
    second = gradients(case, "cuda")[2]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_sm90_backward_declines_what_it_cannot_take():
    """At head dim 256 the dK/dV pass stages a KV head's RPB tables in what its rows leave of
    shared memory (backward_wide.cuh): a larger table is declined, so under NATTN_FAMILY=sm90
    the forward runs and the backward is an error naming the table. (D != D_v and head dims
    between the instances run on zero-padded copies: test_sm90_padded.py.)"""
    q, k, v = (torch.randn(1, 40, 40, 2, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    rpb = torch.randn(2, 65, 65, device="cuda", dtype=torch.float32, requires_grad=True)  # 4225 entries a head
    gqa_k, gqa_v = (torch.randn(1, 40, 40, 1, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(2))
    out = nattn.na2d(q, gqa_k, gqa_v, 33, rpb=rpb, backend="cuda")  # 2 query heads a KV head: 8450 entries
    assert torch.isfinite(out).all()
    with pytest.raises(Exception, match="RPB tables"):
        out.sum().backward()


HEAD256 = [fits_wide_rpb(c) for c in
           sm90_sweep(int(os.environ.get("NATTN_SM90_BWD_256_CASES", "240")), seed=2561, dims=(256,))
           + sm90_sweep(40, seed=2562, wide=True, dims=(256,))]


@pytest.mark.parametrize("case", HEAD256, ids=[f"hd256-{i}-{c}" for i, c in enumerate(HEAD256)])
def test_sm90_backward_head_dim_256(case):
    """Head dim 256: the wide passes (warpgroups split by role over 64-token boxes), every
    window feature, GQA, RPB, extra keys, layouts, fp16 and bf16."""
    compare(case)


SMALL256 = [dataclasses.replace(fits_wide_rpb(c), layout="plain") for c in sm90_sweep(60, seed=2563, dims=(256,))
            if c.batch * c.heads * math.prod(c.spatial) <= 4000][:8]


@pytest.mark.parametrize("case", SMALL256, ids=[f"f64-256-{i}-{c}" for i, c in enumerate(SMALL256)])
def test_sm90_backward_head_dim_256_against_float64(case):
    test_sm90_backward_against_float64(case)


@pytest.mark.parametrize("rpb", [False, True])
def test_sm90_backward_head_dim_256_is_deterministic(rpb):
    """The wide passes' gradients are bitwise repeatable too (dRPB staged in fixed point)."""
    assert_deterministic(spatial=(24, 40), kernel=(17, 17), dim=256, rpb=rpb, seed=37)


# The strip pairs' backward (named only, as their forward: their own dQ pass and dK/dV pass,
# backward_dq_strips.cuh and backward_dkv_strips.cuh), forced on sweeps within their limits
# (2-D, 3-D on small random grids, video-sized 3-D windows over several frames of the ring):
# dQ, dK and dV written with the bulk tensor stores, with per-lane stores, and with the
# tensor-core family's dK/dV pass in place of theirs (NATTN_SM90_STRIP_DKV=tc); the last cases
# have the columns axis' groups at most 8 long, so every warp of the dQ pass walks narrow
# (backward_dq_strips.cuh: half-chunks of four key rows x 8 columns; DiNAT's whole-group layers).
STRIP_BWD_CASES = int(os.environ.get("NATTN_SM90_STRIP_BWD_CASES", "240"))
STRIP_BWD = (strip_sweep(STRIP_BWD_CASES, seed=6464) + strip_sweep(STRIP_BWD_CASES // 2, seed=6565, na_dim=3)
             + VIDEO_STRIPS + WHOLE_GROUP_LAYERS + narrow_strip_sweep(STRIP_BWD_CASES // 4, seed=6868)
             + narrow_strip_sweep(STRIP_BWD_CASES // 8, seed=6969, na_dim=3))


@pytest.mark.parametrize("mode", ["bulk", "lanes", "tc-dkv"])
@pytest.mark.parametrize("case", STRIP_BWD, ids=[f"strip{i}-{c}" for i, c in enumerate(STRIP_BWD)])
def test_sm90_strip_backward(case, mode, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[len(case.spatial)])
    if mode == "lanes":
        monkeypatch.setenv("NATTN_SM90_OUT_STORES", "lanes")
    if mode == "tc-dkv":
        monkeypatch.setenv("NATTN_SM90_STRIP_DKV", "tc")
    compare(case)


# With an RPB the strip pairs run their own dK/dV pass (dRPB summed in fixed point, an integer
# atomic per score) by default wherever the KV head's tables fit what it stages (4096
# entries: every case of the sweep), so the sweep above runs it; NATTN_SM90_STRIP_DKV=own
# forces it on the sweep's cases with an RPB once more, with the default's other settings.
STRIP_BWD_RPB = [c for c in STRIP_BWD if c.rpb]


@pytest.mark.parametrize("case", STRIP_BWD_RPB, ids=[f"strip-rpb{i}-{c}" for i, c in enumerate(STRIP_BWD_RPB)])
def test_sm90_strip_backward_own_dkv_with_rpb(case, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[len(case.spatial)])
    monkeypatch.setenv("NATTN_SM90_STRIP_DKV", "own")
    compare(case)


def _small(cases, n):
    return [dataclasses.replace(c, layout="plain") for c in cases if c.batch * c.heads * math.prod(c.spatial) <= 6000][:n]


# (the last ones walk narrow)
STRIP_SMALL = (_small(strip_sweep(60, seed=6666) + strip_sweep(60, seed=6767, na_dim=3), 12)
               + _small(narrow_strip_sweep(80, seed=7070) + narrow_strip_sweep(40, seed=7171, na_dim=3), 10))


@pytest.mark.parametrize("case", STRIP_SMALL, ids=[f"f64-strip{i}-{c}" for i, c in enumerate(STRIP_SMALL)])
def test_sm90_strip_backward_against_float64(case, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[len(case.spatial)])
    test_sm90_backward_against_float64(case)


@pytest.mark.parametrize("rpb,dkv", [(False, None), (True, None), (True, "tc")])
def test_sm90_strip_backward_is_deterministic(rpb, dkv, monkeypatch):
    """The strip pairs' backward is bitwise repeatable (dQ rows written once; each key's
    gradients one CTA's; dRPB in fixed point from the dQ pass's largest |dS|), with an RPB
    through their own dK/dV pass (the default) and through the tensor-core one."""
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[2])
    if dkv:
        monkeypatch.setenv("NATTN_SM90_STRIP_DKV", dkv)
    assert_deterministic(spatial=(40, 56), kernel=(7, 7), dim=32, rpb=rpb, seed=41)


def test_sm90_strip_backward_declines_what_it_cannot_take(monkeypatch):
    """Named on a window beyond its limits the strip pair's backward declines with the reason
    (NATTN_FAMILY=sm90 turns the decline into the error); the forward's decline comes first."""
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[2])
    q = torch.randn(1, 32, 32, 2, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(Exception, match="up to 7 x 9"):
        nattn.na2d(q, q, q, (9, 7), backend="cuda").sum().backward()


# The square pair's backward (its own dQ pass, backward_dq_squares.cuh, then its own dK/dV
# pass, backward_dkv_squares.cuh, with the key box of its default rule, square_dkv_wide; named
# with an RPB at head dim 64: NATTN_SM90_SQUARE_DKV=own), forced
# on its sweep with dQ, dK and dV written by the bulk tensor stores and per lane, on a problem
# with thousands of boxes, against float64 on small ones; and through the other dK/dV passes
# it can be given (32x4 / 7x16's at head dim 64 without an RPB, the tensor-core family's).
SQUARE_BWD = square_sweep(int(os.environ.get("NATTN_SM90_SQUARE_BWD_CASES", "200")), seed=8383) + [
    GpuCase(spatial=(96, 104), kernel=(13, 11), stride=(1, 1), dilation=(1, 1), causal=(False, False), batch=2,
            heads=4, heads_kv=2, dim=64, dim_v=64, extra=0, rpb=True, dtype=torch.bfloat16, layout="plain",
            scale=None, seed=83)]


@pytest.mark.parametrize("stores", ["bulk", "lanes"])
@pytest.mark.parametrize("case", SQUARE_BWD, ids=[f"square{i}-{c}" for i, c in enumerate(SQUARE_BWD)])
def test_sm90_square_backward(case, stores, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV", "own")
    if stores == "lanes":
        monkeypatch.setenv("NATTN_SM90_OUT_STORES", "lanes")
    compare(case)


SQUARE_PARTNERS = square_sweep(int(os.environ.get("NATTN_SM90_SQUARE_BWD_CASES", "200")) // 5, seed=8585)


@pytest.mark.parametrize("dkv", ["box", "tc"])
@pytest.mark.parametrize("case", SQUARE_PARTNERS, ids=[f"square{i}-{c}" for i, c in enumerate(SQUARE_PARTNERS)])
def test_sm90_square_backward_through_the_other_dkv_passes(case, dkv, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV", dkv)
    compare(case)


# The own dK/dV pass with its 4 x 16 key box (NATTN_SM90_SQUARE_DKV_BOX=4x16: its four squares
# side by side, slabs up to 40 queries wide) on a sweep of its own.
SQUARE_WIDE = square_sweep(int(os.environ.get("NATTN_SM90_SQUARE_BWD_CASES", "200")) // 2, seed=8686)


@pytest.mark.parametrize("case", SQUARE_WIDE, ids=[f"square{i}-{c}" for i, c in enumerate(SQUARE_WIDE)])
def test_sm90_square_backward_wide_key_box(case, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV", "own")
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV_BOX", "4x16")
    compare(case)


SQUARE_SMALL = _small(square_sweep(80, seed=8484), 12)


@pytest.mark.parametrize("box", ["8x8", "4x16"])
@pytest.mark.parametrize("case", SQUARE_SMALL, ids=[f"f64-square{i}-{c}" for i, c in enumerate(SQUARE_SMALL)])
def test_sm90_square_backward_against_float64(case, box, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV", "own")
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV_BOX", box)
    test_sm90_backward_against_float64(case)


@pytest.mark.parametrize("dkv", ["own", "own-4x16", "tc"])
@pytest.mark.parametrize("rpb", [False, True])
def test_sm90_square_backward_is_deterministic(rpb, dkv, monkeypatch):
    """The square pair's backward is bitwise repeatable (dQ rows written once; each key's
    gradients one CTA's in either dK/dV pass, with either key box of its own; dRPB in fixed
    point from the dQ pass's largest |dS|)."""
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    monkeypatch.setenv("NATTN_SM90_SQUARE_DKV", dkv.split("-")[0])
    if dkv == "own-4x16":
        monkeypatch.setenv("NATTN_SM90_SQUARE_DKV_BOX", "4x16")
    assert_deterministic(spatial=(40, 56), kernel=(13, 11), dim=64, rpb=rpb, seed=43)


def test_sm90_square_backward_declines_what_it_cannot_take(monkeypatch):
    """Named on a window beyond its limits the square pair declines with the reason, the
    forward's decline first (NATTN_FAMILY=sm90 turns the decline into the error)."""
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    q = torch.randn(1, 32, 32, 2, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(Exception, match="up to 13 x 13"):
        nattn.na2d(q, q, q, (15, 7), backend="cuda").sum().backward()
