"""The kernel table: which instances each family compiles, and the generated dispatch table."""

import math

import pytest

from nattn._cuda import kernel_table as kt


def test_simt_covers_everything_and_tc_up_to_128():
    """tc: fp16/bf16, and float32 through TF32 (its float32 rows: TF32_FAMILY), head dims <= 128."""
    insts = kt.instances()
    simt = {(i.dtype, i.na_dim, i.head_dim) for i in insts if i.family == "simt"}
    tc = {(i.dtype, i.na_dim, i.head_dim) for i in insts if i.family == "tc"}
    assert simt == {(d, n, h) for d in kt.DTYPES for n in kt.NA_DIMS for h in kt.HEAD_DIM_BUCKETS}
    assert tc == {(d, n, h) for d in kt.DTYPES for n in kt.NA_DIMS for h in (16, 32, 64, 128)}
    assert kt.TF32_FAMILY == "tc" and "float32" in kt.FAMILY_BY_NAME[kt.TF32_FAMILY].dtypes


def test_sm90_is_16_bit_with_exact_head_dims():
    insts = kt.instances()
    sm90 = {(i.dtype, i.na_dim, i.head_dim) for i in insts if i.family == "sm90"}
    assert sm90 == {(d, n, h) for d in ("float16", "bfloat16") for n in kt.NA_DIMS for h in (32, 64, 128, 256)}
    # one instance per (query box, key box) pair of its NA dim; untiled families have none
    for i in insts:
        if i.family != "sm90":
            assert i.tile is None and i.tile_name == ""
            continue
        q, k = i.tile
        assert len(q) == len(k) == i.na_dim
        # 128 queries (even along axis 0) or 64; key boxes whole 16s up to 160, the last
        # axis whole 8-column groups (tiles.cuh, box_mask.cuh); the strip pairs' key box is
        # a window union of 16 columns, named only, with their own backward (forward_strips.cuh,
        # backward_dq_strips.cuh)
        assert (math.prod(q) == 128 and q[0] % 2 == 0) or math.prod(q) == 64
        if (i.na_dim, i.tile) in kt.SM90_STRIP_TILES:  # four strips of 2 x 8 queries, 16 key columns
            assert q == ((8, 8) if i.na_dim == 2 else (2, 4, 8)) and k[-1] == 16 and math.prod(k) > 160
            assert i.has_backward and i.forward_named_only
        elif (i.na_dim, i.tile) in kt.SM90_SQUARE_TILES:  # four squares of 4 x 4 queries, a 20 x 20 union
            assert q == (8, 8) and k == (20, 20) and i.has_backward and i.forward_named_only
        else:
            assert math.prod(k) % 16 == 0 and 64 <= math.prod(k) <= 160 and k[-1] % 8 == 0
        if math.prod(q) == 64:  # one consumer warpgroup: registers for head dims up to 64
            assert i.head_dim <= 64
        if i.head_dim == 256:  # O is 128 registers: only 64-key boxes; the backward pairs' wide passes
            assert math.prod(k) == 64
            assert i.has_backward == ((i.na_dim, i.tile) in kt.SM90_BACKWARD_TILES)
    # every pair says at which head dims it is built but the 64-key-box 128-query ones
    for na, t in kt.SM90_TILES:
        listed = any(x == t for x, _ in kt.SM90_TILE_HEAD_DIMS)
        assert listed == (math.prod(t[0]) == 64 or math.prod(t[1]) > 64), t
    per_na = {n: {i.tile_name for i in insts if i.family == "sm90" and i.na_dim == n} for n in kt.NA_DIMS}
    assert per_na[1] == {"q128_k128", "q128_k64", "q64_k128"}
    assert {"q8x16_k8x16", "q8x8_k7x16"} <= per_na[2] and {"q2x8x8_k2x8x8", "q2x4x8_k1x5x16"} <= per_na[3]
    assert len({i.stem for i in insts}) == len(insts)  # every instance its own file
    # the library's default pair per NA dim is the first it meets in the table (src/sm90_dispatch.cu)
    for n in kt.NA_DIMS:
        default = next(t for na, t in kt.SM90_TILES if na == n)
        first = next(i for i in insts if i.family == "sm90" and i.na_dim == n and i.dtype == "bfloat16"
                     and i.head_dim == 64)
        assert first.tile == default
    fam = kt.FAMILY_BY_NAME["sm90"]
    assert fam.backward and fam.prepare and fam.only_archs == ("9.0",)
    # a backward pair per NA dim (2-D: four, 3-D: two), each also a forward pair; only those
    # and the strip and square pairs get one
    assert sorted(n for n, _ in kt.SM90_BACKWARD_TILES) == [1, 2, 2, 2, 2, 3, 3]
    assert set(kt.SM90_BACKWARD_TILES) <= set(kt.SM90_TILES)
    sm90 = [i for i in insts if i.family == "sm90"]
    assert {(i.na_dim, i.tile) for i in sm90 if i.has_backward} == (
        set(kt.SM90_BACKWARD_TILES) | set(kt.SM90_STRIP_TILES) | set(kt.SM90_SQUARE_TILES))
    for i in sm90:
        src = kt.instance_source(i)
        assert ("launch_backward" in src) == i.has_backward == ("prepare_backward" in src)
        q, k = i.tile
        if i.has_backward and (i.na_dim, i.tile) not in kt.SM90_STRIP_TILES + kt.SM90_SQUARE_TILES:
            # a 128-token box and a 64-token box (the two passes swap them), or a 96- or
            # 112-token one at head dims up to 64 (S / dP of 64 x 96 or 64 x 112 beside dQ, or
            # dK and dV)
            assert math.prod(q) == 128 and (math.prod(k) == 64 or (math.prod(k) in (96, 112) and i.head_dim <= 64))
    # forwards only when named: the backward pairs after each NA dim's first (built for the
    # backward's walk: 2-D's 16x8 / 8x8 and 16x8 / 4x24, 3-D's 4x4x8 / 2x4x8) and the strip
    # pairs (their own rule), and the pairs no GPU has run yet, flagged in the table's rows
    later = {(2, ((16, 8), (8, 8))), (2, ((16, 8), (4, 24))), (2, ((32, 4), (7, 16))),
             (3, ((4, 4, 8), (2, 4, 8)))} | set(kt.SM90_STRIP_TILES) | set(kt.SM90_SQUARE_TILES)
    later |= set(kt.SM90_UNVERIFIED_TILES)
    assert set(kt.SM90_NAMED_FORWARD_TILES) == later
    assert {(i.na_dim, i.tile) for i in sm90 if i.forward_named_only} == later
    named = next(i for i in sm90 if i.forward_named_only and not i.unverified)
    assert kt.table_source([named]).rstrip().count(", true, false},") == 1
    # an unverified pair's row says so: its backward too runs only when named
    assert {(i.na_dim, i.tile) for i in sm90 if i.unverified} == set(kt.SM90_UNVERIFIED_TILES)
    for i in sm90:
        if i.unverified:
            assert kt.table_source([i]).rstrip().count(", true, true},") == 1


