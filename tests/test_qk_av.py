"""nattn.na{1,2,3}d_qk / na{1,2,3}d_av: softmax(qk) -> av is the fused op (values and
gradients), the slot order is row-major over the window's keys, errors name the argument."""

import math

import pytest
import torch

import nattn
import nattn.qk_av
import nattn.qk_av_math
from nattn.backends import tiled_plan, tiled_rows
from oracle import mask_and_bias_index

QK = {1: nattn.na1d_qk, 2: nattn.na2d_qk, 3: nattn.na3d_qk}
AV = {1: nattn.na1d_av, 2: nattn.na2d_av, 3: nattn.na3d_av}
FUSED = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}

# (spatial, kernel, stride, dilation, causal, heads, heads_kv, rpb)
CASES = [
    ((13,), (5,), (1,), (2,), (False,), 2, 2, True),
    ((12,), (4,), (3,), (1,), (False,), 4, 2, False),
    ((11,), (4,), (2,), (2,), (True,), 2, 1, False),
    ((7, 9), (3, 5), (1, 1), (2, 1), (False, False), 2, 2, True),
    ((8, 9), (4, 3), (2, 3), (1, 2), (True, False), 4, 2, False),
    ((6, 7), (2, 4), (1, 2), (2, 1), (False, True), 2, 2, False),
    ((4, 5, 6), (3, 3, 3), (1, 1, 1), (1, 1, 2), (False, False, False), 2, 2, True),
    ((4, 5, 6), (2, 3, 4), (2, 1, 3), (1, 1, 1), (True, True, False), 2, 1, False),
]


@pytest.fixture(params=["tiled", "tiled-many-chunks", "gathers", "gathers-many-chunks"])
def chunking(request, monkeypatch):
    """CPU tensors' path (the tiled boxes) or the window gathers (traced code, devices without
    the kernels), each with its default chunk budget (one chunk here) or a few queries or
    boxes per chunk."""
    if request.param.startswith("gathers"):
        monkeypatch.setattr(nattn.qk_av, "USE_TILED", False)
    if request.param == "gathers-many-chunks":
        budget = 96 * torch.randint(1, 4, ()).item()  # a few queries per chunk, one for big windows
        monkeypatch.setattr(nattn.qk_av_math, "CHUNK_ELEMENTS", budget)
    if request.param == "tiled-many-chunks":
        monkeypatch.setattr(tiled_plan, "CHUNK_SCORES", 64 * torch.randint(1, 4, ()).item())
    return request.param


def _inputs(spatial, heads, heads_kv, d=4, dv=3, b=2):
    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    return r(b, *spatial, heads, d), r(b, *spatial, heads_kv, d), r(b, *spatial, heads_kv, dv)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-k{c[1]}-s{c[2]}-d{c[3]}-c{c[4]}-h{c[5]}/{c[6]}-rpb{c[7]}")
def test_split_equals_fused_values_and_grads(case, chunking):
    spatial, kernel, stride, dilation, causal, heads, heads_kv, with_rpb = case
    n = len(spatial)
    q, k, v = _inputs(spatial, heads, heads_kv)
    rpb = None
    if with_rpb:
        rpb = torch.randn(heads, *(2 * x - 1 for x in kernel), dtype=torch.float64, requires_grad=True)
    scale = 0.5 + torch.rand(()).item()
    logits = QK[n](q * scale, k, kernel, stride, dilation, causal, rpb=rpb)
    assert logits.shape == (2, *spatial, heads, math.prod(kernel))
    out = AV[n](logits.softmax(-1), v, kernel, stride, dilation, causal)
    ref = FUSED[n](q, k, v, kernel, stride, dilation, causal, scale, rpb=rpb, backend="reference")
    assert out.shape == ref.shape and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad_out = torch.randn_like(out)
    leaves = [t for t in (q, k, v, rpb) if t is not None]
    got = torch.autograd.grad(out, leaves, grad_out)
    want = torch.autograd.grad(ref, leaves, grad_out)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("case", CASES[:2] + CASES[4:5] + CASES[7:], ids=str)
