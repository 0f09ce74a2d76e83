"""GPU tier: which family libnattn runs where its dispatch rules were measured (the kernel
names torch.profiler records), on a compute capability 9.0 GPU with the Hopper family built.
A rule moved without its test failing here would route a problem by a stale measurement."""

import os
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import nattn
from nattn._cuda import library
from nattn.backends import BACKENDS
from nattn.params import normalize

sys.path.insert(0, os.path.dirname(__file__))
from gpu_cases import check  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs a compute capability 9.0 GPU", allow_module_level=True)
if os.environ.get("NATTN_FAMILY"):
    pytest.skip("NATTN_FAMILY forces a family: the default dispatch is what this file checks",
                allow_module_level=True)
_LIB = library.load()
if _LIB is None or not _LIB.kernels.get(("sm90", "bfloat16", 2)) or not _LIB.kernels.get(("tc", "bfloat16", 2)):
    pytest.skip("needs a libnattn with the sm90 and tc families (bf16, 2-D)", allow_module_level=True)


@pytest.fixture(autouse=True)
def _rules_behind_the_strips(monkeypatch):
    """The rules below were measured between the tensor-core family and the box pairs: checked
    with the strip and square pairs' own rules off (NATTN_SM90_STRIPS=0, NATTN_SM90_SQUARES=0,
    read by libnattn on every call); their own tests turn them back on."""
    monkeypatch.setenv("NATTN_SM90_STRIPS", "0")
    monkeypatch.setenv("NATTN_SM90_SQUARES", "0")


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
    # (the strip pairs' forward_strips_kernel / backward_dkv_strips_kernel; the wide passes' _wide_kernel)
    for step, kernel_names in (("forward", ("forward_kernel", "forward_strips_kernel", "forward_squares_kernel")),
                               ("dkv", ("backward_dkv",))):
        names = [e.key for e in prof.key_averages() if any(n in e.key for n in kernel_names)]
        fams = {f for f in ("tc", "sm90") if any(f"nattn::{f}::" in n for n in names)}
        assert len(fams) <= 1, names
        if fams:
            found[step] = fams.pop()
    # libnattn's CPU-side answer for the same problem (nattn_sm90_preferred) names the same
    # family: the export and the call path share the rules
    params = normalize(q, k, v, len(kernel), kernel, dilation=(dilation,) * len(kernel))
    for step, bwd in (("forward", False), ("dkv", True)):
        answer = BACKENDS["cuda"].sm90_preferred(q, k, v, params, rpb=rpb, backward=bwd)
        if step in found and answer is not None:
            assert (found[step] == "sm90") == bool(answer), (step, found, answer)
    return found


def forward_family(kernel, rpb: bool, **kw):
    """The family whose forward kernel ran for one bf16 call (``families``)."""
    return families(kernel, rpb, **kw)["forward"]


def test_small_2d_windows_run_sm90_where_its_boxes_fit_them():
    # measured (PERF.md, thirtieth session, call 1; GPU ms, sm90 vs tc, no RPB): on 56x56
    # (8x8 query boxes tile it exactly) 7x7 0.094 vs 0.104 at head dim 32, 0.123 vs 0.147 at
    # 64, 9x9 0.115 vs 0.126; dilation 4 on 28x28 0.049 vs 0.056; but on 28x28 and 14x14
    # (3.5 and 1.75 boxes an axis) 7x7 0.115 vs 0.102 and 0.064 vs 0.060, and dilation 2 on
    # 56x56 at head dim 64 0.150 vs 0.141
    big = dict(spatial=(56, 56), batch=2)
    for dim in (32, 64):
        assert forward_family(7, rpb=False, dim=dim, **big) == "sm90"
        assert forward_family(9, rpb=False, dim=dim, **big) == "sm90"
        assert forward_family(7, rpb=False, dim=dim) == "tc"
        assert forward_family(7, rpb=False, dim=dim, spatial=(14, 14)) == "tc"
        assert forward_family(7, rpb=False, dim=dim, dilation=4) == "sm90"
        assert forward_family(13, rpb=False, dim=dim) == "sm90"
    assert forward_family(7, rpb=False, dim=64, dilation=2, **big) == "tc"
    assert forward_family(7, rpb=False, dilation=3) == "tc"  # 9-10-token groups: 1.7 rows a query an axis


