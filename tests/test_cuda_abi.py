"""libnattn's C ABI checks, on the CPU: the library validates a problem before touching
the GPU, so its error codes and messages are testable without one. Runs when a built
library is found (NATTN_LIBRARY, as .ci/compile_kernels.sh sets it); skipped otherwise."""

import ctypes
import struct

import pytest
import torch

from nattn import dropout
from nattn._cuda import kernel_table, library
from nattn.backends import BACKENDS
from nattn.backends import cuda as cuda_backend
from nattn.params import normalize

LIB = library.load()
pytestmark = pytest.mark.skipif(LIB is None, reason="libnattn is not built")
CUDA = BACKENDS["cuda"]


@pytest.fixture(autouse=True)
def _rules_behind_the_strips(monkeypatch):
    """The tables below hold the choices measured between the tensor-core family and the box
    pairs: asked with the strip pairs' own rule off (NATTN_SM90_STRIPS=0, read by libnattn
    on every call); the strip tests turn it back on."""
    monkeypatch.setenv("NATTN_SM90_STRIPS", "0")


def call(fields, n=None, fn="forward"):
    """One call with the library's ABI: an older one (kernel_table.ABI_PROBLEM_FIELDS) reads a
    prefix of the fields, as the cuda backend passes them."""
    err = ctypes.create_string_buffer(1024)
    fields[0] = LIB.abi
    rc = getattr(LIB, fn)(fields, LIB.num_fields if n is None else n, 0.5, None, err, 1024)
    return rc, err.value.decode()


# A problem the library has a kernel for (CI builds a one-instance subset).
(_, DTYPE_NAME, NA_DIM), _DIMS = (sorted(LIB.kernels.items())[0] if LIB else ((None, "float32", 2), [32]))
DTYPE = getattr(torch, DTYPE_NAME)
DIM = min(_DIMS)
SPATIAL = (9, 11, 7)[:NA_DIM]
KERNEL = (3, 5, 2)[:NA_DIM]


def problem(dim=DIM, dim_v=DIM, offset=0):
    n = 2 * 2 * dim
    for s in SPATIAL:
        n *= s
    q = torch.zeros(n + 64, dtype=DTYPE)[offset : offset + n].view(2, *SPATIAL, 2, dim)
    v = torch.zeros(2, *SPATIAL, 2, dim_v, dtype=DTYPE)
    out = torch.empty(2, *SPATIAL, 2, dim_v, dtype=DTYPE)
    lse = torch.empty(2, *SPATIAL, 2)
    params = normalize(q, q, v, NA_DIM, KERNEL, dilation=(2,) + (1,) * (NA_DIM - 1))
    fields, _ = CUDA._pack(params, q, q, v, out, lse, None)
    return fields


def test_library_reports_its_table():
    assert LIB.kernels, "the library lists no kernels"
    for (family, dtype, na_dim), dims in LIB.kernels.items():
        assert family in ("simt", "tc", "sm90") and dtype in kernel_table.DTYPES and na_dim in (1, 2, 3)
        assert set(dims) <= set(kernel_table.HEAD_DIM_BUCKETS)


def test_wrong_field_count_is_refused():
    rc, msg = call(problem(), n=LIB.num_fields - 1)  # (NUM_PROBLEM_FIELDS - 1 is an older ABI's count)
    assert rc == 1 and "problem fields" in msg


def test_bad_head_dim_names_the_config():
    rc, msg = call(problem(dim_v=12))
    assert rc == 1 and "multiples of 8" in msg
    spatial = ",".join(str(x) for x in SPATIAL + (0,) * (3 - NA_DIM))
    kernel = ",".join(str(x) for x in KERNEL + (1,) * (3 - NA_DIM))
    assert f"dtype={DTYPE_NAME} na_dim={NA_DIM} batch=2 spatial=({spatial}) heads=2" in msg
    assert f"kernel=({kernel})" in msg and "dilation=(2,1,1)" in msg


def test_misaligned_pointer_is_refused():
    rc, msg = call(problem(offset=1))
    assert rc == 1 and "q is not 16-byte aligned" in msg


def test_head_dim_without_kernel():
    rc, msg = call(problem(dim=264, dim_v=264))
    assert rc == 2 and "no compiled SIMT kernel" in msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_valid_problem_without_gpu_reports_cuda_error():
    rc, msg = call(problem())
    assert rc == 3 and "nattn forward" in msg and "device" in msg


def test_backward_needs_its_buffers():
    rc, msg = call(problem(), fn="backward")
    assert rc == 1 and ("null" in msg)


def test_sm90_configs_list_the_tile_pairs():
    """libnattn lists the Hopper tile pairs of a problem (no GPU needed): one default, the
    backward pair marked, and every pair declined at a dilation above the copy engine's largest
    element stride (8; boxes whose extent times the dilation passes its 256 elements per axis
    are copied in pieces since the twenty-eighth session)."""
    sm90 = [(dt, nd, hd) for (fam, dt, nd), hds in LIB.kernels.items() if fam == "sm90" for hd in hds]
    if not sm90:
        pytest.skip("this build has no sm90 kernels")
    dt, nd, hd = sm90[0]
    spatial = {1: (4096,), 2: (64, 64), 3: (16, 32, 32)}[nd]
    kernel = {1: (255,), 2: (33, 33), 3: (9, 17, 17)}[nd]
    q = torch.empty(1, *spatial, 2, hd, dtype=getattr(torch, dt), device="meta")
    configs = CUDA.sm90_configs(q, q, q, normalize(q, q, q, nd, kernel))
    names = {i.tile_name for i in kernel_table.instances() if i.family == "sm90" and i.na_dim == nd}
    assert {c["name"] for c in configs} <= names and configs
    strips = {kernel_table.Instance("sm90", dt, n, hd, t).tile_name for n, t in kernel_table.SM90_STRIP_TILES}
    assert sum(c["default"] for c in configs) == 1 and all(c["keys"] > 0 for c in configs)
    squares = {kernel_table.Instance("sm90", dt, n, hd, t).tile_name for n, t in kernel_table.SM90_SQUARE_TILES}
    limits = {**{n: "up to 7 x 9" for n in strips}, **{n: "up to 13 x 13" for n in squares}}
    assert all(not c["declined"] if c["name"] not in limits else limits[c["name"]] in c["declined"] for c in configs)
    backward = {kernel_table.Instance("sm90", dt, nd, hd, t).tile_name
                for n, t in kernel_table.SM90_BACKWARD_TILES + kernel_table.SM90_STRIP_TILES
                + kernel_table.SM90_SQUARE_TILES if n == nd}
    assert {c["name"] for c in configs if c["backward"]} <= backward
    big = torch.empty(1, *(s * 9 for s in spatial), 2, hd, dtype=q.dtype, device="meta")
    declined = CUDA.sm90_configs(big, big, big, normalize(big, big, big, nd, (3,) * nd, dilation=(9,) * nd))
    assert declined and all("dilation above 8" in c["declined"] for c in declined)
    pieces = CUDA.sm90_configs(big, big, big, normalize(big, big, big, nd, (3,) * nd, dilation=(8,) * nd))
    assert pieces and not any(c["declined"] for c in pieces)


