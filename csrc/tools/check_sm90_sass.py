"""Checks the Hopper family's machine code in a built libnattn: every sm90 kernel must use
the warpgroup MMA (HGMMA) and the bulk tensor copy engine (UTMALDG), and none may touch
local memory (LDL/STL: spilled registers or a register array indexed at run time).

    python csrc/tools/check_sm90_sass.py build/libnattn.so
    python csrc/tools/check_sm90_sass.py --find     # where cuobjdump is, exit 1 if nowhere

Needs cuobjdump: from the CUDA toolkit on PATH, or the nvidia-cuda-cuobjdump wheel.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

REQUIRED = ("HGMMA", "UTMALDG")
FORBIDDEN = ("LDL", "STL")


def find_cuobjdump():
    path = shutil.which("cuobjdump")
    if path:
        return path
    site = sysconfig.get_paths()["purelib"]
    hits = sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")))
    return hits[-1] if hits else None


def kernels(sass: str):
    """{function name: its SASS text} for every function in the dump."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            out[name].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def check(sass: str):
    """Problems found, and the number of sm90 kernels checked."""
    problems, n = [], 0
    for name, text in kernels(sass).items():
        if "sm90" not in name:
            continue
        n += 1
        ops = set(re.findall(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text))
        for op in REQUIRED:
            if op not in ops:
                problems.append(f"{name}: no {op}")
        for op in FORBIDDEN:
            if op in ops:
                problems.append(f"{name}: uses local memory ({op})")
    if n == 0:
        problems.append("no sm90 kernel found in the library")
    return problems, n


def main(argv):
    if argv[1:] == ["--find"]:  # exit 0 when cuobjdump is there (the CI installs it otherwise)
        tool = find_cuobjdump()
        print(tool or "cuobjdump not found")
        return 0 if tool else 1
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tool = find_cuobjdump()
    if not tool:
        print("cuobjdump not found (pip install nvidia-cuda-cuobjdump)", file=sys.stderr)
        return 2
    sass = subprocess.run([tool, "-sass", argv[1]], capture_output=True, text=True, check=True).stdout
    problems, n = check(sass)
    for p in problems:
        print("ERROR:", p)
    if not problems:
        print(f"   sm90 SASS: {n} kernels use {' and '.join(REQUIRED)}, none touches local memory")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