def test_small_2d_windows_with_rpb_run_tc_up_to_169_keys_at_head_dim_32_and_below_150_at_64():
    # measured (PERF.md, thirtieth session, call 1; sm90 vs tc with an RPB): head dim 32
    # 56x56 7x7 0.121 vs 0.117, 13x13 0.245 vs 0.221; head dim 64 11x11 0.244 vs 0.243,
    # 13x13 on 128x128 0.321 vs 0.394
    assert forward_family(7, rpb=True, spatial=(56, 56), batch=2) == "tc"
    assert forward_family(13, rpb=True) == "tc"
    assert forward_family(15, rpb=True) == "sm90"
    assert forward_family(13, rpb=True, dim=64) == "sm90"
    # except (forty-eighth session, H100, GPU ms, sm90 vs tc) at head dim 32 where each
    # window spans its whole dilation group (DiNAT's dilated layers: 28x28 dilation 4 0.055
    # vs 0.058; 56x56 dilation 4, 14-token groups, 0.149 vs 0.124), and at head dim 64 up to
    # walk ratio 5 (56x56 9x9 0.175 vs 0.214; 28x28 11x11, ratio 4.2 with the 16x4 / 7x16
    # boxes, sixty-second session, H100, B32 H8: 0.113 vs 0.134)
    assert forward_family(7, rpb=True, dilation=4) == "sm90"
    assert forward_family(7, rpb=True, dilation=4, spatial=(56, 56), batch=2) == "tc"
    assert forward_family(9, rpb=True, dim=64, spatial=(56, 56), batch=2) == "sm90"
    assert forward_family(11, rpb=True, dim=64) == "sm90"


def test_3d_windows_run_sm90_where_its_boxes_fit_them_and_tc_with_rpb_up_to_4000_keys():
    # measured (PERF.md, thirtieth session, calls 1-3; 16x32x32 B2 H8, GPU ms, sm90 vs tc): no
    # RPB, head dim 64: 5x7x7 0.320 vs 0.335, 3x7x7 0.281 vs 0.235; head dim 32: 5x7x7 0.292
    # vs 0.260, 5x9x9 0.316 vs 0.374; with an RPB tc up to 13x17x17 (D64 9x11x11 1.134 vs
    # 1.453; 3757 keys: a tie)
    kw = dict(spatial=(16, 32, 32), batch=1)
    assert forward_family((5, 7, 7), rpb=False, dim=64, **kw) == "sm90"
    assert forward_family((3, 7, 7), rpb=False, dim=64, **kw) == "tc"
    assert forward_family((5, 7, 7), rpb=False, dim=32, **kw) == "tc"
    assert forward_family((5, 9, 9), rpb=False, dim=32, **kw) == "sm90"
    assert forward_family((9, 11, 11), rpb=True, dim=64, **kw) == "tc"
    assert forward_family((15, 17, 17), rpb=True, dim=64, **kw) == "sm90"