@pytest.mark.parametrize("nd", [2, 3])
def test_sm90_configs_list_the_strip_pairs(nd, monkeypatch):
    """The strip pairs are listed with the keys their strips walk per query (8 x 16 key rows for
    a 7-row window, 4 x 16 up to 3 rows, per frame of the window in 3-D), as the default forward
    and backward wherever they take a problem (their own rule; the cost model's flag: named
    only), and declined beyond their windows (7 x 9, 7 x 7 x 9) and at a stride, with the
    reason."""
    if 32 not in LIB.kernels.get(("sm90", "bfloat16", nd), ()):
        pytest.skip(f"this build has no bf16 {nd}-D sm90 kernels at head dim 32")
    monkeypatch.delenv("NATTN_SM90_STRIPS")  # their own rule on
    tile = next(t for n, t in kernel_table.SM90_STRIP_TILES if n == nd)
    name = kernel_table.Instance("sm90", "bfloat16", nd, 32, tile).tile_name

    def listed(spatial, kernel, **kw):
        q = torch.empty(1, *spatial, 2, 32, dtype=torch.bfloat16, device="meta")
        return next(c for c in CUDA.sm90_configs(q, q, q, normalize(q, q, q, nd, kernel, **kw)) if c["name"] == name)
    grid = {2: (56, 56), 3: (16, 32, 32)}[nd]
    walks = {2: (((7, 7), 128), ((3, 9), 64), ((5, 3), 128)),
             3: (((5, 7, 7), 640), ((3, 3, 9), 192), ((2, 5, 3), 256))}[nd]
    for kernel, keys in walks:
        c = listed(grid, kernel)
        # the default, forward and backward, by their own rule (not by the cost model: named only there)
        assert c["keys"] == keys and not c["declined"] and c["default"] and c["backward_default"], c
        assert c["named_only"] and c["backward"], c
    too_big = {2: (9, 7), 3: (3, 9, 7)}[nd]
    assert "up to 7 x" in listed(grid, too_big)["declined"]
    assert "stride 1 only" in listed(grid, (3,) * nd, stride=(2,) + (1,) * (nd - 1))["declined"]


@pytest.mark.parametrize("spatial, kernel, head_dim, pair", [
    ((16, 48, 48), (7, 9, 9), 64, "q4x4x8_k2x4x16"),    # measured 0.370 vs 0.424 ms for q2x8x8_k2x8x8
    ((8, 64, 64), (5, 9, 9), 64, "q4x4x8_k2x4x16"),     # 0.319 vs 0.389, equal key counts
    ((30, 48, 80), (18, 24, 24), 128, "q2x8x8_k2x8x8"),  # 46.9 vs 49.0 ms for q4x4x8_k2x4x16
    ((30, 48, 80), (18, 24, 24), 64, "q2x8x8_k2x8x8"),   # above the deep boxes' window limit
    ((16, 32, 32), (3, 11, 11), 128, "q2x8x8_k2x8x8"),  # 0.484 vs 0.611
])
def test_sm90_default_3d_pair(spatial, kernel, head_dim, pair):
    """The default 3-D pair: boxes four frames deep win at head dims <= 64 below 4096 keys
    (timed on the H200), the 2x8x8 box at head dim 128 and on larger windows."""
    if head_dim not in LIB.kernels.get(("sm90", "bfloat16", 3), ()):
        pytest.skip("this build has no bf16 3-D sm90 kernels at this head dim")
    q = torch.empty(1, *spatial, 2, head_dim, dtype=torch.bfloat16, device="meta")
    configs = CUDA.sm90_configs(q, q, q, normalize(q, q, q, 3, kernel))
    assert [c["name"] for c in configs if c["default"]] == [pair]


