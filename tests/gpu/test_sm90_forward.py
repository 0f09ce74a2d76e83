"""GPU tier, Hopper family: the sm90 forward (output and LSE) against the reference on
fresh random problems it must take. Run with NATTN_FAMILY=sm90 (tests/gpu/run_device.sh
does), which makes libnattn fail any forward the Hopper family declines instead of
running another family, so a pass means the sm90 kernels computed every case."""

import dataclasses
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import nattn  # noqa: E402
from gpu_cases import TOL, GpuCase, make_inputs, rel_err  # noqa: E402
from sm90_cases import (SM90_FORWARD_DIMS, SQUARE_PAIR, STRIP_PAIRS, VIDEO_STRIPS, WHOLE_GROUP_LAYERS,  # noqa: E402
                        dilated_1d_sweep, narrow_strip_sweep, sm90_sweep, square_sweep, square_takes, strip_sweep,
                        strip_takes)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)
if os.environ.get("NATTN_FAMILY") != "sm90":
    pytest.skip("run with NATTN_FAMILY=sm90 (tests/gpu/run_device.sh does)", allow_module_level=True)

CASES = sm90_sweep(int(os.environ.get("NATTN_SM90_CASES", "1100")), seed=4242, dims=SM90_FORWARD_DIMS)
# Every (query box, key box) pair of the kernel table, each forced (NATTN_SM90_TILE) on its
# own fresh cases: the default choice only reaches the pairs its cost model prefers.
from nattn._cuda.kernel_table import FAMILY_BY_NAME, SM90_TILES, Instance  # noqa: E402
TILES = [(na, t, Instance("sm90", "bfloat16", na, 64, t).tile_name) for na, t in SM90_TILES]
PER_TILE = int(os.environ.get("NATTN_SM90_TILE_CASES", "150"))
# 64-query pairs stage the RPB table in shared memory (up to this many entries per head).
SMALL_RPB_STAGE = 4096


def pair_takes(tile, case):
    """Whether a forced pair is built for the case's head dim and can take its RPB table (the
    strip and square pairs: their windows too)."""
    if not FAMILY_BY_NAME["sm90"].tile_has_head_dim(tile, case.dim):
        return False
    name = Instance("sm90", "bfloat16", len(case.spatial), 64, tile).tile_name
    if (name in STRIP_PAIRS.values() and not strip_takes(case)) or (name == SQUARE_PAIR and not square_takes(case)):
        return False
    queries = 1
    for x in tile[0]:
        queries *= x
    table = 1
    for k in case.kernel:
        table *= 2 * k - 1
    return not (case.rpb and queries < 128 and table > SMALL_RPB_STAGE)


TILE_CASES = [(name, c) for j, (na, t, name) in enumerate(TILES)
              for c in sm90_sweep(3 * PER_TILE, seed=900 + j, dims=SM90_FORWARD_DIMS)
              if len(c.spatial) == na and pair_takes(t, c)]
WIDE = sm90_sweep(int(os.environ.get("NATTN_SM90_WIDE_CASES", "120")), seed=5151, wide=True, dims=SM90_FORWARD_DIMS)
FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}
# Problems with thousands of 64-query boxes (several CTAs per SM, each staging its head's
# RPB table), forced onto each NA dim's 64-query pair.
MANY_BOXES = [
    GpuCase(spatial=(56, 56), kernel=(7, 7), stride=(1, 1), dilation=(1, 1), causal=(False, False), batch=6,
            heads=4, heads_kv=4, dim=32, dim_v=32, extra=0, rpb=True, dtype=torch.bfloat16, layout="fused",
            scale=None, seed=11),
    GpuCase(spatial=(64, 48), kernel=(13, 9), stride=(2, 1), dilation=(1, 2), causal=(False, True), batch=3,
            heads=6, heads_kv=2, dim=64, dim_v=64, extra=5, rpb=False, dtype=torch.float16, layout="plain",
            scale=0.2, seed=12),
    GpuCase(spatial=(8, 32, 40), kernel=(3, 5, 7), stride=(1, 1, 1), dilation=(1, 1, 1), causal=(False, False, False),
            batch=2, heads=4, heads_kv=4, dim=64, dim_v=64, extra=0, rpb=True, dtype=torch.bfloat16, layout="plain",
            scale=None, seed=13),
    GpuCase(spatial=(9000,), kernel=(33,), stride=(1,), dilation=(2,), causal=(False,), batch=2, heads=3, heads_kv=3,
            dim=32, dim_v=32, extra=0, rpb=True, dtype=torch.bfloat16, layout="plain", scale=None, seed=14),
]
SMALL_PAIRS = {1: "q64_k128", 2: "q8x8_k4x24", 3: "q2x4x8_k1x5x16"}
# 1-D boxes at dilation 3 to 8 (copied in pieces), on the default choice and on each 1-D pair.
PAIRS_1D = [name for na, t, name in TILES if na == 1]
DILATED_1D = [(pair, c) for j, pair in enumerate([None] + PAIRS_1D)
              for c in dilated_1d_sweep(int(os.environ.get("NATTN_SM90_DILATED_CASES", "40")), seed=3131 + j,
                                        dims=SM90_FORWARD_DIMS)
              if pair is None or pair_takes(next(t for na, t, n in TILES if n == pair), c)]


