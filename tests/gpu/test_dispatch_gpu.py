"""GPU tier: which family libnattn runs where its dispatch rules were measured (the kernel
names torch.profiler records), on a compute capability 9.0 GPU with the Hopper family built.
A rule moved without its test failing here would route a problem by a stale measurement."""

import os

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import nattn
from nattn._cuda import library

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)
if os.environ.get("NATTN_FAMILY"):
    pytest.skip("NATTN_FAMILY forces a family: the default dispatch is what this file checks",
                allow_module_level=True)
_LIB = library.load()
if _LIB is None or not _LIB.kernels.get(("sm90", "bfloat16", 2)) or not _LIB.kernels.get(("tc", "bfloat16", 2)):
    pytest.skip("needs a libnattn with the sm90 and tc families (bf16, 2-D)", allow_module_level=True)


def families(kernel, rpb: bool, dilation=1, spatial=(28, 28), dim=32, heads=4, batch=8, backward=False):
    """{pass: family} ("tc" or "sm90") of the kernels one bf16 call ran, forward ("forward")
    and with ``backward`` the dK/dV pass ("dkv"). ``kernel`` an int (2-D) or a tuple (its NA
    dim). Batch 8: a smaller grid that leaves most SMs idle runs split-KV on sm90 from 128
    keys."""
    kernel = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
    q, k, v = (torch.randn(batch, *spatial, heads, dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=backward) for _ in range(3))
    bias = torch.randn(heads, *(2 * w - 1 for w in kernel), device="cuda", requires_grad=backward) if rpb else None
    fn = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}[len(kernel)]
    with torch.set_grad_enabled(backward), profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn(q, k, v, kernel, dilation=dilation, rpb=bias, backend="cuda")
        if backward:
            out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    found = {}
    for step, kernel_name in (("forward", "forward_kernel"), ("dkv", "backward_dkv")):  # (or _wide_kernel)
        names = [e.key for e in prof.key_averages() if kernel_name in e.key]
        fams = {f for f in ("tc", "sm90") if any(f"nattn::{f}::" in n for n in names)}
        assert len(fams) <= 1, names
        if fams:
            found[step] = fams.pop()
    return found


def forward_family(kernel, rpb: bool, **kw):
    """The family whose forward kernel ran for one bf16 call (``families``)."""
    return families(kernel, rpb, **kw)["forward"]


def test_head_dim_32_forward_runs_tc_below_11x11_and_sm90_from_it():
    # measured (PERF.md, twenty-second session; DiNAT 56x56 B32 H4): without RPB tc 0.104 vs
    # sm90 0.112 ms at 7x7, 0.126 vs 0.134 at 9x9, sm90 ahead at 13x13 (0.179 vs 0.194); with
    # RPB tc up to 13x13 (fifteenth and sixteenth sessions)
    assert forward_family(7, rpb=False) == "tc"
    assert forward_family(9, rpb=False) == "tc"
    assert forward_family(7, rpb=False, dilation=3) == "tc"
    assert forward_family(11, rpb=False) == "sm90"
    assert forward_family(13, rpb=False) == "sm90"
    assert forward_family(7, rpb=True) == "tc"
    assert forward_family(7, rpb=True, dilation=3) == "tc"


def test_windows_up_to_169_keys_run_tc_with_rpb_at_head_dims_32_and_64():
    # measured (PERF.md, sixteenth session): with RPB tc beats sm90 up to 13x13 at head dims 32
    # and 64; larger windows keep the choice made without RPB
    for dim in (32, 64):
        assert forward_family(9, rpb=True, dim=dim) == "tc"
        assert forward_family(13, rpb=True, dim=dim) == "tc"
        assert forward_family(15, rpb=True, dim=dim) == "sm90"


def test_head_dim_64_plain_windows_run_sm90_from_9x9():
    # measured (PERF.md, sixteenth session; 56x56 B32 H4 D64): tc 0.148 vs sm90 0.159 ms at
    # 7x7, a tie at 9x9, sm90 ahead at 13x13
    assert forward_family(7, rpb=False, dim=64) == "tc"
    assert forward_family(9, rpb=False, dim=64) == "sm90"
    assert forward_family(13, rpb=False, dim=64) == "sm90"


def test_3d_windows_up_to_567_keys_run_tc_with_rpb():
    # measured (PERF.md, sixteenth session; 16x32x32 B2 H8 D64): with RPB tc 0.532 vs sm90 0.634
    # ms at 5x9x9, 0.681 vs 0.804 at 7x9x9; without RPB sm90 runs 3-D windows from 3x7x7
    kw = dict(spatial=(12, 16, 16), dim=64, batch=4)
    assert forward_family((5, 9, 9), rpb=False, **kw) == "sm90"
    assert forward_family((5, 9, 9), rpb=True, **kw) == "tc"


def test_backward_with_rpb_runs_tc_below_1024_keys_in_2d():
    # measured (PERF.md, twenty-first session, backward): with RPB the sm90 backward is 1.5-2.1x
    # slower than tc at 169-441 keys (2-D D64 13x13 1.69 vs 0.98 ms), ties at 31x31 and wins
    # at 45x45 (2.53 vs 3.14); without RPB 2-D at head dim 64 runs the sm90 backward from 150 keys
    assert families(13, rpb=False, dim=64, backward=True)["dkv"] == "sm90"
    assert families(13, rpb=True, dim=64, backward=True)["dkv"] == "tc"
    assert families(31, rpb=True, dim=64, spatial=(40, 40), batch=1, backward=True)["dkv"] == "tc"
    assert families(33, rpb=True, dim=64, spatial=(40, 40), batch=1, backward=True)["dkv"] == "sm90"
    # 3-D keeps tc up to 2048 keys (9x13x13: 8.14 vs 8.41 ms)
    assert families((9, 13, 13), rpb=True, dim=64, spatial=(12, 16, 16), batch=1, backward=True)["dkv"] == "tc"


def test_1d_dilation_above_2_runs_sm90_from_64_keys_per_unit_of_dilation():
    # measured (PERF.md, twenty-eighth session, call 2; tc vs sm90, fwd / f+b ms): 16384 tokens
    # B2 H8 D64 w257 dilation 5 0.218 / 0.781 vs 0.272 / 0.874; 32768 tokens D128 w512
    # dilation 8 0.761 / 2.56 vs 0.724 / 2.19 (the boxes' copies in pieces, element stride d)
    kw = dict(spatial=(16384,), dim=64, heads=8, batch=2, rpb=False, backward=True)
    assert families((257,), dilation=5, **kw) == {"forward": "tc", "dkv": "tc"}
    assert families((321,), dilation=5, **kw) == {"forward": "sm90", "dkv": "sm90"}
    assert families((257,), dilation=2, **kw) == {"forward": "sm90", "dkv": "sm90"}


def test_head_dims_above_128_train_on_sm90_at_any_window():
    # no tensor-core instance above 128: the Hopper backward at 256 (backward_wide.cuh) runs
    # from the smallest window, natively or on zero-padded copies (PERF.md, twenty-ninth
    # session: 64x64 33x33 B2 H8 D256 f+b 1.05 ms against 3.86 on the SIMT backward)
    assert families(3, rpb=False, dim=256, backward=True) == {"forward": "sm90", "dkv": "sm90"}
    assert families(7, rpb=True, dim=256, backward=True) == {"forward": "sm90", "dkv": "sm90"}
    assert families(5, rpb=False, dim=192, backward=True) == {"forward": "sm90", "dkv": "sm90"}