@pytest.mark.parametrize("spatial, kernel, head_dim, pair", [
    # 3-D: each warpgroup's 2x4x8 half of a 4x4x8 box sees fewer 2x4x8 boxes than a 1x8x8
    # half sees 1x8x8 ones (steps counted on the CPU: 7% fewer on HunyuanVideo, 17% on video-3d)
    ((30, 48, 80), (18, 24, 24), 128, "q4x4x8_k2x4x8"),
    ((16, 32, 32), (5, 7, 7), 64, "q4x4x8_k2x4x8"),
    ((16, 32, 32), (9, 11, 11), 32, "q4x4x8_k2x4x8"),
    ((8, 64, 64), (3, 11, 11), 64, "q2x8x8_k1x8x8"),     # 6% more steps with the 4x4x8 box
    ((21, 60, 90), (11, 33, 33), 128, "q2x8x8_k1x8x8"),  # 2% fewer: the first pair stays
    # 2-D: an 8x8 half of a 16x8 box sees fewer 8x8 boxes than a 4x16 half 4x16 ones on square
    # windows from ~21x21 (8% fewer at 21x21 on 128x128, 4% at FLUX's 80x80, 20% at 25x25 on
    # 256x256), more at 13x13; in 2-D the second pair runs from 3% fewer steps
    ((128, 128), (21, 21), 64, "q16x8_k8x8"),
    ((256, 256), (25, 25), 32, "q16x8_k8x8"),
    ((256, 256), (80, 80), 128, "q16x8_k8x8"),   # 0.960x the steps
    ((90, 160), (33, 33), 128, "q16x8_k8x8"),    # 0.966x
    ((128, 128), (64, 64), 128, "q8x16_k4x16"),  # 0.973x: the first pair stays
    # windows of 10 to 13: the 16x4 halves' own walks in 7x16 boxes (13x13: 448 keys a query
    # inside the grid, 2.65x the window against 16x8 / 4x24's 2.77x; H100, backward alone,
    # 4-10% faster on 11x11-13x13, sixty-second session)
    ((128, 128), (13, 13), 64, "q32x4_k7x16"),
    ((128, 128), (11, 11), 32, "q32x4_k7x16"),
    ((128, 128), (13, 13), 128, "q8x16_k4x16"),  # not built at head dim 128
    # within the 2-D strip pair's windows (video-3d's above is within the 3-D one's): their
    # backward runs only when named
    ((56, 56), (7, 7), 32, "q16x8_k8x8"),
    # head dim 256 (the wide passes, which the count does not model): the first pair
    ((30, 48, 80), (18, 24, 24), 256, "q2x8x8_k1x8x8"),
    ((256, 256), (25, 25), 256, "q8x16_k4x16"),
])
def test_sm90_backward_pair(spatial, kernel, head_dim, pair, monkeypatch):
    """The backward's pair: the first of SM90_BACKWARD_TILES for the NA dim unless another
    walks at least 3% (2-D) / 5% (3-D) fewer warpgroup steps (sm90_dispatch.cu,
    backward_steps); the later pairs' forwards run only when named (not timed as forwards).
    (The square pair's own rule is off here: test_sm90_square_backward_rule.)"""
    monkeypatch.setenv("NATTN_SM90_SQUARES", "0")
    nd = len(spatial)
    later = [kernel_table.Instance("sm90", "bfloat16", nd, head_dim, t).tile_name
             for n, t in kernel_table.SM90_BACKWARD_TILES if n == nd][1:]
    if ("bfloat16", nd, head_dim) not in getattr(LIB, "sm90_backward", ()) or not later:
        pytest.skip("this build has no bf16 sm90 backward at this NA dim and head dim")
    q = torch.empty(1, *spatial, 2, head_dim, dtype=torch.bfloat16, device="meta")
    configs = CUDA.sm90_configs(q, q, q, normalize(q, q, q, nd, kernel))
    assert [c["name"] for c in configs if c["backward_default"]] == [pair]
    assert not {c["name"] for c in configs if c["default"]} & set(later)


def test_sm90_backward_pair_with_rpb_has_rpb_paths(monkeypatch):
    """The pairs with 96- and 112-token column boxes have no RPB paths: with an RPB the
    backward runs a pair that has them (the same problem without one runs q32x4_k7x16)."""
    monkeypatch.setenv("NATTN_SM90_SQUARES", "0")
    if ("bfloat16", 2, 64) not in getattr(LIB, "sm90_backward", ()):
        pytest.skip("this build has no bf16 2-D sm90 backward at head dim 64")
    q = torch.empty(1, 128, 128, 2, 64, dtype=torch.bfloat16, device="meta")
    params = normalize(q, q, q, 2, (13, 13))
    for rpb, pair in ((False, "q32x4_k7x16"), (True, "q8x16_k4x16")):
        configs = LIB.sm90_configs(CUDA._shape_fields(q, q, q, params, rpb))
        assert [c["name"] for c in configs if c["backward_default"]] == [pair], rpb


@pytest.mark.parametrize("spatial, kernel, head_dim, rpb, square", [
    ((128, 128), (11, 11), 32, False, True),   # the square dQ pass, tc's dK/dV pass
    ((56, 56), (9, 9), 32, True, True),
    ((128, 128), (13, 13), 64, True, True),    # D64 with an RPB: tc's dQ pass before
    ((128, 128), (13, 13), 64, False, True),   # D64 without: the square dQ pass, 32x4 / 7x16's dK/dV pass
    ((128, 128), (15, 15), 32, False, False),  # beyond the square pair's windows
    ((128, 128), (13, 7), 32, False, False),   # an axis below 9
])
def test_sm90_square_backward_rule(spatial, kernel, head_dim, rpb, square, monkeypatch):
    """The square pair runs the backward by default where it runs the forward
    (sm90_dispatch.cu, squares_by_default / square_pair_for, the forward's rule);
    NATTN_SM90_SQUARES=0 turns the rule off."""
    if ("bfloat16", 2, head_dim) not in getattr(LIB, "sm90_backward", ()):
        pytest.skip("this build has no bf16 2-D sm90 backward at this head dim")
    q = torch.empty(1, *spatial, 2, head_dim, dtype=torch.bfloat16, device="meta")
    params = normalize(q, q, q, 2, kernel)
    configs = LIB.sm90_configs(CUDA._shape_fields(q, q, q, params, rpb))
    chosen = [c["name"] for c in configs if c["backward_default"]]
    assert (chosen == ["q8x8_k20x20"]) == square, chosen
    assert (CUDA.sm90_preferred(q, q, q, params, rpb=rpb, backward=True) == "native") or not square
    monkeypatch.setenv("NATTN_SM90_SQUARES", "0")
    configs = LIB.sm90_configs(CUDA._shape_fields(q, q, q, params, rpb))
    assert "q8x8_k20x20" not in [c["name"] for c in configs if c["backward_default"]]


@pytest.mark.parametrize("spatial, kernel, dilation, head_dim, pair", [
    ((28, 28), (7, 7), (4, 4), 64, "q8x8_k7x16"),  # 7x7 groups: 8x16 boxes cover 2.6 rows a query (0.152 vs 0.065 ms)
    ((56, 56), (7, 7), (1, 1), 64, "q8x8_k7x16"),
    # 16x4 boxes cover 32 rows of 28, and still ran 0.065 vs 8x8 / 4x24's 0.103 ms (H100)
    ((28, 28), (9, 7), (1, 1), 32, "q16x4_k7x16"),  # an axis below 9: the cost model's choice
    # windows of 9 and more per axis: the square pair's own rule (0.060 vs 16x4 / 7x16's 0.066)
    ((28, 28), (11, 11), (1, 1), 32, "q8x8_k20x20"),
])
def test_sm90_default_2d_pair_counts_padded_query_rows(spatial, kernel, dilation, head_dim, pair):
    """The default 2-D pair's cost counts the query rows its boxes cover beyond the tokens
    (each dilation group's queries rounded up to whole boxes)."""
    if head_dim not in LIB.kernels.get(("sm90", "bfloat16", 2), ()):
        pytest.skip("this build has no bf16 2-D sm90 kernels at this head dim")
    q = torch.empty(1, *spatial, 2, head_dim, dtype=torch.bfloat16, device="meta")
    configs = CUDA.sm90_configs(q, q, q, normalize(q, q, q, 2, kernel, dilation=dilation))
    assert [c["name"] for c in configs if c["default"]] == [pair]
    costs = {c["name"]: c["keys"] for c in configs}
    if dilation == (4, 4):  # 8x16 boxes on 7-token groups: 16 rows for 7 along the last axis
        assert costs["q8x16_k8x8"] > costs["q8x8_k7x16"]