def forward(case, t, backend):
    with torch.no_grad():
        return FUNCS[len(case.spatial)](
            t["query"], t["key"], t["value"], case.kernel, stride=case.stride,
            dilation=case.dilation, is_causal=case.causal, scale=case.scale,
            additional_keys=t.get("additional_keys"), additional_values=t.get("additional_values"),
            rpb=t.get("rpb"), backend=backend, return_lse=True)


def compare(case):
    t, _ = make_inputs(case)
    out, lse = forward(case, t, "cuda")
    ref_out, ref_lse = forward(case, t, "reference")
    for name, got, want, tol in (("out", out, ref_out, TOL[case.dtype]), ("lse", lse, ref_lse, 1e-4)):
        assert got.shape == want.shape, name
        assert torch.isfinite(got).all(), f"{name}: non-finite values from the sm90 forward"
        err = rel_err(got, want)
        assert err <= tol, f"{name}: relative L2 error {err:.3e} > {tol:.1e}"


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c}" for i, c in enumerate(CASES)])
def test_sm90_forward_matches_reference(case):
    compare(case)


@pytest.mark.parametrize("case", WIDE, ids=[f"wide{i}-{c}" for i, c in enumerate(WIDE)])
def test_sm90_forward_wide_windows(case):
    compare(case)


