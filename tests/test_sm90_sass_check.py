"""The CI's SASS check of the Hopper family (csrc/tools/check_sm90_sass.py) on made-up dumps:
it must pass a kernel with HGMMA and UTMALDG and fail one without them or with local memory."""

import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "csrc", "tools", "check_sm90_sass.py")
_spec = importlib.util.spec_from_file_location("check_sm90_sass", _PATH)
sass_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_check)


def dump(name, *ops):
    lines = [f"\t\tFunction : {name}"]
    lines += [f"        /*{16 * i:04x}*/                   {op} R0, R1 ;" for i, op in enumerate(ops)]
    return "\n".join(lines) + "\n"


GOOD = "_ZN5nattn4sm9014forward_kernelILi2ELi64EEEv"


def test_good_kernel_passes_and_others_are_ignored():
    sass = dump(GOOD, "UTMALDG.4D", "HGMMA.64x128x16.F32.BF16", "@!P0 BAR.ARV") + dump("_ZN5nattn2tc1kEv", "STL", "HMMA")
    assert sass_check.check(sass) == ([], 1)


def test_missing_instructions_and_local_memory_fail():
    problems, _ = sass_check.check(dump(GOOD, "UTMALDG.4D", "HMMA.16816.F32"))
    assert any("no HGMMA" in p for p in problems)
    problems, _ = sass_check.check(dump(GOOD, "HGMMA.64x128x16.F32.BF16", "LDG.E"))
    assert any("no UTMALDG" in p for p in problems)
    problems, _ = sass_check.check(dump(GOOD, "UTMALDG.4D", "HGMMA.64x128x16.F32.BF16", "@P1 STL [R1], R2"))
    assert any("local memory" in p for p in problems)
    assert sass_check.check(dump("_ZN5nattn2tc1kEv", "HMMA"))[0] == ["no sm90 kernel found in the library"]


def test_serialized_warpgroup_mmas_fail():
    """A wait after every HGMMA (ptxas C7514) fails; one wait per group of products passes."""
    mma, wait = "HGMMA.64x128x16.F32.BF16", "WARPGROUP.DEPBAR.LE gsb0, 0x0"
    grouped = dump(GOOD, "UTMALDG.4D", mma, mma, mma, mma, wait)
    assert sass_check.check(grouped) == ([], 1)
    serialized = dump(GOOD, "UTMALDG.4D", mma, wait, mma, wait, mma, wait)
    problems, _ = sass_check.check(serialized)
    assert len(problems) == 1 and "wgmma serialized (3 waits for 3 HGMMA" in problems[0]


def test_helpers_need_no_products_but_no_local_memory():
    """The Hopper family's helpers without products (delta, dQ conversion, split-KV merge,
    the zero-padded head dims' copies) pass without HGMMA / UTMALDG, and fail with local
    memory (the copies once kept their strides there: ~1 TB/s)."""
    pad = "_ZN5nattn4host47_GLOBAL__N__d9e0993d_14_sm90_padded_cu_33f946c815pad_copy_kernelILb1ELi2EEEvNS1_7PadCopyE"
    assert sass_check.check(dump(pad, "LDG.E.128", "STG.E.128")) == ([], 1)
    problems, _ = sass_check.check(dump(pad, "STL.64 [R1], R4", "LDG.E.128", "STG.E.128"))
    assert len(problems) == 1 and "local memory" in problems[0]


@pytest.mark.parametrize("strips", ["_ZN5nattn4sm9021forward_strips_kernelINS_6bf16_tELi2ELi32EEEv",
                                    "_ZN5nattn4sm9025backward_dq_strips_kernelINS_6bf16_tELi2ELi32EEEv"])
def test_strip_kernels_need_the_warp_mma_and_the_copy_engine(strips):
    """The strip pairs' forward and dQ pass (mma.sync on each warp's strip) pass with HMMA and
    UTMALDG, and fail without either or with local memory."""
    assert sass_check.check(dump(strips, "UTMALDG.4D", "HMMA.16816.F32.BF16", "LDSM.16.M88.4")) == ([], 1)
    problems, _ = sass_check.check(dump(strips, "UTMALDG.4D", "LDSM.16.M88.4"))
    assert problems == [f"{strips}: no HMMA"]
    problems, _ = sass_check.check(dump(strips, "HMMA.16816.F32.BF16", "LDG.E"))
    assert problems == [f"{strips}: no UTMALDG"]
    problems, _ = sass_check.check(dump(strips, "UTMALDG.4D", "HMMA.16816.F32.BF16", "STL [R1], R2"))
    assert any("local memory" in p for p in problems)


@pytest.mark.parametrize("square", ["_ZN5nattn4sm9022forward_squares_kernelINS_6bf16_tELi2ELi64EEEv",
                                    "_ZN5nattn4sm9026backward_dq_squares_kernelINS_6bf16_tELi2ELi64EEEv"])
def test_square_kernels_may_spill_only_outside_their_products(square):
    """The square pair's forward and dQ pass (three CTAs an SM) pass with local memory before
    their first HMMA and after their last, and fail with it among their products or with more
    than SPILL_MOST local accesses; other kernels fail with any."""
    mma, tma = "HMMA.16816.F32.BF16", "UTMALDG.4D"
    assert sass_check.check(dump(square, tma, "STL [R1], R2", mma, "LDSM.16.M88.4", mma, "LDL R2, [R1]")) == ([], 1)
    problems, _ = sass_check.check(dump(square, tma, mma, "LDL R2, [R1]", mma))
    assert problems == [f"{square}: uses local memory among its products"]
    many = ["STL [R1], R2"] * (sass_check.SPILL_MOST + 1)
    problems, _ = sass_check.check(dump(square, tma, *many, mma))
    assert len(problems) == 1 and "at most" in problems[0]
    strips = "_ZN5nattn4sm9021forward_strips_kernelINS_6bf16_tELi2ELi32EEEv"
    problems, _ = sass_check.check(dump(strips, tma, "STL [R1], R2", mma))
    assert any("local memory" in p for p in problems)