# The default family rules' measured choices (docs/dev/PERF.md, thirtieth session; the GPU
# tier's test_dispatch_gpu.py checks the kernels that actually run): (spatial, kernel, head
# dim, dilation, rpb, backward, sm90 instance head dim, answer).
_RULES = [
    ((56, 56), (7, 7), 32, 1, False, False, 32, "native"),   # 0.094 vs tc 0.104 ms (walk ratio 4.6)
    ((28, 28), (7, 7), 32, 1, False, False, 32, ""),         # 0.115 vs 0.102 (ratio 6.0: 3.5 boxes an axis)
    ((14, 14), (7, 7), 64, 1, False, False, 64, ""),
    ((28, 28), (7, 7), 32, 4, False, False, 32, "native"),   # 0.049 vs 0.056
    ((28, 28), (7, 7), 64, 4, False, False, 64, "native"),   # 0.065 vs 0.072 on the 8x8 pair
    ((56, 56), (7, 7), 64, 2, False, False, 64, ""),         # 0.150 vs 0.141
    ((56, 56), (7, 7), 32, 1, True, False, 32, ""),          # with an RPB 0.121 vs 0.117
    # the square pair (sixty-third session, H100, B32 H8): 0.083 vs 0.110
    ((28, 28), (13, 13), 32, 1, True, False, 32, "native"),
    ((28, 28), (15, 15), 32, 1, True, False, 32, "native"),
    # walk ratio 5.2 on 8x8 / 4x24 (0.083 vs 0.069), 4.2 on 16x4 / 7x16 since the sixty-first
    # session: within the band where sm90 won (not timed on this problem with that pair)
    ((28, 28), (11, 11), 64, 1, True, False, 64, "native"),
    ((28, 28), (13, 13), 64, 1, True, False, 64, "native"),  # mid-2d with an RPB 0.321 vs 0.394
    # with an RPB (forty-eighth session, H100): D64 by the walk ratio, D32 on whole groups
    ((56, 56), (9, 9), 64, 1, True, False, 64, "native"),    # ratio 4.2: 0.175 vs 0.214
    ((28, 28), (7, 7), 64, 4, True, False, 64, "native"),    # 3.0: 0.071 vs 0.083
    ((56, 56), (7, 7), 64, 4, True, False, 64, ""),          # 6.0: 0.188 vs 0.178
    ((28, 28), (7, 7), 32, 4, True, False, 32, "native"),    # 7-token groups: 0.055 vs 0.058
    ((56, 56), (7, 7), 32, 8, True, False, 32, "native"),    # 0.194 vs 0.208
    ((56, 56), (7, 7), 32, 4, True, False, 32, ""),          # 14-token groups: 0.149 vs 0.124
    ((56, 56), (13, 13), 32, 1, True, False, 32, "native"),  # 0.233 vs 0.212; the square pair: 9x9 0.100 vs 0.134
    ((56, 56), (7, 7), 128, 1, False, False, 128, ""),       # 0.084 vs 0.081
    ((56, 56), (13, 13), 128, 1, True, False, 128, ""),      # 0.195 vs 0.148 (dilation 2)
    ((16, 32, 32), (5, 7, 7), 64, 1, False, False, 64, "native"),  # video-3d 0.320 vs 0.335
    ((16, 32, 32), (3, 7, 7), 64, 1, False, False, 64, ""),        # 0.281 vs 0.235
    ((16, 32, 32), (5, 7, 7), 32, 1, False, False, 32, ""),        # 0.292 vs 0.260
    ((16, 32, 32), (5, 9, 9), 32, 1, False, False, 32, "native"),  # 0.316 vs 0.374
    # forty-eighth session (H100): 3-D forwards at D64 up to walk ratio 5.8, at D32 up to 4.8
    ((16, 32, 32), (3, 12, 12), 64, 1, False, False, 64, "native"),  # ratio 5.3: 0.386 vs 0.559
    ((16, 32, 32), (4, 10, 10), 64, 1, False, False, 64, "native"),  # 5.8: 0.451 vs 0.527
    ((16, 32, 32), (3, 10, 10), 64, 1, False, False, 64, ""),        # 7.7: 0.448 vs 0.420
    ((8, 64, 64), (3, 11, 11), 64, 1, False, False, 64, ""),         # 6.35: 0.947 vs 0.912
    ((16, 32, 32), (5, 10, 10), 32, 1, False, False, 32, "native"),  # 4.6: 0.414 vs 0.435
    ((16, 32, 32), (4, 10, 10), 32, 1, False, False, 32, ""),        # 5.8: 0.413 vs 0.366
    ((16, 32, 32), (9, 11, 11), 32, 1, True, False, 32, ""),       # 0.935 vs 1.328
    ((16, 32, 32), (15, 17, 17), 32, 1, True, False, 32, "native"),
    ((16384,), (65,), 64, 1, False, False, 64, "native"),    # 0.061 vs 0.089: one 128-key box
    ((16384,), (97,), 64, 1, False, False, 64, ""),          # 0.115 vs 0.110
    ((16384,), (65,), 64, 1, False, True, 64, "native"),     # the backward (forty-sixth session): 0.215 vs 0.269
    ((16384,), (33,), 64, 1, False, True, 64, "native"),     # 0.212 vs 0.225
    ((16384,), (65,), 32, 1, False, True, 32, ""),           # head dim 32: 0.176 vs 0.155
    ((16384,), (65,), 64, 2, False, True, 64, ""),           # dilated: not measured, 128 keys as before
    ((16384,), (65,), 128, 1, True, True, 128, "native"),    # 0.532 vs 0.601
    ((16384,), (127,), 32, 1, False, False, 32, ""),         # 0.100 vs 0.077
    ((16, 32, 32), (9, 9, 9), 24, 1, False, False, 32, "padded"),  # 729 keys: zero-padded to 32
    # head dim 128 (thirty-fifth session, PERF.md calls 2-3: sm90 vs tc, fwd / backward alone)
    ((65536,), (17,), 128, 1, False, False, 128, ""),        # 0.492 vs 0.449
    ((65536,), (25,), 128, 1, False, False, 128, "native"),  # 0.493 vs 0.521
    ((65536,), (25,), 128, 1, False, True, 128, "native"),   # 1.348 vs 1.523
    ((65536,), (33,), 128, 1, True, True, 128, ""),          # with an RPB 1.821 vs 1.737
    ((61653,), (88,), 128, 3, False, True, 128, "native"),   # dilation 3: 3.15 vs 4.56
    ((128, 128), (5, 5), 128, 1, False, False, 128, ""),     # 0.190 vs 0.154
    ((128, 128), (7, 7), 128, 1, False, False, 128, "native"),  # 0.193 vs 0.205 (walk ratio 7.8)
    ((128, 128), (7, 7), 128, 1, False, True, 128, "native"),   # 0.507 vs 0.549
    ((128, 128), (7, 7), 128, 1, True, True, 128, ""),          # with an RPB 0.825 vs 0.658
    ((128, 128), (13, 13), 128, 1, True, True, 128, "native"),  # with an RPB 1.124 vs 1.247
    ((16, 32, 32), (3, 3, 3), 128, 1, False, False, 128, ""),       # 0.284 vs 0.190
    ((16, 32, 32), (2, 5, 9), 128, 1, False, False, 128, "native"),  # 0.270 vs 0.331
    ((16, 32, 32), (2, 5, 9), 128, 1, False, True, 128, "native"),   # 0.771 vs 0.946
    ((16, 32, 32), (3, 5, 5), 128, 1, False, True, 128, ""),         # 0.891 vs 0.856
    ((16, 32, 32), (5, 7, 7), 128, 1, True, True, 128, ""),          # with an RPB 2.732 vs 2.130
    ((16, 32, 32), (5, 9, 9), 128, 1, True, True, 128, "native"),    # with an RPB 3.880 vs 4.883
    ((17, 40, 52), (5, 3, 7), 128, 1, False, True, 128, ""),         # 105 keys, walk ratio 16.7: 2.75 vs 2.11
    # 2-D at head dim 32 from 500 keys (thirty-sixth session, call 6: backward alone)
    ((128, 128), (21, 21), 32, 1, False, True, 32, ""),        # 1.333 vs 1.272
    ((56, 56), (21, 21), 32, 1, False, True, 32, ""),          # 1.100 vs 0.997
    ((128, 128), (25, 25), 32, 1, False, True, 32, "native"),  # 1.498 vs 1.713
    # the 2-D backward with the 16x8 / 4x24 pair (forty-fifth session, backward alone): head
    # dim 64 from 81 keys without dilation (H100), dilated windows from 150 as before (H200);
    # head dim 32 from 200 keys where that pair runs (H100), else 500 (H200: 15x15)
    ((128, 128), (9, 9), 64, 1, False, True, 64, "native"),    # 0.656 vs 0.697
    ((64, 64), (11, 11), 64, 1, False, True, 64, "native"),    # 0.393 vs 0.431
    ((128, 128), (9, 9), 64, 2, False, True, 64, "native"),    # the square backward (0.685 vs tc's 0.668 before)
    # dilated from 121 keys since the split CTAs (forty-sixth session, H100)
    ((128, 128), (11, 11), 64, 3, False, True, 64, "native"),  # 0.891 vs 0.900 (H200 before: 0.930 vs 0.861)
    ((96, 96), (13, 13), 64, 2, False, True, 64, "native"),    # 0.478 vs 0.624
    ((128, 128), (13, 13), 32, 1, False, True, 32, "native"),  # the square backward (64x64 13x13: 0.333 vs 0.398)
    ((56, 56), (9, 9), 32, 1, True, True, 32, "native"),       # with an RPB 0.454 vs 0.491
    ((128, 128), (13, 13), 64, 1, True, True, 64, "native"),   # D64 with an RPB: the square dQ pass, tc's dK/dV
    ((56, 56), (9, 9), 64, 2, True, True, 64, "native"),
    ((128, 128), (15, 15), 32, 1, False, True, 32, ""),        # 0.821 vs 0.763
    ((128, 128), (17, 17), 32, 1, False, True, 32, "native"),  # 0.413 vs 0.484
    # the 3-D backward by the backward pair's walk ratio (thirty-fifth session, call 4)
    ((17, 33, 58), (7, 5, 13), 32, 1, False, True, 32, ""),          # 455 keys, ratio 9.6: 3.48 vs 2.13 (0.987 vs 1.102 in the forty-eighth)
    ((16, 32, 32), (5, 9, 9), 32, 1, False, True, 32, "native"),     # ratio 3.8 (fourteenth session)
    ((16, 32, 32), (5, 7, 7), 64, 1, False, True, 64, "native"),     # video-3d, ratio 6.3: 0.901 vs 0.930
    ((12, 30, 39), (2, 16, 13), 64, 1, False, True, 64, "native"),   # 416 keys, ratio 4.6
    # forty-eighth session (H100, after the split CTAs): D32 up to 8, D64 up to 10
    ((16, 48, 48), (3, 13, 13), 32, 1, False, True, 32, "native"),   # ratio 4.5: 0.908 vs 1.396
    ((16, 32, 32), (3, 10, 10), 32, 1, False, True, 32, "native"),   # 7.7: 0.744 vs 0.790
    ((8, 48, 48), (3, 5, 12), 32, 1, False, True, 32, ""),           # 8.5: 0.674 vs 0.562
    ((16, 32, 32), (2, 10, 11), 64, 1, False, True, 64, "native"),   # 9.8: 0.648 vs 0.883
    ((16, 32, 32), (2, 5, 10), 64, 1, False, True, 64, ""),          # 11.5: 0.577 vs 0.526
    # 1-D dilation 3-4 at head dim 64: the 64-key pair in one copy, the rules without dilation
    ((155581,), (212,), 64, 4, False, False, 64, "native"),  # 0.359 vs 0.409
    ((155581,), (212,), 64, 4, False, True, 64, "native"),   # 0.851 vs 1.093
    ((16384,), (257,), 64, 5, False, False, 64, ""),         # dilation 5: pieces (0.272 vs 0.218)
]


@pytest.mark.parametrize("spatial, kernel, dim, dilation, rpb, backward, instance, answer", _RULES)
def test_default_family_rules(spatial, kernel, dim, dilation, rpb, backward, instance, answer):
    """libnattn's default Hopper-or-not choice for the problems it was measured on, asked on
    the CPU (``nattn_sm90_preferred``: the rules, before any device query)."""
    nd = len(spatial)
    if instance not in LIB.kernels.get(("sm90", "bfloat16", nd), ()) or getattr(LIB, "_sm90_preferred", None) is None:
        pytest.skip("this build has no bf16 sm90 instance for the case, or no rule query")
    if backward and ("bfloat16", nd, instance) not in LIB.sm90_backward:
        pytest.skip("this build has no sm90 backward for the case")
    q = torch.empty(2, *spatial, 4, dim, dtype=torch.bfloat16, device="meta")
    params = normalize(q, q, q, nd, kernel, dilation=(dilation,) * nd)
    assert CUDA.sm90_preferred(q, q, q, params, rpb=rpb, backward=backward) == answer


@pytest.mark.parametrize("spatial, kernel, dim, rpb", [
    ((56, 56), (7, 7), 32, True),        # DiNAT's layer with an RPB: tc's without the rule
    ((28, 28), (7, 7), 64, False),       # tc's without the rule (walk ratio)
    ((16, 32, 32), (5, 7, 7), 32, False),
])
def test_strip_pairs_default_rule(spatial, kernel, dim, rpb, monkeypatch):
    """The strip pairs are the default, forward and backward, where they take the problem (the
    rules then send it to the Hopper family), unless an axis is dilated 4 or more and some walk
    is not narrow; NATTN_SM90_STRIPS=0 turns their rule off; windows beyond their limits keep
    the usual choice."""
    nd = len(spatial)
    if dim not in LIB.kernels.get(("sm90", "bfloat16", nd), ()) or getattr(LIB, "_sm90_preferred", None) is None:
        pytest.skip("this build has no bf16 sm90 instance for the case, or no rule query")
    name = kernel_table.Instance("sm90", "bfloat16", nd, dim, dict(kernel_table.SM90_STRIP_TILES)[nd]).tile_name
    q = torch.empty(2, *spatial, 4, dim, dtype=torch.bfloat16, device="meta")
    params = normalize(q, q, q, nd, kernel)
    before = CUDA.sm90_configs(q, q, q, params)  # (the fixture's NATTN_SM90_STRIPS=0)
    assert not any(c["name"] == name and (c["default"] or c["backward_default"]) for c in before)
    monkeypatch.delenv("NATTN_SM90_STRIPS")
    configs = CUDA.sm90_configs(q, q, q, params)
    assert [c["name"] for c in configs if c["default"]] == [name]
    assert [c["name"] for c in configs if c["backward_default"]] == [name]
    for backward in (False, True):
        assert CUDA.sm90_preferred(q, q, q, params, rpb=rpb, backward=backward) == "native"
    wide = normalize(q, q, q, nd, (9,) * nd)  # beyond the strip pairs' windows
    assert not any(c["default"] and c["name"] == name for c in CUDA.sm90_configs(q, q, q, wide))
    big = torch.empty(2, *(4 * n for n in spatial), 4, dim, dtype=torch.bfloat16, device="meta")
    dilated = normalize(big, big, big, nd, kernel, dilation=(4,) * nd)  # groups about a window long
    assert not any(c["default"] and c["name"] == name for c in CUDA.sm90_configs(big, big, big, dilated))
    # dilated 8, but every walk narrow (the last axis' groups 7 long, its window the whole group)
    cut = torch.empty(2, *spatial[:-1], 8 * kernel[-1], 4, dim, dtype=torch.bfloat16, device="meta")
    narrow = normalize(cut, cut, cut, nd, kernel, dilation=(1,) * (nd - 1) + (8,))
    configs = CUDA.sm90_configs(cut, cut, cut, narrow)
    assert [c["name"] for c in configs if c["default"]] == [name]
    assert [c["name"] for c in configs if c["backward_default"]] == [name]


