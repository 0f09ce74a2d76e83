"""benchmarks/ncu_stalls.py on a made-up Nsight Compute source-page export: instructions are
classified by opcode (predicates stripped) and their sampled stalls summed per class."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "ncu_stalls.py")
_spec = importlib.util.spec_from_file_location("ncu_stalls", _PATH)
ncu_stalls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_stalls)

CSV = '''==PROF== Connected to process 1
"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
"0x7f00","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR24], R24, gsb0 ;","30","20"
"0x7f10","WARPGROUP.DEPBAR.LE gsb0, 0x0 ;","50","50"
"0x7f20","@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2+URZ], R3 ;","15","15"
"0x7f30","MUFU.EX2 R96, R96 ;","4","1"
"0x7f40","BAR.SYNC.DEFER_BLOCKING R3, 0x100 ;","1,000","900"
"0x7f50","IMAD.MOV.U32 R1, RZ, RZ, R2 ;","",""
'''


def test_summary_by_class(tmp_path):
    path = tmp_path / "source.csv"
    path.write_text(CSV)
    rows = ncu_stalls.read(str(path))
    assert [n for _, n in rows] == [30, 50, 15, 4, 1000, 0]
    text = ncu_stalls.summarise(rows, top=2)
    assert text.startswith("1099 samples over 6 instructions")
    assert "| named barrier | 1000 | 91.0% |" in text
    assert "| wgmma wait/fence | 50 | 4.5% |" in text and "| mbarrier wait/arrive | 15 | 1.4% |" in text
    assert text.rstrip().endswith("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;")  # the second of the top two


def test_opcodes_and_a_file_without_samples(tmp_path):
    assert ncu_stalls.opcode("@!UP1 FMNMX R94, R24, -INF , !PT ;") == "FMNMX"
    assert ncu_stalls.classify("UTMALDG") == "bulk copies (TMA)" and ncu_stalls.classify("XYZ") == "other"
    path = tmp_path / "empty.csv"
    path.write_text('"# Address","Source"\n"0x0","NOP ;"\n')
    try:
        ncu_stalls.read(str(path))
    except ValueError as e:
        assert "no header with a sampling column" in str(e)
    else:
        raise AssertionError("a page without samples must be refused")


def test_setup_split(tmp_path):
    """--once: instructions executed at most once per warp (4 warps here) against the loop's."""
    path = tmp_path / "exec.csv"
    path.write_text('"# Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n'
                    '"0x0","LDG.E R2, desc[UR4][R4.64] ;","60","4"\n'
                    '"0x10","IMAD R3, R2, R2, RZ ;","10","4"\n'
                    '"0x20","HMMA.16816.F32.BF16 R8, R12, R16, R8 ;","30","28"\n'
                    '"0x30","EXIT ;","0","0"\n')
    rows = ncu_stalls.read(str(path), with_executed=True)
    assert [e for _, _, e in rows] == [4, 4, 28, 0]
    text = ncu_stalls.setup_split(rows, 4)
    assert "22.2% of the instructions (2 per unit), 70.0% of the samples" in text
    assert ncu_stalls.read(str(path))[0] == ("LDG.E R2, desc[UR4][R4.64] ;", 60.0)  # default: pairs