def test_backward_with_rpb_runs_tc_below_1024_keys_in_2d():
    # measured (PERF.md, twenty-first session, backward): with RPB the sm90 backward is 1.5-2.1x
    # slower than tc at 169-441 keys (2-D D64 13x13 1.69 vs 0.98 ms), ties at 31x31 and wins
    # at 45x45 (2.53 vs 3.14); without RPB 2-D at head dim 64 runs the sm90 backward from 81 keys (plain windows)
    assert families(13, rpb=False, dim=64, backward=True)["dkv"] == "sm90"
    assert families(13, rpb=True, dim=64, backward=True)["dkv"] == "tc"
    assert families(31, rpb=True, dim=64, spatial=(40, 40), batch=1, backward=True)["dkv"] == "tc"
    assert families(33, rpb=True, dim=64, spatial=(40, 40), batch=1, backward=True)["dkv"] == "sm90"
    # 3-D keeps tc up to 2048 keys (9x13x13: 8.14 vs 8.41 ms)
    assert families((9, 13, 13), rpb=True, dim=64, spatial=(12, 16, 16), batch=1, backward=True)["dkv"] == "tc"


def test_1d_dilation_with_every_key_box_in_pieces_runs_sm90_from_64_keys_per_unit_of_dilation():
    # measured (PERF.md, twenty-eighth session, call 2; tc vs sm90, fwd / f+b ms): 16384 tokens
    # B2 H8 D64 w257 dilation 5 0.218 / 0.781 vs 0.272 / 0.874; 32768 tokens D128 w512
    # dilation 8 0.761 / 2.56 vs 0.724 / 2.19 (the boxes' copies in pieces, element stride d)
    kw = dict(spatial=(16384,), dim=64, heads=8, batch=2, rpb=False, backward=True)
    assert families((257,), dilation=5, **kw) == {"forward": "tc", "dkv": "tc"}
    assert families((321,), dilation=5, **kw) == {"forward": "sm90", "dkv": "sm90"}
    assert families((257,), dilation=2, **kw) == {"forward": "sm90", "dkv": "sm90"}
    # dilation 4: the 64-key pair in one copy, the rules without dilation (thirty-fifth
    # session: 155581 tokens B1 H4 w212 0.359 / 0.851 vs 0.409 / 1.093)
    assert families((212,), dilation=4, **kw) == {"forward": "sm90", "dkv": "sm90"}


def test_small_1d_windows_run_sm90_where_one_key_box_holds_a_query_box_union():
    # measured (PERF.md, thirtieth session, call 5; 16384 tokens B2 H8, sm90 vs tc, ms):
    # forward D64 w65 0.061 vs 0.089, w97 0.115 vs 0.110; D128 w65 0.131 vs 0.172; D32 w127
    # 0.100 vs 0.077; backward (f+b - forward) D128 w65 0.375 vs 0.471, with an RPB 0.532 vs 0.601
    kw = dict(spatial=(16384,), heads=8, batch=2)
    assert forward_family((65,), rpb=False, dim=64, **kw) == "sm90"
    assert forward_family((65,), rpb=True, dim=64, **kw) == "sm90"
    assert forward_family((97,), rpb=False, dim=64, **kw) == "tc"
    assert forward_family((127,), rpb=False, dim=32, **kw) == "tc"
    assert families((65,), rpb=True, dim=128, backward=True, **kw) == {"forward": "sm90", "dkv": "sm90"}


def test_plain_window_backward_at_head_dims_33_to_64():
    # measured (PERF.md, forty-sixth session, calls 4-5; tc vs sm90 backward, f+b - forward,
    # GPU ms on the H100): 1-D 16384 tokens B2 H8 D64 w33 0.225 vs 0.212, w65 0.269 vs 0.215;
    # D32 w65 0.155 vs 0.176 (head dim 32 keeps tc); 2-D dilation 2, D64: 13x13 on 96x96 0.624
    # vs 0.478, 11x11 on 64x64 0.427 vs 0.392, 9x9 on 48x48 0.394 vs 0.418 (below 121 keys)
    one = dict(spatial=(16384,), heads=8, batch=2)
    assert families((33,), rpb=False, dim=64, backward=True, **one)["dkv"] == "sm90"
    assert families((65,), rpb=False, dim=64, backward=True, **one) == {"forward": "sm90", "dkv": "sm90"}
    assert families((65,), rpb=False, dim=32, backward=True, **one)["dkv"] == "tc"
    two = dict(spatial=(64, 64), heads=8, batch=8, dim=64, backward=True)
    assert families(11, rpb=False, dilation=2, **two)["dkv"] == "sm90"
    assert families(9, rpb=False, dilation=2, **two)["dkv"] == "tc"


