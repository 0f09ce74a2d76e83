"""A small sweep of Hopper-family forwards and backwards for compute-sanitizer (memcheck, racecheck,
synccheck): ``NATTN_FAMILY=sm90 compute-sanitizer --tool racecheck python
tests/gpu/sanitize_sm90.py``. NATTN_FAMILY=sm90 makes any case the family declines an error.
NATTN_SANITIZE_CASES sets the random sweep's size (default 12), NATTN_SANITIZE_SECTIONS which
sections run (main's docstring)."""

import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
import nattn  # noqa: E402
from nattn.distributed.halo import _RangedNA  # noqa: E402
from nattn.params import NAParams  # noqa: E402
from gpu_cases import functional_call, make_inputs, poison_kernel_buffers, run_finite  # noqa: E402
from sm90_cases import sm90_sweep  # noqa: E402

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}


def sweep(count):
    run_finite(sm90_sweep(count, seed=77), progress=True)


def heads_first():
    # Heads-first tensors ([B, H, *spatial, D] viewed heads-last: their tensor maps merge the
    # heads with the batch), forward and backward, the output's gradient heads-first too.
    q, k, v = (torch.randn(2, 4, 6, 12, 16, 64, device="cuda", dtype=torch.bfloat16).movedim(1, -2).requires_grad_()
               for _ in range(3))
    out = nattn.na3d(q, k, v, (3, 5, 5), backend="cuda")
    g_out = torch.randn(2, 4, 6, 12, 16, 64, device="cuda", dtype=torch.bfloat16).movedim(1, -2)
    grads = torch.autograd.grad(out, (q, k, v), g_out)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), "heads-first"


def query_range():
    # A query range (a halo rank's own queries): only the boxes holding them run, forward and
    # dQ pass; the dK/dV pass walks those queries only.
    q, k, v = (torch.randn(1, 12, 20, 24, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    params = NAParams((5, 7, 7), (1, 1, 1), (1, 1, 1), (False, False, False), 0.125)
    query_range = ((3, 9), (0, 20), (5, 17))
    out, lse = _RangedNA.apply(q, k, v, None, params, "cuda", query_range)
    keep = torch.zeros(12, 20, 24, 1, 1, device="cuda", dtype=torch.bfloat16)
    keep[3:9, :, 5:17] = 1
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out) * keep)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), "query range"


