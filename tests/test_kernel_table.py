"""The kernel table: which instances each family compiles, and the generated dispatch table."""

from nattn._cuda import kernel_table as kt


def test_simt_covers_everything_and_tc_only_16_bit_up_to_128():
    insts = kt.instances()
    simt = {(i.dtype, i.na_dim, i.head_dim) for i in insts if i.family == "simt"}
    tc = {(i.dtype, i.na_dim, i.head_dim) for i in insts if i.family == "tc"}
    assert simt == {(d, n, h) for d in kt.DTYPES for n in kt.NA_DIMS for h in kt.HEAD_DIM_BUCKETS}
    assert tc == {(d, n, h) for d in ("float16", "bfloat16") for n in kt.NA_DIMS for h in (16, 32, 64, 128)}


def test_subsets_apply_to_every_family():
    insts = kt.instances("float32,bfloat16", "64;256", "2")
    got = {(i.family, i.dtype, i.head_dim) for i in insts}
    assert got == {("simt", "float32", 64), ("simt", "float32", 256), ("simt", "bfloat16", 64),
                   ("simt", "bfloat16", 256), ("tc", "bfloat16", 64)}
    assert all(i.na_dim == 2 for i in insts)


def test_generated_table_names_both_families(tmp_path):
    insts = kt.instances("bfloat16", "32", "1")
    sources = kt.generate(str(tmp_path), insts)
    assert sorted(p.rsplit("/", 1)[-1] for p in sources) == [
        "kernel_table.cu", "simt_bfloat16_na1d_hd32.cu", "tc_bfloat16_na1d_hd32.cu"]
    table = (tmp_path / "kernel_table.cu").read_text()
    assert '#include "nattn/simt/launch.h"' in table and '#include "nattn/tc/launch.h"' in table
    assert '{"tc", 2, 1, 32, &tc::launch_forward<nattn::bf16_t, 1, 32>' in table
    inst = (tmp_path / "tc_bfloat16_na1d_hd32.cu").read_text()
    assert '#include "nattn/tc/kernels.cuh"' in inst and "namespace tc" in inst