def test_head_dim_128_2d_runs_tc_at_7x7_and_with_rpb_up_to_169_keys():
    # measured (PERF.md, thirtieth session, call 5; sm90 vs tc, ms): 7x7 on 56x56 B8 H4
    # 0.084 vs 0.081; with an RPB 7x7 0.114 vs 0.087, 13x13 with dilation 2 0.195 vs 0.148
    big = dict(spatial=(56, 56), batch=2, dim=128)
    assert forward_family(7, rpb=False, **big) == "tc"
    assert forward_family(13, rpb=False, **big) == "sm90"
    assert forward_family(13, rpb=True, **big) == "tc"
    assert forward_family(15, rpb=True, **big) == "sm90"


def test_head_dim_128_runs_sm90_from_small_windows_without_rpb():
    # measured (PERF.md, thirty-fifth session, calls 2-3; sm90 vs tc, GPU ms, fwd / backward
    # alone): the tensor-core family's head-dim-128 passes run one block per SM. 1-D w25 0.493
    # / 1.348 vs 0.521 / 1.523 (w17 0.492 vs 0.449 forward); 2-D 7x7 on 128x128 0.193 / 0.507
    # vs 0.205 / 0.549 (5x5 0.190 vs 0.154 forward); 3-D 2x5x9 0.270 / 0.771 vs 0.331 / 0.946,
    # 3x3x3 0.284 / 0.885 vs 0.190 / 0.530; with an RPB the backward keeps tc below 150 keys in
    # 2-D (7x7 0.825 vs 0.658) and the 1-D forward below 65 (w33 0.547 vs 0.526)
    one = dict(spatial=(16384,), heads=8, batch=2, dim=128)
    assert families((25,), rpb=False, backward=True, **one) == {"forward": "sm90", "dkv": "sm90"}
    assert families((17,), rpb=False, backward=True, **one) == {"forward": "tc", "dkv": "tc"}
    assert forward_family((33,), rpb=True, **one) == "tc"
    two = dict(spatial=(64, 64), batch=2, dim=128)
    assert families(7, rpb=False, backward=True, **two) == {"forward": "sm90", "dkv": "sm90"}
    assert families(5, rpb=False, backward=True, **two) == {"forward": "tc", "dkv": "tc"}
    assert families(7, rpb=True, backward=True, **two) == {"forward": "tc", "dkv": "tc"}
    three = dict(spatial=(8, 16, 32), batch=1, dim=128)
    assert families((2, 5, 9), rpb=False, backward=True, **three) == {"forward": "sm90", "dkv": "sm90"}
    assert families((3, 3, 3), rpb=False, backward=True, **three) == {"forward": "tc", "dkv": "tc"}