def small_pairs():
    # The 64-query pairs (several CTAs per SM, the RPB table staged in shared memory) on
    # hundreds of query boxes: two walking their key boxes one after the other (112 keys, 8x8
    # and 16x4 queries), one pipelined (96-key boxes, S of a box beside P of the previous one).
    q, k, v = (torch.randn(8, 40, 40, 2, 32, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rpb = torch.randn(2, 13, 13, device="cuda")
    for tile in ("q8x8_k7x16", "q8x8_k4x24", "q16x4_k7x16"):
        os.environ["NATTN_SM90_TILE"] = tile
        try:
            out = nattn.na2d(q, k, v, 7, rpb=rpb, backend="cuda")
            torch.cuda.synchronize()
        finally:
            del os.environ["NATTN_SM90_TILE"]
        assert torch.isfinite(out).all(), tile


def split_kv():
    # Split-KV: slices of each query box's key boxes, merged by their own kernel.
    q, k, v = (torch.randn(1, 1024, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for splits in (2, 3, 8, 16):
        with torch.no_grad():
            out, lse = nattn.na1d(q, k, v, 509, backend=f"cuda:kv={splits}", return_lse=True)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), f"kv={splits}"


def padded():
    # Head dims without an instance (src/sm90_padded.h): zero-padded copies in and out around
    # the kernels, forward and backward, D != D_v (GQA, a heads-first value) and a head dim of
    # 72 with a query range (the copies back carry the unwritten rows' zeros).
    q, k = (torch.randn(2, 10, 14, 16, h, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for h in (4, 2))
    v = torch.randn(2, 2, 10, 14, 16, 128, device="cuda", dtype=torch.bfloat16).movedim(1, -2).requires_grad_()
    out = nattn.na3d(q, k, v, (3, 5, 7), backend="cuda")
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), "padded D != D_v"
    q, k, v = (torch.randn(1, 30, 28, 3, 72, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    params = NAParams((9, 9), (1, 1), (1, 1), (False, False), 72 ** -0.5)
    out, lse = _RangedNA.apply(q, k, v, None, params, "cuda", ((4, 19), (0, 28)))
    keep = torch.zeros(30, 28, 1, 1, device="cuda", dtype=torch.float16)
    keep[4:19] = 1
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out) * keep)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), "padded query range"


def pieces():
    # 1-D boxes copied in pieces (dilation 3 to 8: box x dilation above the copy engine's 256
    # elements), near the sequence's end, forward and backward with both dQ modes, and the
    # 64-query pair's 128-key boxes in four pieces.
    q, k, v = (torch.randn(2, 3001, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for dilation, dq in ((3, "pass"), (4, "atomic"), (7, "pass"), (8, "atomic")):
        os.environ["NATTN_SM90_DQ"] = dq
        try:
            out = nattn.na1d(q, k, v, 97, dilation=dilation, backend="cuda")
            grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
            torch.cuda.synchronize()
        finally:
            del os.environ["NATTN_SM90_DQ"]
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), f"dilation {dilation}"
    os.environ["NATTN_SM90_TILE"] = "q64_k128"
    try:
        with torch.no_grad():
            out = nattn.na1d(q, k, v, 150, dilation=8, backend="cuda")
        torch.cuda.synchronize()
    finally:
        del os.environ["NATTN_SM90_TILE"]
    assert torch.isfinite(out).all(), "q64_k128 at dilation 8"


def head_dim_256():
    # Head dim 256's backward (backward_wide.cuh: the warpgroups split by role, fragments
    # exchanged through shared memory): every NA dim, GQA with a staged fixed-point dRPB,
    # causal, a query range.
    for spatial, kernel, causal in (((700,), (65,), (True,)), ((20, 27), (9, 11), (False, True)),
                                    ((6, 11, 13), (3, 5, 7), (False, False, False))):
        q = torch.randn(2, *spatial, 4, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(2, *spatial, 2, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        rpb = torch.randn(4, *(2 * w - 1 for w in kernel), device="cuda", requires_grad=True) if not any(causal) else None
        out = FUNCS[len(spatial)](q, k, v, kernel, is_causal=causal, rpb=rpb, backend="cuda")
        leaves = (q, k, v) + ((rpb,) if rpb is not None else ())
        grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), f"head dim 256 {spatial}"
    q, k, v = (torch.randn(1, 9, 20, 22, 2, 256, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    params = NAParams((3, 7, 7), (1, 1, 1), (1, 1, 1), (False, False, False), 0.0625)
    out, lse = _RangedNA.apply(q, k, v, None, params, "cuda", ((2, 6), (0, 20), (4, 15)))
    keep = torch.zeros(9, 20, 22, 1, 1, device="cuda", dtype=torch.float16)
    keep[2:6, :, 4:15] = 1
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out) * keep)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), "head dim 256 query range"


def backward_pairs():
    # Every backward pair forced on a problem of its NA dim whose grid ends in partial boxes,
    # with dilation and GQA, once with an RPB and once causal along axis 0 (an RPB takes no
    # causal axis), forward and backward (the default runs a second 2-D / 3-D pair where it
    # walks fewer steps).
    from nattn._cuda.kernel_table import SM90_BACKWARD_TILES, Instance
    shapes = {1: ((1001,), (97,), (2,)), 2: ((47, 45), (21, 17), (2, 1)), 3: ((11, 21, 27), (5, 9, 11), (1, 2, 1))}
    for (n, tile), with_rpb in itertools.product(SM90_BACKWARD_TILES, (True, False)):
        spatial, kernel, dilation = shapes[n]
        q = torch.randn(2, *spatial, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(2, *spatial, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        rpb = torch.randn(4, *(2 * w - 1 for w in kernel), device="cuda", requires_grad=True) if with_rpb else None
        causal = (not with_rpb,) + (False,) * (n - 1)
        leaves = (q, k, v) + ((rpb,) if with_rpb else ())
        os.environ["NATTN_SM90_TILE"] = name = Instance("sm90", "bfloat16", n, 64, tile).tile_name
        try:
            out = FUNCS[n](q, k, v, kernel, dilation=dilation, is_causal=causal, rpb=rpb, backend="cuda")
            grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
            torch.cuda.synchronize()
        finally:
            del os.environ["NATTN_SM90_TILE"]
        assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads), name


def strips():
    # The strip pairs' forwards (forward_strips.cuh) on random problems within their limits
    # (RPB, GQA, dilation, causal axes, layouts; 2-D and 3-D, whose frames pass through a
    # ring) and on grids ending in partial query boxes, with the bulk tensor stores of the
    # output (and of dQ, dK, dV) and with per-lane stores; every other case with its backward
    # too (backward_dq_strips.cuh, backward_dkv_strips.cuh; one in four with the tensor-core
    # dK/dV pass instead); then problems whose warps all walk narrow (columns axis' groups at
    # most 8 long: DiNAT's whole-group layers among them).
    from sm90_cases import STRIP_PAIRS, WHOLE_GROUP_LAYERS, narrow_strip_sweep, strip_sweep
    stores = os.environ.get("NATTN_SM90_OUT_STORES")  # set by the caller (initcheck): kept for every case
    cases = (strip_sweep(8, seed=88) + strip_sweep(8, seed=89, na_dim=3) + narrow_strip_sweep(4, seed=90)
             + narrow_strip_sweep(2, seed=91, na_dim=3) + WHOLE_GROUP_LAYERS[-2:])
    try:
        for i, case in enumerate(cases):
            os.environ["NATTN_SM90_TILE"] = STRIP_PAIRS[len(case.spatial)]
            t, leaves = make_inputs(case)
            if i % 2 and stores is None:
                os.environ["NATTN_SM90_OUT_STORES"] = "lanes"
            if i % 8 == 1:
                os.environ["NATTN_SM90_STRIP_DKV"] = "tc"
            try:
                if i % 4 < 2:
                    out, lse = functional_call(case, t, 0.0)
                    grads = torch.autograd.grad((out, lse), leaves, (torch.randn_like(out), torch.randn_like(lse)))
                else:
                    with torch.no_grad():
                        out, lse = functional_call(case, t, 0.0)
                    grads = ()
                torch.cuda.synchronize()
            finally:
                if stores is None:
                    os.environ.pop("NATTN_SM90_OUT_STORES", None)
                os.environ.pop("NATTN_SM90_STRIP_DKV", None)
            assert torch.isfinite(out).all() and torch.isfinite(lse).all(), str(case)
            assert all(torch.isfinite(g).all() for g in grads), str(case)
    finally:
        os.environ.pop("NATTN_SM90_TILE", None)


def squares():
    # The square pair (forward_squares.cuh, backward_dq_squares.cuh) on random problems within
    # its limits (windows up to 13 x 13: RPB, GQA, dilation, causal axes, layouts, grids ending
    # in partial boxes), every other case with per-lane output stores; every other pair of
    # cases with its backward too (the square dQ pass, then its own dK/dV pass, named at both
    # head dims, with its 4 x 16 key box on every second pair, 8 x 8 else; every fourth
    # backward through the tensor-core dK/dV pass instead).
    from sm90_cases import SQUARE_PAIR, square_sweep
    stores = os.environ.get("NATTN_SM90_OUT_STORES")  # set by the caller (initcheck): kept for every case
    try:
        os.environ["NATTN_SM90_TILE"] = SQUARE_PAIR
        for i, case in enumerate(square_sweep(16, seed=92)):
            t, leaves = make_inputs(case)
            if i % 2 and stores is None:
                os.environ["NATTN_SM90_OUT_STORES"] = "lanes"
            try:
                if i % 4 < 2:
                    os.environ["NATTN_SM90_SQUARE_DKV"] = "tc" if i % 8 == 1 else "own"
                    os.environ["NATTN_SM90_SQUARE_DKV_BOX"] = "4x16" if i % 8 >= 4 else "8x8"
                    out, lse = functional_call(case, t, 0.0)
                    grads = torch.autograd.grad((out, lse), leaves, (torch.randn_like(out), torch.randn_like(lse)))
                else:
                    with torch.no_grad():
                        out, lse = functional_call(case, t, 0.0)
                    grads = ()
                torch.cuda.synchronize()
            finally:
                if stores is None:
                    os.environ.pop("NATTN_SM90_OUT_STORES", None)
                os.environ.pop("NATTN_SM90_SQUARE_DKV", None)
                os.environ.pop("NATTN_SM90_SQUARE_DKV_BOX", None)
            assert torch.isfinite(out).all() and torch.isfinite(lse).all(), str(case)
            assert all(torch.isfinite(g).all() for g in grads), str(case)
    finally:
        os.environ.pop("NATTN_SM90_TILE", None)


SECTIONS = ("sweep", "heads_first", "query_range", "small_pairs", "split_kv", "padded", "pieces", "head_dim_256",
            "backward_pairs", "strips", "squares")


def main(count=int(os.environ.get("NATTN_SANITIZE_CASES", "12"))):
    """NATTN_SANITIZE_SECTIONS (comma-separated names of SECTIONS; default all) picks what runs:
    racecheck is slow, so a change can be checked on its own section."""
    assert os.environ.get("NATTN_FAMILY") == "sm90", "run with NATTN_FAMILY=sm90"
    wanted = [x for x in os.environ.get("NATTN_SANITIZE_SECTIONS", ",".join(SECTIONS)).split(",") if x]
    unknown = set(wanted) - set(SECTIONS)
    assert not unknown, f"NATTN_SANITIZE_SECTIONS: unknown {sorted(unknown)}; accepted: {SECTIONS}"
    poison_kernel_buffers()  # unwritten output rows read NaN (the sections check finiteness)
    for name in wanted:
        globals()[name](count) if name == "sweep" else globals()[name]()
        print(f"section done: {name}", flush=True)
    print(f"sm90 sanitize sweep: {', '.join(wanted)} ran ({count} random cases)")


if __name__ == "__main__":
    main()