def test_arch_specific_families_only_when_their_arch_is_built():
    for archs, has_sm90 in (("8.0", False), ("8.0;9.0", True), ("9.0", True), ("5.0;8.6", False), ("", True)):
        fams = {i.family for i in kt.instances(archs=archs)}
        assert ("sm90" in fams) == has_sm90, archs
        assert {"simt", "tc"} <= fams


def test_subsets_apply_to_every_family():
    insts = kt.instances("float32,bfloat16", "64;256", "2", "8.0")
    got = {(i.family, i.dtype, i.head_dim) for i in insts}
    assert got == {("simt", "float32", 64), ("simt", "float32", 256), ("simt", "bfloat16", 64),
                   ("simt", "bfloat16", 256), ("tc", "float32", 64), ("tc", "bfloat16", 64)}
    assert all(i.na_dim == 2 for i in insts)
    with_sm90 = {(i.family, i.dtype, i.head_dim) for i in kt.instances("float32,bfloat16", "64;256", "2", "9.0")}
    assert with_sm90 == got | {("sm90", "bfloat16", 64), ("sm90", "bfloat16", 256)}


def test_generated_table_names_every_family(tmp_path):
    insts = kt.instances("bfloat16", "32", "1", "9.0")
    sources = kt.generate(str(tmp_path), insts, kt.window_instances("bfloat16", "1"))
    assert sorted(p.rsplit("/", 1)[-1] for p in sources) == [
        "kernel_table.cu", "simt_bfloat16_na1d_hd32.cu", "sm90_bfloat16_na1d_hd32_q128_k128.cu",
        "sm90_bfloat16_na1d_hd32_q128_k64.cu", "sm90_bfloat16_na1d_hd32_q64_k128.cu", "tc_bfloat16_na1d_hd32.cu",
        "window_bfloat16_na1d.cu", "window_table.cu"]
    windows = (tmp_path / "window_table.cu").read_text()
    assert "{2, 1, &launch_window<nattn::bf16_t, 1>}," in windows and "kNumWindowKernels = 1;" in windows
    assert "template void launch_window<nattn::bf16_t, 1>" in (tmp_path / "window_bfloat16_na1d.cu").read_text()
    table = (tmp_path / "kernel_table.cu").read_text()
    for fam in ("simt", "tc", "sm90"):
        assert f'#include "nattn/{fam}/launch.h"' in table
    args = "nattn::bf16_t, 1, 32"
    assert (f'{{"tc", 2, 1, 32, &tc::launch_forward<{args}>, &tc::launch_backward<{args}>, nullptr, nullptr, '
            '{0, 0, 0}, {0, 0, 0}, false, false}' in table)
    hargs = f"{args}, nattn::sm90::Tile<128, 1, 1, 128, 1, 1>"
    assert (f'{{"sm90", 2, 1, 32, &sm90::launch_forward<{hargs}>, nullptr, &sm90::prepare_forward<{hargs}>, '
            'nullptr, {128, 1, 1}, {128, 1, 1}, false, false}' in table)
    bargs = f"{args}, nattn::sm90::Tile<128, 1, 1, 64, 1, 1>"
    assert (f'{{"sm90", 2, 1, 32, &sm90::launch_forward<{bargs}>, &sm90::launch_backward<{bargs}>, '
            f'&sm90::prepare_forward<{bargs}>, &sm90::prepare_backward<{bargs}>, {{128, 1, 1}}, {{64, 1, 1}}, '
            'false, false}' in table)
    inst = (tmp_path / "tc_bfloat16_na1d_hd32.cu").read_text()
    assert '#include "nattn/tc/kernels.cuh"' in inst and "namespace tc" in inst
    hopper = (tmp_path / "sm90_bfloat16_na1d_hd32_q128_k128.cu").read_text()
    assert "prepare_forward<" in hopper and "launch_backward" not in hopper
    hopper_bwd = (tmp_path / "sm90_bfloat16_na1d_hd32_q128_k64.cu").read_text()
    assert "launch_backward<" in hopper_bwd and "prepare_backward<" in hopper_bwd


def test_wgmma_wrappers_are_current():
    import subprocess, sys, os
    tool = os.path.join(os.path.dirname(__file__), "..", "csrc", "tools", "gen_wgmma.py")
    assert subprocess.run([sys.executable, tool, "--check"]).returncode == 0


def test_families_subset():
    """NATTN_FAMILIES keeps the named families (and simt, the library's fallback) only, and
    names what it accepts otherwise."""
    tc = kt.instances("bfloat16", "32;64", "2;3", "9.0", "tc")
    assert {i.family for i in tc} == {"tc", "simt"}
    assert {i.family for i in kt.instances(families="tc;sm90")} == {"simt", "tc", "sm90"}
    assert len(kt.instances()) == len(kt.instances(families="simt,tc,sm90"))
    with pytest.raises(ValueError, match="simt"):
        kt.instances(families="tensorcore")