def test_3d_backward_follows_the_backward_pairs_walk_ratio():
    # measured (PERF.md, thirty-fifth session, calls 3-4; backward alone, sm90 vs tc, GPU ms):
    # 17x33x58 7x5x13 at head dim 32 (455 keys, ratio 9.5) 3.48 vs 2.13; 5x9x9 on 16x32x32
    # (ratio 3.8) runs sm90 (fourteenth session: 1.51 vs 1.68); at head dim 64 12x30x39
    # 2x16x13 (ratio 4.6; timed causal along T) 0.749 vs 1.308
    assert families((7, 5, 13), rpb=False, dim=32, spatial=(17, 33, 58), batch=1, backward=True)["dkv"] == "tc"
    assert families((5, 9, 9), rpb=False, dim=32, spatial=(16, 32, 32), batch=1, backward=True)["dkv"] == "sm90"
    assert families((2, 16, 13), rpb=False, dim=64, spatial=(12, 30, 39), batch=1, backward=True)["dkv"] == "sm90"
    # video-3d (ratio 6.3) with the 4x4x8 / 2x4x8 pair: 0.901 vs 0.930 (thirty-sixth session)
    assert families((5, 7, 7), rpb=False, dim=64, spatial=(16, 32, 32), batch=2, backward=True)["dkv"] == "sm90"
    # forty-eighth session (H100, backward alone, after the split CTAs): head dim 32 up to 8
    # (16x32x32 3x10x10 at 7.7 0.744 vs 0.790; 8x48x48 3x5x12 at 8.5 0.674 vs 0.562), head dim
    # 64 up to 10 (2x10x11 at 9.8 0.648 vs 0.883; 2x5x10 at 11.5 0.577 vs 0.526)
    kw = dict(rpb=False, spatial=(16, 32, 32), batch=2, backward=True)
    assert families((3, 10, 10), dim=32, **kw)["dkv"] == "sm90"
    assert families((3, 5, 12), dim=32, rpb=False, spatial=(8, 48, 48), batch=2, backward=True)["dkv"] == "tc"
    assert families((2, 10, 11), dim=64, **kw)["dkv"] == "sm90"
    assert families((2, 5, 10), dim=64, **kw)["dkv"] == "tc"


def test_head_dims_above_128_train_on_sm90_at_any_window():
    # no tensor-core instance above 128: the Hopper backward at 256 (backward_wide.cuh) runs
    # from the smallest window, natively or on zero-padded copies (PERF.md, twenty-ninth
    # session: 64x64 33x33 B2 H8 D256 f+b 1.05 ms against 3.86 on the SIMT backward)
    assert families(3, rpb=False, dim=256, backward=True) == {"forward": "sm90", "dkv": "sm90"}
    assert families(7, rpb=True, dim=256, backward=True) == {"forward": "sm90", "dkv": "sm90"}
    assert families(5, rpb=False, dim=192, backward=True) == {"forward": "sm90", "dkv": "sm90"}


def test_strip_dkv_pass_with_rpb_by_table_size(monkeypatch):
    """With an RPB the strip pairs' backward runs its own dK/dV pass at head dims 32 and 64
    wherever the KV head's query heads' tables fit what it stages (4096 entries), else the
    tensor-core family's (strip_dkv_own), both after the strip dQ pass; the gradients agree
    with the float64 reference."""
    monkeypatch.setenv("NATTN_FAMILY", "sm90")
    monkeypatch.setenv("NATTN_SM90_TILE", "q8x8_k14x16")  # the 2-D strip pair
    monkeypatch.delenv("NATTN_SM90_STRIP_DKV", raising=False)
    # (25 query heads of one KV head: 25 x 169 = 4225 entries)
    for dim, heads, heads_kv, own in ((32, 2, 2, True), (64, 2, 2, True), (32, 25, 1, False)):
        q = torch.randn(2, 24, 20, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(2, 24, 20, heads_kv, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        bias = torch.randn(heads, 13, 13, device="cuda", requires_grad=True)
        g = torch.randn(2, 24, 20, heads, dim, device="cuda", dtype=torch.bfloat16)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            nattn.na2d(q, k, v, 7, rpb=bias, backend="cuda").backward(g)
            torch.cuda.synchronize()
        names = " ".join(e.key for e in prof.key_averages())
        assert "backward_dq_strips_kernel" in names, names
        assert ("backward_dkv_strips_kernel" in names) == own, names
        assert ("nattn::tc::backward_dkv_kernel" in names) == (not own), names
        leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, bias)]
        nattn.na2d(*leaves[:3], 7, rpb=leaves[3], backend="reference").backward(g.double())
        for name, got, ref in zip(("dq", "dk", "dv", "drpb"), (q, k, v, bias), leaves):
            check(f"head dim {dim}, {heads} query heads a KV head, {name}", got.grad, ref.grad, 2e-2)


