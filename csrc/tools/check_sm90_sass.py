"""Checks the Hopper family's machine code in a built libnattn: every sm90 attention kernel
(forward, dQ and dK/dV passes) must use the warpgroup MMA (HGMMA; the strip pairs' forward
and dQ pass, forward_strips.cuh and backward_dq_strips.cuh, and the square pair's forward,
forward_squares.cuh, the warp MMA, HMMA) and the bulk
tensor copy engine (UTMALDG), no sm90
kernel (the backward's delta and dQ-conversion helpers, the split-KV merge and the
zero-padded head dims' copies, src/sm90_padded.cu, included) may touch local memory (LDL/STL:
spilled registers or an array indexed at run time; the square pair's forward and dQ pass, at
three CTAs an SM in 168 registers, may spill a few setup values that their epilogue reads,
before their first MMA and after their last, never among their products), and no kernel may wait on the warpgroup
MMAs after each one (as many WARPGROUP.DEPBAR as HGMMA: ptxas serialized them, warning C7514,
because accumulators were read while a product was in flight).

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
STRIP_REQUIRED = ("HMMA", "UTMALDG")
FORBIDDEN = ("LDL", "STL")
# Kernels whose local memory may lie outside the span from their first MMA to their last (the
# square pair's ring kernels: forward_squares.cuh, and the persistent forms, whose per-box
# setup precedes the walk: forward_squares_persistent.cuh, backward_dq_squares_persistent.cuh);
# at most SPILL_MOST such instructions.
SPILLS_OUTSIDE_PRODUCTS = ("forward_squares_kernel", "backward_dq_squares_kernel", "forward_squares_run_kernel",
                           "backward_dq_squares_run_kernel", "backward_dkv_squares_run_kernel")
SPILL_MOST = 48


def candidates():
    """cuobjdumps to try, newest toolkit first: the wheels' (nvidia/cu13/bin, ...), the CUDA
    toolkit's, then PATH's (which may be an older toolkit that cannot read sm_90a code)."""
    site = sysconfig.get_paths()["purelib"]
    found = sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")), reverse=True)
    found += [p for p in ("/usr/local/cuda/bin/cuobjdump", shutil.which("cuobjdump")) if p and os.path.isfile(p)]
    return list(dict.fromkeys(found))


def find_cuobjdump():
    """A cuobjdump known to read sm_90a code (a wheel's or the CUDA toolkit's), or None."""
    found = [c for c in candidates() if c != shutil.which("cuobjdump") or c.startswith("/usr/local/cuda")]
    return found[0] if found else None


def dump_sass(library):
    """The SASS of the library from the first cuobjdump that can read it."""
    errors = []
    for tool in candidates():
        r = subprocess.run([tool, "-sass", library], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout
        errors.append(f"{tool}: {r.stderr.strip()[:200]}")
    raise RuntimeError("no cuobjdump could read " + library + ("\n" + "\n".join(errors) if errors else ""))


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


# An instruction's opcode with its modifiers (HMMA.16816.F32.BF16), after the address
# comment and any predicate.
OPCODE = re.compile(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def opcodes(text: str):
    """The opcodes (with modifiers) of a function's SASS text, in order."""
    return OPCODE.findall(text)


def local_among_products(name, ops):
    """Problems of a kernel allowed a few spills outside its products: local memory between its
    first and last MMA (HMMA / HGMMA), or more than SPILL_MOST local accesses."""
    mma = [i for i, op in enumerate(ops) if op.split(".")[0] in ("HMMA", "HGMMA")]
    local = [i for i, op in enumerate(ops) if op.split(".")[0] in FORBIDDEN]
    problems = []
    if mma and any(mma[0] < i < mma[-1] for i in local):
        problems.append(f"{name}: uses local memory among its products")
    if len(local) > SPILL_MOST:
        problems.append(f"{name}: uses local memory {len(local)} times (at most {SPILL_MOST} outside its products)")
    return problems


def check(sass: str):
    """Problems found, and the number of sm90 kernels checked."""
    problems, n = [], 0
    for name, text in kernels(sass).items():
        if "sm90" not in name:
            continue
        n += 1
        seq = opcodes(text)
        ops = {op.split(".")[0] for op in seq}
        helpers = ("delta_kernel", "delta_packed_kernel", "dq_convert_kernel", "split_kv_merge_kernel",
                   "pad_copy_kernel")  # no products
        helper = any(h in name for h in helpers)
        # the strip pairs' forward and dQ pass, the square pair's forward: mma.sync on each warp's queries
        strips = any(k in name for k in ("_strips_kernel", "_squares_kernel", "_squares_run_kernel"))
        for op in (STRIP_REQUIRED if strips else REQUIRED) if not helper else ():
            if op not in ops:
                problems.append(f"{name}: no {op}")
        if any(k in name for k in SPILLS_OUTSIDE_PRODUCTS):
            problems += local_among_products(name, seq)
        else:
            for op in FORBIDDEN:
                if op in ops:
                    problems.append(f"{name}: uses local memory ({op})")
        mmas, waits = len(re.findall(r"\bHGMMA\b", text)), len(re.findall(r"\bWARPGROUP\.DEPBAR\b", text))
        if mmas and waits * 2 > mmas:  # the kernels wait once per group of products, not per product
            problems.append(f"{name}: wgmma serialized ({waits} waits for {mmas} HGMMA; ptxas C7514)")
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
    if not candidates():
        print("cuobjdump not found (pip install nvidia-cuda-cuobjdump)", file=sys.stderr)
        return 2
    problems, n = check(dump_sass(argv[1]))
    for p in problems:
        print("ERROR:", p)
    if not problems:
        print(f"   sm90 SASS: {n} kernels use {' and '.join(REQUIRED)} (the strip and square pairs' HMMA), none "
              "touches local memory among its products (only the square pair's setup values outside them) "
              "or serializes its HGMMA")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
