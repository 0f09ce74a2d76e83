"""Where a kernel's warps wait, per SASS instruction class, from Nsight Compute's source page.

Collect on the GPU machine (one launch of the kernel, PC sampling on), then export the source
page as CSV and summarise it anywhere:

    NATTN_FAMILY=sm90 ncu --clock-control none --section SourceCounters --section WarpStateStats \\
        -k regex:forward_kernel -c 1 -o fwd python3 benchmarks/sm90_profile.py flux-2d-w80-s16
    ncu -i fwd.ncu-rep --page source --csv --print-source sass > fwd_source.csv
    python benchmarks/ncu_stalls.py fwd_source.csv [--top 25]

(`bash tests/gpu/run_device.sh ncu` does the first two for the forward, dQ and dK/dV kernels of
NCU_PROBLEM.) The summary sums the sampled warp stalls of every instruction by class: the
warpgroup MMAs (HGMMA), their waits (WARPGROUP.DEPBAR / ARRIVE), mbarrier waits (SYNCS: a
consumer waiting for the producer's copies, or the producer for a free slot), named barriers
(BAR: the warpgroups' turns), the softmax's arithmetic (MUFU, FMNMX, FADD/FMUL/FFMA),
conversions (F2FP), shuffles and votes, copies (UTMALDG/UBLKCP), memory, and the rest; then
the instructions with the most samples. Column names differ between Nsight Compute versions:
the sample column is the first whose name has "Sampl" and "All" in it (else any "Sampl").

``--once N`` (the launch's warp count) also splits the instructions executed at most N times
(per-warp setup and epilogue: run once per warp) from the rest (the loops), with each part's
share of the executed instructions and of the samples: the tc passes at DiNAT's 7x7 spent 32-39%
of their instructions and 42-51% of their samples outside their loops (PERF.md, fourteenth
session).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from typing import Dict, List, Tuple

CLASSES = (  # (class, opcode prefixes), first match wins
    ("wgmma", ("HGMMA",)),
    ("wgmma wait/fence", ("WARPGROUP",)),
    ("mbarrier wait/arrive", ("SYNCS",)),
    ("named barrier", ("BAR",)),
    ("exp (MUFU)", ("MUFU",)),
    ("max (FMNMX)", ("FMNMX",)),
    ("fp32 add/mul/fma", ("FADD", "FMUL", "FFMA", "FSEL", "FSETP")),
    ("convert/pack (F2FP, F2F)", ("F2FP", "F2F", "I2F", "F2I")),
    ("shuffle/vote", ("SHFL", "VOTE", "MATCH")),
    ("bulk copies (TMA)", ("UTMALDG", "UTMASTG", "UBLKCP", "UTMAREDG", "UTMACMDFLUSH")),
    ("shared/global memory", ("LDS", "STS", "LDG", "STG", "LDSM", "STSM", "RED", "ATOM", "LDC")),
    ("integer/predicate", ("IMAD", "IADD", "ISETP", "LOP", "SHF", "LEA", "SEL", "PRMT", "IABS", "IMNMX", "PLOP")),
    ("branch/control", ("BRA", "BSSY", "BSYNC", "WARPSYNC", "EXIT", "CALL", "RET", "NOP", "YIELD")),
)


def opcode(sass: str) -> str:
    """The opcode of a SASS line such as ``@!P0 HGMMA.64x128x16.F32.BF16 R24, ...``."""
    text = re.sub(r"^\s*@!?U?P\w+\s+", "", sass.strip())
    m = re.match(r"([A-Z][A-Z0-9_]*)", text)
    return m.group(1) if m else ""


def classify(op: str) -> str:
    for name, prefixes in CLASSES:
        if any(op == p or op.startswith(p) for p in prefixes):
            return name
    return "other"


def _sample_column(header: List[str]) -> int:
    for want in (("Sampl", "All"), ("Sampl",)):
        for i, name in enumerate(header):
            if all(w in name for w in want):
                return i
    raise ValueError(f"no warp-sampling column in {header}")


def _source_column(header: List[str]) -> int:
    for i, name in enumerate(header):
        if name.strip().lower() in ("source", "sass"):
            return i
    raise ValueError(f"no Source column in {header}")


def _executed_column(header: List[str]) -> int:
    for i, name in enumerate(header):
        if name.strip() == "Instructions Executed":
            return i
    return -1


def read(path: str, with_executed: bool = False) -> List[Tuple]:
    """(SASS text, sampled stalls) per instruction of the exported source page; with
    ``with_executed`` also the warp-level executions ("Instructions Executed", 0 if absent)."""
    rows: List[Tuple] = []
    with open(path, newline="") as f:
        reader = csv.reader(line for line in f if not line.startswith("==PROF=="))
        header = None
        for row in reader:
            if header is None:
                if any("Sampl" in c for c in row):
                    header = row
                    src, smp, exe = _source_column(row), _sample_column(row), _executed_column(row)
                continue
            if len(row) <= max(src, smp, exe):
                continue
            try:
                n = float(row[smp].replace(",", "") or 0)
                e = float(row[exe].replace(",", "") or 0) if exe >= 0 else 0.0
            except ValueError:
                continue
            rows.append((row[src], n, e) if with_executed else (row[src], n))
    if header is None:
        raise ValueError(f"{path}: no header with a sampling column (export with --page source --csv)")
    return rows


def summarise(rows: List[Tuple[str, float]], top: int = 20) -> str:
    total = sum(n for _, n in rows) or 1.0
    by_class: Dict[str, float] = defaultdict(float)
    for sass, n in rows:
        by_class[classify(opcode(sass))] += n
    out = [f"{int(total)} samples over {len(rows)} instructions", "", "| class | samples | share |", "|---|---|---|"]
    for name, n in sorted(by_class.items(), key=lambda kv: -kv[1]):
        out.append(f"| {name} | {int(n)} | {100 * n / total:.1f}% |")
    out += ["", f"top {top} instructions:"]
    for sass, n in sorted(rows, key=lambda r: -r[1])[:top]:
        out.append(f"  {100 * n / total:5.1f}%  {sass.strip()[:110]}")
    return "\n".join(out)


def setup_split(rows: List[Tuple[str, float, float]], once: float) -> str:
    """Instructions executed at most ``once`` times (per-warp setup) against the rest."""
    executed = sum(e for _, _, e in rows) or 1.0
    samples = sum(n for _, n, _ in rows) or 1.0
    set_e = sum(e for _, _, e in rows if 0 < e <= once)
    set_n = sum(n for _, n, e in rows if 0 < e <= once)
    return (f"executed at most {int(once)} times: {100 * set_e / executed:.1f}% of the instructions "
            f"({set_e / once:.0f} per unit), {100 * set_n / samples:.1f}% of the samples; "
            f"the rest: {100 - 100 * set_e / executed:.1f}% / {100 - 100 * set_n / samples:.1f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+", help="source pages exported by ncu -i REP --page source --csv --print-source sass")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--once", type=float, default=0,
                    help="the launch's warps: split instructions run at most this often (setup) from the loops")
    args = ap.parse_args(argv)
    for path in args.csv:
        print(f"== {path}")
        print(summarise(read(path), args.top))
        if args.once > 0:
            print(setup_split(read(path, with_executed=True), args.once))
    return 0


if __name__ == "__main__":
    sys.exit(main())