def test_strip_pairs_run_by_default(monkeypatch):
    """By default (their own rule) a DiNAT-size layer with an RPB at head dim 32 runs the strip
    pairs' forward, dQ pass and dK/dV pass (NATTN_SM90_STRIP_DKV=tc: the tensor-core family's
    dK/dV pass instead), and with NATTN_SM90_STRIPS=0 none of them; the results and gradients
    agree."""
    def run(strips, dkv=None):
        if strips:
            monkeypatch.delenv("NATTN_SM90_STRIPS", raising=False)
        else:
            monkeypatch.setenv("NATTN_SM90_STRIPS", "0")
        if dkv:
            monkeypatch.setenv("NATTN_SM90_STRIP_DKV", dkv)
        else:
            monkeypatch.delenv("NATTN_SM90_STRIP_DKV", raising=False)
        torch.manual_seed(5)
        q, k, v = (torch.randn(4, 28, 28, 4, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        bias = torch.randn(4, 13, 13, device="cuda", requires_grad=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = nattn.na2d(q, k, v, 7, rpb=bias, backend="cuda")
            out.backward(torch.ones_like(out))
            torch.cuda.synchronize()
        names = " ".join(e.key for e in prof.key_averages())
        return names, [out.float()] + [t.grad.float() for t in (q, k, v, bias)]
    names, strips = run(True)
    assert "forward_strips_kernel" in names and "backward_dq_strips_kernel" in names
    assert "backward_dkv_strips_kernel" in names and "nattn::tc::backward_dkv_kernel" not in names
    names, with_tc = run(True, "tc")
    assert "backward_dq_strips_kernel" in names and "nattn::tc::backward_dkv_kernel" in names
    assert "backward_dkv_strips_kernel" not in names
    names, default = run(False)
    assert "strips_kernel" not in names
    for a, b, c in zip(strips, with_tc, default):
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        assert ((a - c).norm() / c.norm()).item() < 2e-2 and ((b - c).norm() / c.norm()).item() < 2e-2


def test_square_pair_runs_the_forward_of_windows_from_9x9_to_13x13(monkeypatch):
    """By default (its own rule) 2-D windows of 9 to 13 per axis at stride 1 run the square
    pair's forward, with or without an RPB, at head dims 32 and 64 (sixty-third session, H100:
    faster than the tensor-core family and the other pairs on every one measured), and its
    backward (its dQ pass, sixty-fourth session, then its own dK/dV pass at head dim 32,
    sixty-fifth, and at 64 without an RPB, sixty-sixth, or with one on 13 x 13 windows,
    sixty-seventh; tc's at 64 with one on smaller windows); 7 x 7 (the
    strips) and 13 x 7 do not, nor
    does a small problem's split-KV
    forward; NATTN_SM90_SQUARES=0 turns the rule off. The results and gradients agree with
    the reference."""
    monkeypatch.delenv("NATTN_SM90_STRIPS", raising=False)
    for kernel, rpb, dim, squares in ((13, True, 32, True), (9, False, 64, True), (11, True, 64, True),
                                      (13, True, 64, True), (7, True, 32, False), ((13, 7), False, 32, False)):
        for rule in (True, False):
            if rule:
                monkeypatch.delenv("NATTN_SM90_SQUARES", raising=False)
            else:
                monkeypatch.setenv("NATTN_SM90_SQUARES", "0")
            torch.manual_seed(9)
            ks = (kernel, kernel) if isinstance(kernel, int) else kernel
            # (batch 4, 4 heads: enough boxes that a 13x13 window does not run split-KV by
            # default, which the square pair declines)
            q, k, v = (torch.randn(4, 30, 27, 4, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            bias = torch.randn(4, *(2 * w - 1 for w in ks), device="cuda", requires_grad=True) if rpb else None
            g = torch.randn(4, 30, 27, 4, dim, device="cuda", dtype=torch.bfloat16)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out = nattn.na2d(q, k, v, ks, rpb=bias, backend="cuda")
                out.backward(g)
                torch.cuda.synchronize()
            names = " ".join(e.key for e in prof.key_averages())
            assert ("forward_squares_kernel" in names) == (squares and rule), (kernel, rpb, dim, rule, names)
            assert ("backward_dq_squares_kernel" in names) == (squares and rule), (kernel, rpb, dim, rule, names)
            # its dK/dV pass: its own, but tc's at head dim 64 with an RPB below 13 x 13 (never
            # the 32x4 / 7x16 box pair's, which only NATTN_SM90_SQUARE_DKV=box names)
            own_dkv = squares and rule and (dim == 32 or not rpb or min(ks) >= 13)
            assert ("backward_dkv_squares_kernel" in names) == own_dkv, (kernel, rpb, dim, rule, names)
            assert "backward_dkv_kernel<nattn::bf16_t, 2, 64, nattn::sm90::Tile<32, 4" not in names, names
            leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v) + ((bias,) if rpb else ())]
            ref = nattn.na2d(*leaves[:3], ks, rpb=leaves[3] if rpb else None, backend="reference")
            ref.backward(g.double())
            check(f"{kernel} rpb {rpb} D{dim}, out", out, ref, 2e-2)
            for name, got, want in zip(("dq", "dk", "dv", "drpb"), (q, k, v, bias), leaves):
                check(f"{kernel} rpb {rpb} D{dim}, {name}", got.grad, want.grad, 2e-2)
    # a grid of a few boxes runs split-KV by default from 128 keys: not on the square pair
    monkeypatch.delenv("NATTN_SM90_SQUARES", raising=False)
    q = torch.randn(1, 24, 24, 2, 32, device="cuda", dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = nattn.na2d(q, q, q, 13, backend="cuda")
        torch.cuda.synchronize()
    names = " ".join(e.key for e in prof.key_averages())
    assert "forward_squares_kernel" not in names and "split_kv_merge" in names, names
    check("split-KV 13x13, out", out, nattn.na2d(*(q.double(),) * 3, 13, backend="reference"), 2e-2)


def test_strips_take_narrow_walks_at_any_dilation(monkeypatch):
    """Dilated 4 or more, the strip pairs (forward, dQ pass and dK/dV pass) run by default only
    where every walk is narrow (the columns axis' groups at most 8 long: DiNAT's layers whose
    windows are their whole 7 x 7 groups); the results and gradients agree with the reference."""
    monkeypatch.delenv("NATTN_SM90_STRIPS", raising=False)
    for spatial, dilation, narrow in (((56, 56), 8, True), ((28, 28), 4, True), ((64, 64), 4, False)):
        torch.manual_seed(7)
        q, k, v = (torch.randn(2, *spatial, 2, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        bias = torch.randn(2, 13, 13, device="cuda", requires_grad=True)
        g = torch.randn(2, *spatial, 2, 32, device="cuda", dtype=torch.bfloat16)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = nattn.na2d(q, k, v, 7, dilation=dilation, rpb=bias, backend="cuda")
            out.backward(g)
            torch.cuda.synchronize()
        names = " ".join(e.key for e in prof.key_averages())
        assert ("forward_strips_kernel" in names) == narrow, (spatial, dilation, names)
        assert ("backward_dq_strips_kernel" in names) == narrow, (spatial, dilation, names)
        leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, bias)]
        ref = nattn.na2d(*leaves[:3], 7, dilation=dilation, rpb=leaves[3], backend="reference")
        ref.backward(g.double())
        check(f"{spatial} dilation {dilation}, out", out, ref, 2e-2)
        for name, got, want in zip(("dq", "dk", "dv", "drpb"), (q, k, v, bias), leaves):
            check(f"{spatial} dilation {dilation}, {name}", got.grad, want.grad, 2e-2)
