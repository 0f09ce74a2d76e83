"""Machine code of kernel instances before and after a source change, without a GPU: compiles
the named instances from the work tree and from a git revision to cubins (nvcc -cubin, one
arch), dumps their SASS and compares each kernel's opcode sequence (register numbers and
addresses aside). A refactor that must not change the default kernels shows "same" on every
row; "reordered" is the same opcodes in another order, "changed" reports the instruction
counts and the local-memory (spill) instructions of both sides.

    python csrc/tools/sass_diff.py --base HEAD~1 tc_bfloat16_na2d_hd32 tc_bfloat16_na3d_hd64
    python csrc/tools/sass_diff.py --base HEAD -D NATTN_TC_STAGES=3 tc_bfloat16_na2d_hd32
                                                      # -D: macros for the work tree's side only
    python csrc/tools/sass_diff.py --base HEAD~3 --drop 'ELi1(?=EEEv)' tc_bfloat16_na2d_hd32
                                                      # a template argument added with a default

Instance names are the generated sources' (nattn/_cuda/kernel_table.py:
FAMILY_DTYPE_naND_hdHD). Needs nvcc and cuobjdump (with nvdisasm beside it: the
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, or the CUDA toolkit). Exit status 1 when
a kernel changed and --strict is given.
"""

import argparse
import collections
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_sm90_sass import candidates, kernels, opcodes  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# (sm90 instances end in their tile pair: sm90_bfloat16_na3d_hd128_q2x8x8_k1x8x8)
INSTANCE = re.compile(r"(\w+?)_(float32|float16|bfloat16)_na([123])d_hd(\d+)(?:_q[\dx]+_k[\dx]+)?")


def generate(tree: str, out: str, names):
    """The generated instance sources of `names` from the source tree `tree`, into `out`."""
    parts = [INSTANCE.fullmatch(n) for n in names]
    bad = [n for n, m in zip(names, parts) if m is None]
    if bad:
        sys.exit(f"instance names look like tc_bfloat16_na2d_hd32, got {bad}")
    pick = lambda i: ";".join(sorted({m.group(i) for m in parts}))  # noqa: E731
    subprocess.run([sys.executable, os.path.join(tree, "nattn", "_cuda", "kernel_table.py"), "--out", out,
                    "--families", pick(1), "--dtypes", pick(2), "--na-dims", pick(3), "--head-dims", pick(4)],
                   check=True, capture_output=True)


def compile_sass(tree: str, gen: str, name: str, arch: str, macros, work: str):
    """{kernel: [opcodes]} of one instance compiled from `tree`."""
    cubin = os.path.join(work, f"{name}.cubin")
    cmd = ["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", f"-arch={arch}", "-cubin",
           "-I" + os.path.join(tree, "csrc", "include"), "-I" + gen, os.path.join(gen, f"{name}.cu"), "-o", cubin]
    cmd += [f"-D{m}" for m in macros]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"nvcc failed for {name} ({tree}):\n{r.stderr[-2000:]}")
    for tool in candidates():
        env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep + os.environ.get("PATH", ""))
        d = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, env=env)
        if d.returncode == 0:
            return {k: opcodes(text) for k, text in kernels(d.stdout).items()}
    sys.exit("no cuobjdump could read the cubin (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def arch_for(name: str) -> str:
    """The arch an instance's kernels are built for: the Hopper family's need sm_90a."""
    return "sm_90a" if name.startswith("sm90_") else "sm_90"


def verdict(a, b) -> str:
    if a == b:
        return "same"
    if collections.Counter(a) == collections.Counter(b):
        return "reordered"
    spills = lambda ops: sum(o.split(".")[0] in ("LDL", "STL") for o in ops)  # noqa: E731
    return f"changed: {len(a)} -> {len(b)} instructions, local memory {spills(a)} -> {spills(b)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instances", nargs="+", help="generated instance names, e.g. tc_bfloat16_na2d_hd32")
    ap.add_argument("--base", required=True, help="git revision to compare the work tree with")
    # (sm90 instances need sm_90a: built for sm_90 their kernels are empty, and every one
    # compared "same" whatever the change)
    ap.add_argument("--arch", default=None, help="default: sm_90a for sm90 instances, sm_90 for the others")
    ap.add_argument("-D", dest="macros", action="append", default=[], help="a macro for the work tree's side")
    ap.add_argument("--drop", metavar="REGEX", help="removed from the kernels' mangled names before matching "
                    "(a template argument added with a default renames its kernels)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a kernel changed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        os.makedirs(base)
        archive = subprocess.run(["git", "-C", REPO, "archive", args.base, "csrc", "nattn/_cuda"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        sides = {}
        for side, tree, macros in (("base", base, []), ("work", REPO, args.macros)):
            gen = os.path.join(tmp, f"gen-{side}")
            work = os.path.join(tmp, f"cubin-{side}")
            os.makedirs(work)
            generate(tree, gen, args.instances)
            with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                done = pool.map(lambda n: compile_sass(tree, gen, n, args.arch or arch_for(n), macros, work),
                                args.instances)
                sides[side] = dict(zip(args.instances, done))
    changed = 0
    rename = (lambda k: re.sub(args.drop, "", k)) if args.drop else (lambda k: k)  # noqa: E731
    for name in args.instances:
        a, b = ({rename(k): v for k, v in sides[s][name].items()} for s in ("base", "work"))
        for kernel in sorted(set(a) | set(b)):
            if kernel not in a or kernel not in b:
                print(f"{name}  {kernel[:90]}: only in {'the work tree' if kernel in b else args.base}")
                changed += 1
                continue
            v = verdict(a[kernel], b[kernel])
            changed += v.startswith("changed")
            print(f"{name}  {kernel[:90]}: {v}")
    print(f"{changed} kernel(s) changed against {args.base}")
    return 1 if changed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