def test_slot_order_is_row_major_over_window_keys(case):
    """Valid slots hold q . k_j for the window's keys j in ascending flat order; others -inf."""
    spatial, kernel, stride, dilation, causal, heads, heads_kv, _ = case
    n = len(spatial)
    q, k, _ = _inputs(spatial, heads, heads_kv, b=1)
    logits = QK[n](q, k, kernel, stride, dilation, causal).detach().reshape(-1, heads, math.prod(kernel))
    mask, _ = mask_and_bias_index(spatial, kernel, stride, dilation, causal)
    qf = q.detach().reshape(-1, heads, q.shape[-1])
    kf = k.detach().reshape(-1, heads_kv, 1, k.shape[-1]).expand(-1, heads_kv, heads // heads_kv, -1)
    dense = torch.einsum("nhd,mhd->nhm", qf, kf.reshape(-1, heads, k.shape[-1]))
    for i in range(mask.shape[0]):
        keys = mask[i].nonzero().flatten()  # ascending
        row = logits[i]  # [H, W]
        finite = torch.isfinite(row)
        assert (finite == finite[:1]).all()  # same slots valid for every head
        assert int(finite[0].sum()) == keys.numel()
        assert (row[~finite] == float("-inf")).all()
        torch.testing.assert_close(row[:, finite[0]], dense[i][:, keys], rtol=1e-12, atol=1e-12)


def test_rpb_slot_offsets():
    """With q = 0 the logits are the RPB entry of each slot's offset (oracle's offsets)."""
    spatial, kernel, dilation = (7, 8), (3, 5), (2, 1)
    heads = 3
    q = torch.zeros(1, *spatial, heads, 4, dtype=torch.float64)
    k = torch.randn(1, *spatial, heads, 4, dtype=torch.float64)
    rpb = torch.randn(heads, 5, 9, dtype=torch.float64)
    logits = nattn.na2d_qk(q, k, kernel, dilation=dilation, rpb=rpb).reshape(-1, heads, 15)
    mask, offsets = mask_and_bias_index(spatial, kernel, (1, 1), dilation, (False, False))
    for i in range(mask.shape[0]):
        keys = mask[i].nonzero().flatten()
        off = offsets[i, keys]
        torch.testing.assert_close(logits[i], rpb[:, off[:, 0], off[:, 1]], rtol=0, atol=0)


def test_av_ignores_slots_outside_a_causal_window():
    spatial, kernel = (9,), (4,)
    attn = torch.rand(1, *spatial, 2, 4, dtype=torch.float64)
    v = torch.randn(1, *spatial, 2, 3, dtype=torch.float64)
    out = nattn.na1d_av(attn, v, kernel, is_causal=True)
    poisoned = attn.clone()
    poisoned[:, 0, :, :3] = float("nan")  # query 0 of a causal 4-window holds only slot 3
    again = nattn.na1d_av(poisoned, v, kernel, is_causal=True)
    assert torch.isfinite(again).all()
    torch.testing.assert_close(again, out, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_close_to_float64(dtype):
    q, k, v = (t.detach() for t in _inputs((6, 7), 2, 2))
    logits = nattn.na2d_qk(q.to(dtype), k.to(dtype), 3, dilation=2)
    out = nattn.na2d_av(logits.float().softmax(-1).to(dtype), v.to(dtype), 3, dilation=2)
    assert out.dtype == dtype
    ref = nattn.na2d(q, k, v, 3, dilation=2, scale=1.0)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_errors_name_the_argument():
    q, k, v = (t.detach() for t in _inputs((6, 7), 2, 2))
    with pytest.raises(ValueError, match="kernel_size"):
        nattn.na2d_qk(q, k, 1)
    with pytest.raises(ValueError, match="rpb"):
        nattn.na2d_qk(q, k, 3, is_causal=True, rpb=torch.zeros(2, 5, 5, dtype=q.dtype))
    with pytest.raises(ValueError, match=r"attn must have shape .*prod\(kernel_size\)=9"):
        nattn.na2d_av(torch.zeros(2, 6, 7, 2, 8, dtype=q.dtype), v, 3)
    with pytest.raises(ValueError, match="attn must have rank 5"):
        nattn.na2d_av(torch.zeros(2, 6, 7, 9, dtype=q.dtype), v, 3)
    with pytest.raises(ValueError, match="attn heads"):
        nattn.na2d_av(torch.zeros(2, 6, 7, 3, 9, dtype=q.dtype), v, 3)
    with pytest.raises(TypeError, match="value must match attn"):
        nattn.na2d_av(torch.zeros(2, 6, 7, 2, 9), v, 3)
    with pytest.raises(ValueError, match="kernel_size \\* dilation"):
        nattn.na2d_av(torch.zeros(2, 6, 7, 2, 9, dtype=q.dtype), v, 3, dilation=3)


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_qk_and_av_in_chunks(causal, tiled, monkeypatch):
    """First derivatives of the chunked custom backward, attn's own gradient included."""
    monkeypatch.setattr(nattn.qk_av, "USE_TILED", tiled)
    monkeypatch.setattr(nattn.qk_av_math, "CHUNK_ELEMENTS", 40)
    monkeypatch.setattr(tiled_plan, "CHUNK_SCORES", 64)
    spatial, kernel, stride, dilation = (5, 6), (2, 3), (1, 2), (2, 1)
    q, k, v = _inputs(spatial, 2, 1, d=2, dv=2, b=1)
    attn = torch.rand(1, *spatial, 2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k: nattn.na2d_qk(q, k, kernel, stride, dilation, causal).clamp(min=-1e30), (q, k))
    assert torch.autograd.gradcheck(
        lambda a, v: nattn.na2d_av(a, v, kernel, stride, dilation, causal), (attn, v))


def test_gradient_into_one_input_only():
    q, k, v = _inputs((9,), 2, 2)
    k = k.detach()
    logits = nattn.na1d_qk(q, k, 3)
    (gq,) = torch.autograd.grad(logits.square().sum(), q)
    k_only = k.detach().requires_grad_()
    (gk,) = torch.autograd.grad(nattn.na1d_qk(q.detach(), k_only, 3).square().sum(), k_only)
    assert torch.isfinite(gq).all() and torch.isfinite(gk).all() and gq.abs().sum() > 0 and gk.abs().sum() > 0


def test_backward_keeps_no_gathered_window_block():
    """What autograd keeps for qk -> softmax -> av is about inputs + logits, far below the
    B * N * W * H_kv * D gathered window keys (values) a plain einsum would keep."""
    spatial, kernel, heads, d = (12, 12), (5, 5), 2, 32
    q, k, v = _inputs(spatial, heads, heads, d=d, dv=d)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = nattn.na2d_av(nattn.na2d_qk(q, k, kernel).softmax(-1), v, kernel)
    n, w = math.prod(spatial), math.prod(kernel)
    gathered = 2 * n * w * heads * d
    inputs_and_logits = 3 * 2 * n * heads * d + 2 * n * heads * w
    assert inputs_and_logits <= sum(saved) <= 4 * inputs_and_logits < gathered
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_window_kernel_calls_pack_every_field_in_the_library_order(monkeypatch):
    """The CUDA path's call (nattn/qk_av_kernels.py) packs NattnWindowProblem field by field
    in kernel_table.WINDOW_FIELDS order; checked through a stand-in library."""
    from types import SimpleNamespace

    from nattn import qk_av_kernels
    from nattn._cuda import kernel_table as kt
    from nattn.params import NAParams

    seen = {}

    def window_op(fields, n, stream, err, err_len):
        import ctypes
        seen["fields"] = list((ctypes.c_int64 * n).from_address(fields.value))
        return 0

    lib = SimpleNamespace(window_op=window_op, window_ops={("bfloat16", 2)})
    monkeypatch.setattr(qk_av_kernels.library, "load", lambda: lib)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    a, b = (torch.empty(2, 6, 7, 4, 16, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(2, 6, 7, 2, 16, dtype=torch.bfloat16)
    params = NAParams((3, 5), (1, 2), (2, 1), (True, False), 1.0)
    qk_av_kernels._run(qk_av_kernels.INVERSE_SUM, a, b, out, params, a, out)
    fields = seen["fields"]
    assert len(fields) == kt.NUM_WINDOW_FIELDS
    at = {}
    offset = 0
    for name, count in kt.WINDOW_FIELDS:
        at[name] = fields[offset:offset + count] if count > 1 else fields[offset]
        offset += count
    assert at["abi_version"] == kt.ABI_VERSION and at["dtype"] == kt.DTYPES.index("bfloat16")
    assert at["op"] == kt.WINDOW_OPS.index("inverse_sum") and at["na_dim"] == 2 and at["batch"] == 2
    assert (at["heads"], at["heads_kv"], at["dim"]) == (4, 2, 16)
    assert at["spatial"] == [6, 7, 1] and at["kernel"] == [3, 5, 1] and at["stride"] == [1, 2, 1]
    assert at["dilation"] == [2, 1, 1] and at["causal"] == [1, 0, 0] and at["neg_inf"] == 0
    assert (at["a_ptr"], at["b_ptr"], at["out_ptr"]) == (a.data_ptr(), b.data_ptr(), out.data_ptr())
    assert not qk_av_kernels.available(a, 2, 16)  # CPU tensors keep the PyTorch path


@pytest.mark.parametrize("seed", range(30))
def test_tiled_boxes_equal_the_window_gathers(seed, monkeypatch):
    """On random problems (every window option, GQA, RPB): the CPU's tiled path gives the
    gathers' logits, outputs and gradients; AV ignores what attn holds outside a window.
    Even seeds run the tiled products one head at a time, odd ones over all heads at once
    (tiled_rows.SMALL_PRODUCT)."""
    from cases import random_case
    import random
    monkeypatch.setattr(tiled_rows, "SMALL_PRODUCT", 0 if seed % 2 == 0 else 1 << 62)
    case = random_case(random.Random(seed), 1 + seed % 3, max_tokens=200)
    n = len(case.spatial)
    q, k, v = _inputs(case.spatial, case.heads, case.heads_kv, d=4, dv=3, b=case.batch)
    rpb = (torch.randn(case.heads, *(2 * x - 1 for x in case.kernel), dtype=torch.float64, requires_grad=True)
           if case.rpb else None)
    args = (case.kernel, case.stride, case.dilation, case.causal)
    attn = torch.randn(case.batch, *case.spatial, case.heads, math.prod(case.kernel), dtype=torch.float64)
    attn = attn.masked_fill(torch.rand(attn.shape) < 0.05, float("nan")).requires_grad_(True)
    results = []
    for tiled in (True, False):
        monkeypatch.setattr(nattn.qk_av, "USE_TILED", tiled)
        logits = QK[n](q, k, *args, rpb=rpb)
        finite = torch.where(torch.isfinite(logits), logits, 0)  # -inf: slots a causal window lacks
        out = AV[n](torch.where(torch.isnan(attn) & (logits > -1e30), 0, attn), v, *args)
        g = torch.Generator().manual_seed(seed)
        loss = (finite * torch.randn(finite.shape, generator=g, dtype=finite.dtype)).sum() + (
            out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
        leaves = [t for t in (q, k, v, rpb, attn) if t is not None]
        results.append((logits, out, torch.autograd.grad(loss, leaves)))
    (l1, o1, g1), (l2, o2, g2) = results
    torch.testing.assert_close(l1, l2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(o1, o2, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
