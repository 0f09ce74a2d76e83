"""The kernels' index math, run on the CPU (needs nvcc, no GPU): the same header code compiled
for the host. csrc/tests/window_math_check.cu checks windows, inverse neighborhoods and the SIMT
kernels' incremental window cursor against direct formulas; csrc/tests/tiling_check.cu replays
the tensor-core kernels' warp walk (boxes, window unions, lines, chunks, masks, RPB indices)
and checks that every query keeps exactly its window and every key exactly its inverse;
csrc/tests/window_ops_check.cu runs the unfused window ops' per-element code (dot, sum,
inverse sum) against a brute-force scatter over random windows; csrc/tests/sm90_rows_check.cu
checks that the Hopper family's query boxes and their rows cover every token exactly once and
that its kernels' box walk (BoxWalk) visits the boxes the step index decodes to;
csrc/tests/sm90_box_mask_check.cu checks its one-bit-per-group window masks against direct
coordinate tests
(the output, and split-KV's box-local partial rows, are written through that mapping);
csrc/tests/drpb_fixed_check.cu checks the fixed-point dRPB's scale (no 32-bit overflow in a
block, the rounding step relative to the head's largest |dS|); csrc/tests/sm90_map_spec_check.cu
checks that the Hopper tensor maps address the element the strides give in every layout the
API accepts (heads-first tensors included) and decline the layouts they cannot express;
csrc/tests/sm90_pad_copy_check.cu checks the zero-padded head dims' copies address each
chunk's element in the strided tensor and its packed slot; csrc/tests/sm90_ordered_dq_check.cu
checks that an ordered KV-parallel dQ's key CTAs, walking the query-box grid, carry every
rank of every box once, in blockIdx order (a gap would hang the waiting CTAs);
csrc/tests/sm90_strips_check.cu checks the strip CTA's walk: each lane's scores are the keys
its fragments read, its mask bits exactly its rows' windows, its RPB indices exact (and
inside the table's guards where masked); csrc/tests/sm90_squares_check.cu checks the square CTA's
walk the same way, and the K / V fragment addresses it forms per walk-row parity against the
swizzled tiles' offsets; csrc/tests/sm90_strips_dkv_check.cu checks the strip
dK/dV pass's walk the other way round: the key box's union fits its slabs, each lane's masks
are exactly its keys' inverse neighbourhoods (each query of the range once), its RPB indices
and staged LSE slots (and their tokens) exact, its narrow steps (two lines' first 8 columns)
keeping exactly the wide walk's scores, and a step's fixed-point dRPB adds in 32 distinct
shared-memory banks; csrc/tests/sm90_squares_dkv_check.cu checks the square dK/dV pass's walk
the same way (its slab width, each step's reads inside the tiles and its fragment addresses at
the warp's swizzle phase, masks, staged slots and RPB indices; each query of the range once);
csrc/tests/sm90_square_runs_check.cu replays the copies and counts of the persistent square
forward and dQ pass through random runs of boxes and interleavings of four warps (each chunk
reads its landed parts, the query tile holds the Q or dO a warp reads, no copy lands where a
warp reads, barrier phases in order, no deadlock), then checks that the persistent kernels'
runs (square_run_box, square_dkv_run_box) visit every box of the whole-box grids once."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = os.environ.get("CUDACXX") or shutil.which("nvcc")


def _build_and_run(tmp_path, name, *flags):
    exe = tmp_path / name
    subprocess.run(
        [NVCC, "-std=c++17", "-O2", *flags, "-I", os.path.join(ROOT, "csrc", "include"), "-o", str(exe),
         os.path.join(ROOT, "csrc", "tests", f"{name}.cu")],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)


# window math, the tensor-core walk, the unfused window ops, the Hopper query boxes' rows and
# window masks, the fixed-point dRPB's scale, the Hopper tensor maps' addressing, the padded
# copies, the ordered KV-parallel dQ's grid and ranks, the strip CTA's walk, the square CTA's
# walk, the strip dK/dV walk, the square dK/dV walk, the persistent square kernels' copy protocol
CHECKS = ["window_math_check", "tiling_check", "window_ops_check", "sm90_rows_check", "sm90_box_mask_check",
          "drpb_fixed_check", "sm90_map_spec_check", "sm90_pad_copy_check", "sm90_ordered_dq_check",
          "sm90_strips_check", "sm90_squares_check", "sm90_strips_dkv_check", "sm90_squares_dkv_check",
          "sm90_square_runs_check"]


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
@pytest.mark.parametrize("name", CHECKS)
def test_host_check_passes(tmp_path, name):
    run = _build_and_run(tmp_path, name)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
def test_strip_dkv_sink_form_passes(tmp_path):
    """The strip dK/dV pass's other table form (build switch NATTN_SM90_STRIP_DKV_GUARD=0: the
    sink form; the default build, checked above, has the guard form) lays its tables out as the
    kernel assumes."""
    run = _build_and_run(tmp_path, "sm90_strips_dkv_check", "-DNATTN_SM90_STRIP_DKV_GUARD=0")
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr
