"""Attention dropout's random bits: nattn/dropout.py (PyTorch) against Philox-4x32-10's
known-answer vectors and, bit for bit, against csrc/include/nattn/common/philox.cuh, which
csrc/tests/philox_check.cu runs on the CPU (built with nvcc as tests/test_cuda_window_math.py
builds its host checks, and with g++: the header is plain C++ without nvcc); plus the
threshold rule and the statistics of the mask."""

import math
import os
import shutil
import subprocess

import pytest
import torch

from nattn import dropout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = os.environ.get("CUDACXX") or shutil.which("nvcc")
GXX = shutil.which("g++")
SOURCE = os.path.join(ROOT, "csrc", "tests", "philox_check.cu")
INCLUDE = os.path.join(ROOT, "csrc", "include")

# Philox-4x32-10 known answers (counter, key, output words) from Random123's kat_vectors.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_known_answer_vectors():
    for counter, key, want in KNOWN_ANSWERS:
        got = dropout.philox4x32(counter, key)
        assert [int(w) for w in got] == list(want), (counter, key)
    # the same, batched: each vector as one element of index tensors, the key as tensors too
    counters = [torch.tensor([c[i] for c, _, _ in KNOWN_ANSWERS]) for i in range(4)]
    keys = [torch.tensor([k[i] for _, k, _ in KNOWN_ANSWERS]) for i in range(2)]
    got = dropout.philox4x32(counters, keys)
    for i in range(4):
        assert got[i].tolist() == [w[i] for _, _, w in KNOWN_ANSWERS]


def test_mul_hi_lo_is_exact():
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randint(0, 2**32, (4000,), generator=g), torch.tensor([0, 1, 2**32 - 1, 2**31])])
    for m in (dropout.PHILOX_M0, dropout.PHILOX_M1, 0xFFFFFFFF, 1):
        hi, lo = dropout._mul_hi_lo(x, m)
        want = [int(v) * m for v in x.tolist()]
        assert hi.tolist() == [w >> 32 for w in want]
        assert lo.tolist() == [w & 0xFFFFFFFF for w in want]


def test_threshold_rule():
    assert dropout.drop_threshold(0.0) == 0
    assert dropout.drop_threshold(0.5) == 2**31
    assert dropout.drop_threshold(0.25) == 2**30
    assert dropout.drop_threshold(1 / 3) == math.floor(2**32 / 3)  # floor, not round
    assert dropout.drop_threshold(1e-12) == 0  # below 2^-32: nothing dropped
    assert dropout.drop_threshold(math.nextafter(1.0, 0.0)) == 2**32 - 1
    # keep iff word >= threshold: p = 0.5 keeps the upper half of the words
    words = torch.tensor([0, 2**31 - 1, 2**31, 2**32 - 1])
    assert (words >= dropout.drop_threshold(0.5)).tolist() == [False, False, True, True]
    rng = torch.tensor([5, 7])
    assert dropout.keep_mask(rng, 0.0, 0, 0, 0, torch.arange(64)).all()  # p = 0 keeps every element


def _int64(values):
    """uint64 values as the int64 tensor holding the same bits (how the rng tensor stores them)."""
    return torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.int64)


def _check_against(lines):
    assert lines[0].startswith("ok "), lines[0]
    w_rows = [list(map(int, line.split()[1:])) for line in lines if line.startswith("w ")]
    k_rows = [line.split()[1:] for line in lines if line.startswith("k ")]
    assert len(w_rows) + len(k_rows) == int(lines[0].split()[1]) and w_rows and k_rows

    cols = list(zip(*w_rows))
    rng = (_int64(cols[0]), _int64(cols[1]))  # per-row seeds and offsets (int64 bits)
    idx = [torch.tensor(c, dtype=torch.int64) for c in cols[2:6]]
    got = dropout.dropout_words(rng, *idx)
    for i in range(4):
        assert got[i].tolist() == list(cols[6 + i]), f"word {i}"

    cols = list(zip(*k_rows))
    rng = (_int64([int(x) for x in cols[0]]), _int64([int(x) for x in cols[1]]))
    b, h, q, k = (torch.tensor([int(x) for x in c], dtype=torch.int64) for c in cols[2:6])
    probabilities = [float(x) for x in cols[6]]
    assert [dropout.drop_threshold(p) for p in probabilities] == [int(x) for x in cols[7]]
    words = dropout.dropout_word(rng, b, h, q, k)
    assert words.tolist() == [int(x) for x in cols[8]]
    thresholds = torch.tensor([dropout.drop_threshold(p) for p in probabilities])
    assert (words >= thresholds).tolist() == [x == "1" for x in cols[9]]
    # keep_mask with one probability per call agrees with the rows of that probability
    for p in set(probabilities):
        rows = torch.tensor([x == p for x in probabilities])
        mask = dropout.keep_mask((rng[0][rows], rng[1][rows]), p, b[rows], h[rows], q[rows], k[rows])
        assert mask.tolist() == [x == "1" for x, r in zip(cols[9], rows.tolist()) if r]


def _build_and_run(tmp_path, compiler):
    exe = tmp_path / "philox_check"
    cmd = [compiler, "-std=c++17", "-O2", "-I", INCLUDE, "-o", str(exe), SOURCE]
    if compiler == GXX:
        cmd = [compiler, "-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-O2", "-I", INCLUDE,
               "-o", str(exe), SOURCE]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[:2000] + run.stderr
    return run.stdout.splitlines()


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (host compilation only)")
def test_host_check_with_nvcc_matches_torch(tmp_path):
    _check_against(_build_and_run(tmp_path, NVCC))


@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_header_is_plain_cxx_and_matches_torch(tmp_path):
    _check_against(_build_and_run(tmp_path, GXX))


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (compiles for a GPU, runs nothing)")
def test_header_compiles_for_the_device_beside_window_math(tmp_path):
    """Device code compiles (no local memory for the word choice), with common/window.cuh's
    NATTN_HD included before or after philox.cuh."""
    for first, second in (("philox", "window"), ("window", "philox")):
        src = tmp_path / f"{first}_first.cu"
        src.write_text(
            f'#include "nattn/common/{first}.cuh"\n#include "nattn/common/{second}.cuh"\n'
            "__global__ void keep(nattn::DropoutRng rng, unsigned* out) {\n"
            "  const unsigned t = threadIdx.x;\n"
            "  out[t] = nattn::dropout_keep(rng, blockIdx.x, 1, t, t + 3) ? 1u : 0u;\n}\n")
        ptx = tmp_path / f"{first}.ptx"
        run = subprocess.run([NVCC, "-std=c++17", "-arch=sm_80", "-ptx", "-I", INCLUDE, "-o", str(ptx), str(src)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "warning" not in run.stderr, run.stderr
        text = ptx.read_text()
        assert "mul.wide.u32" in text and ".local" not in text


def test_mask_statistics():
    """Kept fraction ~ 1 - p for every output word and probability, and neighbouring keys
    (same Philox call or the next) independent: P(both kept) ~ (1 - p)^2."""
    rng = torch.tensor([0x1234567890ABCDEF, 0x0FEDCBA987654321])
    b = torch.arange(2).view(-1, 1, 1, 1)
    h = torch.arange(4).view(1, -1, 1, 1)
    q = torch.arange(64).view(1, 1, -1, 1)
    k = torch.arange(1024).view(1, 1, 1, -1)  # 524288 elements
    words = dropout.dropout_word(rng, b, h, q, k)
    n = words.numel()
    for p in (0.1, 0.5, 0.9):
        keep = words >= dropout.drop_threshold(p)
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(keep.double().mean().item() - (1 - p)) < 6 * sigma, p
        for lane in range(4):  # each word of the call
            part = keep[..., lane::4]
            assert abs(part.double().mean().item() - (1 - p)) < 6 * sigma * 2, (p, lane)
        both = (keep[..., 1:] & keep[..., :-1]).double().mean().item()
        assert abs(both - (1 - p) ** 2) < 6 * math.sqrt((1 - p) ** 2 / n) + 1e-3, p
        # across queries and heads as well
        assert abs((keep[:, :, 1:] & keep[:, :, :-1]).double().mean().item() - (1 - p) ** 2) < 0.01
        assert abs((keep[:, 1:] & keep[:, :-1]).double().mean().item() - (1 - p) ** 2) < 0.01
    # the words are uniform: each of 16 bins of the high bits holds ~1/16
    bins = torch.bincount((words >> 28).flatten(), minlength=16).double() / n
    assert (bins - 1 / 16).abs().max().item() < 0.003


def test_offset_and_seed_change_every_word():
    b, h, q, k = (torch.arange(8).view(-1, 1, 1, 1), torch.arange(3).view(1, -1, 1, 1),
                  torch.arange(16).view(1, 1, -1, 1), torch.arange(40).view(1, 1, 1, -1))
    base = dropout.dropout_word(torch.tensor([11, 22]), b, h, q, k)
    for other in ([12, 22], [11, 23], [11 + 2**40, 22], [11, 22 + 2**40]):
        w = dropout.dropout_word(torch.tensor(other), b, h, q, k)
        assert (w == base).double().mean().item() < 1e-3, other
    # every element has its own word (no two (b, h, q, k) share one in this range)
    assert base.flatten().unique().numel() > 0.999 * base.numel()