def test_bench_dry_run_prints_the_configurations(capsys):
    """On the library's own (dtype, NA dim, head dim), and on one it has no kernel for."""
    from nattn.bench.__main__ import main
    dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[DTYPE_NAME]
    size = {1: ["512"], 2: ["64", "64"], 3: ["16", "32", "32"]}[NA_DIM]
    window = {1: ["33"], 2: ["9"], 3: ["5"]}[NA_DIM]
    assert main(["-i", *size, "-w", *window, "-d", str(DIM), "--dtype", dtype, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "simt: 1 configuration" in out and "custom" in out and "libnattn:" not in out
    assert main(["-i", *size, "-w", *window, "-d", "264", "--dtype", dtype, "--dry-run"]) == 0
    assert "libnattn:" in capsys.readouterr().out  # no kernel for head dim 264: said, not raised


@pytest.mark.parametrize("size, window, dim, says", [
    (["128", "128"], ["7", "7"], 128, "runs by default, forward and backward"),
    (["128", "128"], ["5", "5"], 128, "not the default here"),
    (["16", "32", "32"], ["5", "7", "7"], 32, "runs the backward by default; the forward runs another family"),
    (["16", "32", "32"], ["5", "7", "7"], 64, "runs by default, forward and backward"),
])
def test_bench_dry_run_says_which_passes_the_rules_run_on_sm90(capsys, size, window, dim, says):
    """The dry run's Hopper line names the passes libnattn's rules give the family (its
    measured choices, PERF.md thirty-fifth and thirty-sixth sessions: 7x7 at head dim 128
    both, 5x5 neither, video-3d's 5x7x7 at 64 both, at 32 neither)."""
    from nattn.bench.__main__ import main
    nd = len(size)
    if dim not in LIB.kernels.get(("sm90", "bfloat16", nd), ()) or getattr(LIB, "_sm90_preferred", None) is None:
        pytest.skip("this build has no bf16 sm90 instance for the case, or no rule query")
    if ("bfloat16", nd, dim) not in LIB.sm90_backward:
        pytest.skip("this build has no sm90 backward for the case")
    assert main(["-i", *size, "-w", *window, "-d", str(dim), "--dtype", "bf16", "--dry-run"]) == 0
    assert says in capsys.readouterr().out


def test_bench_optimize_needs_a_hopper_gpu():
    from nattn.bench.__main__ import main
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("a 9.0 GPU is here: the GPU tier times --optimize")
    with pytest.raises(SystemExit, match="compute capability 9.0"):
        main(["-i", "64", "64", "-w", "33", "--optimize"])


def test_per_call_configuration_fields_are_checked():
    """The tile pair, dQ mode and split-KV factor a call names (PROBLEM_FIELDS' last eight) are
    validated before any device work; a valid one reaches the device step."""
    fields = problem()
    tile, dq = kernel_table.FIELD_OFFSETS["tile"], kernel_table.FIELD_OFFSETS["dq_mode"]
    fields[tile] = 300
    rc, msg = call(fields)
    assert rc == 1 and "tile extents must be in [0, 256]" in msg
    fields = problem()
    fields[dq] = 5
    rc, msg = call(fields)
    assert rc == 1 and "dq_mode must be 0 (default), 1 (deterministic pass) or 2 (KV-parallel), got 5" in msg
    fields = problem()
    fields[kernel_table.FIELD_OFFSETS["kv_splits"]] = 65
    rc, msg = call(fields)
    assert rc == 1 and "kv_splits must be in [0, 64] (0 or 1: no split), got 65" in msg
    if torch.cuda.is_available():  # the last step would launch on the GPU with placeholder pointers
        return
    fields = problem()
    fields[tile:tile + 6] = (8, 8, 1, 7, 16, 1)
    fields[dq] = 2
    fields[kernel_table.FIELD_OFFSETS["kv_splits"]] = 4
    rc, msg = call(fields)
    assert rc == 3 and "device" in msg  # no GPU here: past every check


def _dropout_problem(dtype, p=0.3, rng_ptr=1 << 20):
    """A valid problem (head dim 32, every family builds it) with attention dropout fields."""
    q = torch.zeros(2, *SPATIAL, 2, 32, dtype=dtype)
    out, lse = torch.empty_like(q), torch.empty(2, *SPATIAL, 2)
    params = normalize(q, q, q, NA_DIM, KERNEL, dropout_p=p)
    fields, _ = CUDA._template(params, (q, q, q, out, None, None, None, None))
    for slot, t in zip(cuda_backend._PTR_SLOTS, (q, q, q, out, lse)):
        fields[slot] = t.data_ptr()
    fields[kernel_table.FIELD_OFFSETS["rng_ptr"]] = rng_ptr
    return fields


def _simt_dropout_by_default() -> bool:
    """Whether the loaded library runs the SIMT family's dropout without being asked: libraries
    that still read the old opt-in variable NATTN_SIMT_DROPOUT, or predate SIMT dropout, do not."""
    with open(LIB.path, "rb") as f:
        return LIB.abi >= 4 and b"NATTN_SIMT_DROPOUT" not in f.read()


def test_library_reports_its_dropout_families(monkeypatch):
    """ABI 3: the tensor-core family runs attention dropout wherever it is compiled, and the
    SIMT family everywhere else (an ABI 2 library, from before dropout, has none)."""
    monkeypatch.delenv("NATTN_SIMT_DROPOUT", raising=False)
    compiled = {family for family, _, _ in LIB.kernels}
    if LIB.abi < 3:
        expect = set()
    elif _simt_dropout_by_default():
        expect = compiled & {"tc", "simt"}
    else:
        expect = compiled & {"tc"}
    assert LIB.dropout_families == expect
    assert kernel_table.ABI_PROBLEM_FIELDS[LIB.abi] == LIB.num_fields


needs_abi3 = pytest.mark.skipif(LIB is None or LIB.abi < 3, reason="a library from before ABI 3 (no dropout)")


@needs_abi3
def test_dropout_fields_are_checked():
    """dropout_p's bits, its threshold (floor(p * 2^32)) and the rng pointer are validated
    before any device work, the message naming dropout_p among the configuration."""
    f = kernel_table.FIELD_OFFSETS
    rc, msg = call(_dropout_problem(torch.float32, rng_ptr=0))
    assert rc == 1 and "dropout_p > 0 needs rng_ptr" in msg and "dropout_p=0.3]" in msg
    fields = _dropout_problem(torch.float32)
    fields[f["rng_ptr"]] = (1 << 20) + 4
    assert "8-byte aligned" in call(fields)[1]
    fields = _dropout_problem(torch.float32)
    fields[f["dropout_threshold"]] += 1
    rc, msg = call(fields)
    assert rc == 1 and "does not match dropout_p" in msg and f"= {dropout.drop_threshold(0.3)})" in msg
    fields = _dropout_problem(torch.float32)
    fields[f["dropout_p_bits"]] = struct.unpack("<q", struct.pack("<d", 1.5))[0]
    rc, msg = call(fields)
    assert rc == 1 and "dropout_p must be in [0, 1), got 1.5" in msg
    fields = _dropout_problem(torch.float32, p=0.0)
    fields[f["dropout_threshold"]] = 7
    rc, msg = call(fields)
    assert rc == 1 and "dropout_threshold 7 without dropout_p" in msg


@needs_abi3
def test_simt_dropout_runs_by_default(monkeypatch):
    """Problems with dropout that the SIMT family runs (float32, and with NATTN_FAMILY=simt
    every dtype) pass every check, forward and backward, whatever the old opt-in variable says;
    the Hopper family's configuration listing accepts them (and lists nothing)."""
    if not any(family == "simt" and dt == "float32" for family, dt, _ in LIB.kernels):
        pytest.skip("this build has no float32 SIMT kernel")
    if not _simt_dropout_by_default():
        pytest.skip(f"{LIB.path} predates SIMT dropout by default: rebuild it")
    monkeypatch.delenv("NATTN_FAMILY", raising=False)
    for value in (None, "0", "1"):
        if value is None:
            monkeypatch.delenv("NATTN_SIMT_DROPOUT", raising=False)
        else:
            monkeypatch.setenv("NATTN_SIMT_DROPOUT", value)
        assert "simt" in LIB.dropout_families and CUDA.supports_dropout
        assert LIB.sm90_configs(_dropout_problem(torch.float32)) == []  # build_params accepts it
        if not torch.cuda.is_available():  # past every check: a GPU would launch with placeholder pointers
            rc, msg = call(_dropout_problem(torch.float32))
            assert rc == 3 and "device" in msg, (value, msg)
        rc, msg = call(_dropout_problem(torch.float32), fn="backward")  # the backward's checks come next
        assert rc == 1 and "grad_out pointer is null" in msg, (value, msg)
    monkeypatch.setenv("NATTN_FAMILY", "simt")  # 16-bit problems run the SIMT family too
    for dt in {dt for _, dt, _ in LIB.kernels} - {"float32"}:
        LIB.sm90_configs(_dropout_problem(getattr(torch, dt)))  # accepted (no ValueError)
        rc, msg = call(_dropout_problem(getattr(torch, dt)), fn="backward")
        assert rc == 1 and "grad_out pointer is null" in msg, (dt, msg)


def test_sm90_backward_minimum_by_head_dim():
    """The backward's sm90 minimum window without an RPB (timed on the H200 against tc's
    passes): 2-D at head dims <= 32 from 500 keys and 3-D at <= 64 from 400 (where the walk
    ratio does not decide), head dim 128 (where tc
    runs one block per SM) from 25 / 49 / 80 keys, else the per-NA-dim minimum; the Python
    dispatch reads the same table."""
    if not hasattr(LIB, "sm90_min_window_backward_head") or not LIB.sm90_min_window_backward_head:
        pytest.skip("this build predates the per-head-dim backward minimum")
    table, per_dim = LIB.sm90_min_window_backward_head, LIB.sm90_min_window_backward
    assert table[(3, 32)] == table[(3, 64)] == 400 and table[(2, 32)] == 500
    assert table[(2, 64)] == per_dim[2] and table[(1, 32)] == per_dim[1] and table[(1, 64)] == per_dim[1]
    assert (table[(1, 128)], table[(2, 128)], table[(3, 128)]) == (25, 49, 80)
    assert all(per_dim[n] < 400 for n in (1, 2, 3))


def _entry_call(entry, args, kw):
    """libnattn's ``entry`` on ``args`` updated by ``kw`` (CPU addresses: the checks run before
    the GPU), as (return code, message)."""
    args = {**args, **kw}
    err = ctypes.create_string_buffer(512)
    rc = getattr(LIB, entry)(*args.values(), None, err, 512)
    return rc, err.value.decode()


def layer_norm_call(**kw):
    """One nattn_layer_norm call on CPU tensors' addresses."""
    x = torch.zeros(4, 64 + 8, dtype=torch.bfloat16)
    y = torch.empty(4, 64, dtype=torch.bfloat16)
    w = torch.ones(64)
    return _entry_call("layer_norm", dict(
        device=0, x_ptr=x.data_ptr(), x_row=72, x_dtype=2, y_ptr=y.data_ptr(), y_dtype=2, w_ptr=w.data_ptr(),
        b_ptr=0, w_dtype=0, rows=4, channels=64, eps=1e-5, round=0), kw)


def test_layer_norm_checks_its_arguments():
    """Each bad argument is refused with code 1 and a message that names it."""
    assert LIB.layer_norm is not None and LIB.layer_norm_max_channels == 1024
    for kw, words in (
        (dict(x_dtype=3), "x_dtype must be 0 (float32), 1 (float16) or 2 (bfloat16), got 3"),
        (dict(y_dtype=-1), "y_dtype must be"),
        (dict(w_dtype=7), "w_dtype must be"),
        (dict(channels=12, x_row=72), "channels must be a multiple of 8 from 8 to 1024, got 12"),
        (dict(channels=1032, x_row=1032), "got 1032"),
        (dict(x_row=60), "x_row (60) must be >= channels (64)"),
        (dict(x_row=68), "16-byte aligned rows (x_row=68)"),
        (dict(x_ptr=0), "non-null"),
        (dict(w_ptr=8), "w and b must be 16-byte aligned"),
        (dict(eps=-1.0), "eps must be >= 0"),
        (dict(rows=-2), "rows must be from 0"),
    ):
        assert_refused(layer_norm_call, kw, words)
    assert layer_norm_call(rows=0) == (0, "")  # nothing to launch


def assert_refused(call, kw, words):
    rc, msg = call(**kw)
    assert rc == 1 and words in msg and msg.startswith("nattn layer_norm: "), (kw, msg)


def add_layer_norm_call(**kw):
    """One nattn_add_layer_norm call on CPU tensors' addresses."""
    x, s = torch.zeros(4, 64 + 8), torch.empty(4, 64)
    r, y = torch.zeros(4, 64, dtype=torch.bfloat16), torch.empty(4, 64, dtype=torch.bfloat16)
    w = torch.ones(64)
    return _entry_call("add_layer_norm", dict(
        device=0, x_ptr=x.data_ptr(), x_row=72, x_dtype=0, r_ptr=r.data_ptr(), r_row=64, r_dtype=2,
        s_ptr=s.data_ptr(), s_dtype=0, y_ptr=y.data_ptr(), y_dtype=2, w_ptr=w.data_ptr(), b_ptr=0, w_dtype=0,
        rows=4, channels=64, eps=1e-5, round=1), kw)


def test_add_layer_norm_checks_its_arguments():
    """The fused residual add's entry refuses each bad argument with code 1 and a message that
    names it, the norm's own (shared with nattn_layer_norm) and the branch's and sum's."""
    assert LIB.add_layer_norm is not None
    for kw, words in (
        (dict(r_ptr=0), "r must be non-null"),
        (dict(r_dtype=5), "r_dtype must be 0 (float32), 1 (float16) or 2 (bfloat16), got 5"),
        (dict(s_dtype=-1), "s_dtype must be"),
        (dict(r_row=56), "r_row (56) must be >= channels (64)"),
        (dict(r_row=68), "r and s must be non-null with 16-byte aligned rows (r_row=68)"),
        (dict(s_ptr=0), "r and s must be non-null"),
        (dict(x_dtype=3), "x_dtype must be"),
        (dict(channels=12, x_row=72, r_row=72), "channels must be a multiple of 8"),
        (dict(eps=-1.0), "eps must be >= 0"),
    ):
        assert_refused(add_layer_norm_call, kw, words)
    assert add_layer_norm_call(rows=0) == (0, "")  # nothing to launch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
@pytest.mark.parametrize("call", [layer_norm_call, add_layer_norm_call])
def test_layer_norm_without_gpu_reports_cuda_error(call):
    rc, msg = call()
    assert rc == 3 and "on device 0" in msg