@pytest.mark.parametrize("tile,case", TILE_CASES, ids=[f"{t}-{i}-{c}" for i, (t, c) in enumerate(TILE_CASES)])
def test_sm90_forward_every_tile_pair(tile, case, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", tile)  # read by libnattn on every call
    compare(case)


@pytest.mark.parametrize("pair,case", DILATED_1D, ids=[f"{p or 'default'}-{i}-{c}" for i, (p, c) in enumerate(DILATED_1D)])
def test_sm90_forward_dilated_1d_boxes_in_pieces(pair, case, monkeypatch):
    if pair:
        monkeypatch.setenv("NATTN_SM90_TILE", pair)
    compare(case)


@pytest.mark.parametrize("case", MANY_BOXES, ids=[str(c) for c in MANY_BOXES])
def test_sm90_small_pairs_on_many_boxes(case, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", SMALL_PAIRS[len(case.spatial)])
    compare(case)


# The strip pairs on their own sweeps (the generic one draws few windows within their
# limits), with the bulk tensor stores of the output and with the per-lane ones: 2-D, 3-D
# (small random grids), video-sized 3-D windows over several frames of the ring, and problems
# whose columns axis' groups are at most 8 long, where every warp takes the narrow walk
# (forward_strips.cuh: 8 key rows of 8 columns; DiNAT's whole-group layers among them).
STRIP_CASES = int(os.environ.get("NATTN_SM90_STRIP_CASES", "400"))
STRIPS = (strip_sweep(STRIP_CASES, seed=6262) + MANY_BOXES[:1] + strip_sweep(STRIP_CASES // 2, seed=6363, na_dim=3)
          + VIDEO_STRIPS + WHOLE_GROUP_LAYERS + narrow_strip_sweep(STRIP_CASES // 4, seed=6464)
          + narrow_strip_sweep(STRIP_CASES // 8, seed=6565, na_dim=3))


@pytest.mark.parametrize("stores", ["bulk", "lanes"])
@pytest.mark.parametrize("case", STRIPS, ids=[f"strip{i}-{c}" for i, c in enumerate(STRIPS)])
def test_sm90_strip_pair(case, stores, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[len(case.spatial)])
    if stores == "lanes":
        monkeypatch.setenv("NATTN_SM90_OUT_STORES", "lanes")
    compare(case)


def test_sm90_strip_pair_declines_what_it_cannot_take(monkeypatch):
    """Forced on a window or stride beyond their limits, the strip pairs decline with the
    reason (NATTN_FAMILY=sm90 turns the decline into the error)."""
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[2])
    q = torch.randn(1, 32, 32, 2, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(Exception, match="up to 7 x 9"):
        nattn.na2d(q, q, q, (9, 7), backend="cuda")
    with pytest.raises(Exception, match="stride 1 only"):
        nattn.na2d(q, q, q, (7, 7), stride=(2, 1), backend="cuda")
    monkeypatch.setenv("NATTN_SM90_TILE", STRIP_PAIRS[3])
    q = torch.randn(1, 12, 16, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(Exception, match="up to 7 x 7 x 9"):
        nattn.na3d(q, q, q, (3, 9, 7), backend="cuda")


# The square pair (forward_squares.cuh) on its own sweep, with both output stores, and on a
# problem with thousands of boxes (two to four CTAs an SM, the RPB table staged).
SQUARES = (square_sweep(int(os.environ.get("NATTN_SM90_SQUARE_CASES", "300")), seed=7272)
           + [dataclasses.replace(MANY_BOXES[0], kernel=(13, 13), dim=64, dim_v=64),
              dataclasses.replace(MANY_BOXES[0], kernel=(11, 11), rpb=False, batch=2, heads=8, heads_kv=2)])


@pytest.mark.parametrize("stores", ["bulk", "lanes"])
@pytest.mark.parametrize("case", SQUARES, ids=[f"square{i}-{c}" for i, c in enumerate(SQUARES)])
def test_sm90_square_pair(case, stores, monkeypatch):
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    if stores == "lanes":
        monkeypatch.setenv("NATTN_SM90_OUT_STORES", "lanes")
    compare(case)


def test_sm90_square_pair_declines_what_it_cannot_take(monkeypatch):
    """Forced on a window or stride beyond its limits, the square pair declines with the reason
    (NATTN_FAMILY=sm90 turns the decline into the error)."""
    monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR)
    q = torch.randn(1, 32, 32, 2, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(Exception, match="up to 13 x 13"):
        nattn.na2d(q, q, q, (15, 7), backend="cuda")
    with pytest.raises(Exception, match="stride 1 only"):
        nattn.na2d(q, q, q, (11, 11), stride=(2, 1), backend="cuda")


# Logits that grow along the walk: query channel 0 is 1 and key channel 0 the key's first
# coordinate times `step` log2 units (over the scale), so a chunk or key box later in the walk
# passes the running max by more than the lazy rescale's slack (8 log2 units: lazy_max_step,
# forward.cuh) on some steps and by less on others, which keep probabilities above 1. Forced
# onto the square and strip pairs, and on the default choice (the wgmma pairs) in 2-D and 1-D.
GROWING = [("square", (64, 64), (13, 13), 64, 2.5), ("square", (40, 48), (11, 9), 32, 2.5),
           ("strip", (48, 40), (7, 7), 32, 2.5), (None, (40, 40), (21, 21), 64, 2.5),
           (None, (2048,), (257,), 128, 0.1)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pair,spatial,kernel,dim,step", GROWING,
                         ids=[f"{p or 'default'}-{'x'.join(map(str, s))}-k{k[0]}-D{d}" for p, s, k, d, _ in GROWING])
def test_sm90_forward_logits_growing_along_the_walk(pair, spatial, kernel, dim, step, dtype, monkeypatch):
    if pair is not None:
        monkeypatch.setenv("NATTN_SM90_TILE", SQUARE_PAIR if pair == "square" else STRIP_PAIRS[len(spatial)])
    g = torch.Generator(device="cuda").manual_seed(31 + dim)
    q, k, v = (torch.randn(2, *spatial, 2, dim, generator=g, device="cuda") for _ in range(3))
    first = torch.arange(spatial[0], device="cuda", dtype=torch.float32).view(1, -1, *[1] * len(spatial))
    q[..., 0] = 1.0
    k[..., 0] += first * (step / 1.4426950408889634 * dim ** 0.5)  # (the default scale is dim ** -0.5)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    func = FUNCS[len(spatial)]
    with torch.no_grad():
        out, lse = func(q, k, v, kernel, backend="cuda", return_lse=True)
        ref_out, ref_lse = func(q, k, v, kernel, backend="reference", return_lse=True)
    for name, got, want, tol in (("out", out, ref_out, TOL[dtype]), ("lse", lse, ref_lse, 1e-4)):
        assert torch.isfinite(got).all(), f"{name}: non-finite values from the sm90 forward"
        err = rel_err(got, want)
        assert err <= tol, f"{name}: relative L2 error {err:.3e} > {tol:.1e}"


LARGE_PAIRS = {1: "q128_k128", 2: "q8x16_k8x16", 3: "q2x8x8_k2x8x8"}


@pytest.mark.parametrize("pairs", ["small", "large"])
@pytest.mark.parametrize("case", MANY_BOXES, ids=[str(c) for c in MANY_BOXES])
def test_sm90_per_lane_output_stores(case, pairs, monkeypatch):
    """The consumer warpgroups write their rows of the output box with bulk tensor copies
    where the copy engine can address the output (every case above); NATTN_SM90_OUT_STORES=lanes
    forces the per-lane stores they fall back to otherwise, on 64- and 128-query pairs."""
    monkeypatch.setenv("NATTN_SM90_TILE", (SMALL_PAIRS if pairs == "small" else LARGE_PAIRS)[len(case.spatial)])
    monkeypatch.setenv("NATTN_SM90_OUT_STORES", "lanes")
    compare(case)


def test_sm90_declines_what_it_cannot_take():
    """q sliced from a heads-first [B, 3, H, *spatial, D] stack (head stride != head dim, batch
    stride != heads x head stride: no tensor map expresses it) is declined with the reason named."""
    qkv = torch.randn(2, 3, 4, 16, 16, 64, device="cuda", dtype=torch.bfloat16)
    q = qkv[:, 0].permute(0, 2, 3, 1, 4)
    with pytest.raises(Exception, match="head stride"):
        nattn.na2d(q, q, q, 5, backend="cuda")
