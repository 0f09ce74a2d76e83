"""The tiled backend (boxes of queries, dense products, masks) against the brute-force float64
oracle, forward and every gradient, with every feature combined; its box plans and dilation
folding on their own; and where automatic dispatch sends CPU calls."""

import itertools
import math
import random

import pytest
import torch

import nattn
from nattn.backends import choose_na_backend
from nattn.backends import tiled, tiled_plan, tiled_rows
from nattn.backends.dilation_fold import class_view, fold, fold_classes, padded
from nattn.backends.tiled_plan import axis_plan, box_sizes
from nattn.params import normalize
from nattn.windows import axis_key_interval, axis_window
from cases import random_case, sweep
from test_reference_vs_oracle import FUNCS, assert_close, check_case, make_inputs, run_nattn, run_oracle

CASES_64 = sweep(240, seed=4321)
CASES_LOW = sweep(60, seed=8765)


@pytest.mark.parametrize("case", CASES_64, ids=str)
def test_float64_sweep(case):
    check_case(case, torch.float64, (1e-9, 1e-9), backend="tiled")


@pytest.mark.parametrize("case", CASES_LOW[:30], ids=str)
def test_float32_sweep(case):
    check_case(case, torch.float32, (1e-4, 1e-4), backend="tiled")


@pytest.mark.parametrize("case", CASES_LOW[30:45], ids=str)
def test_bfloat16_sweep(case):
    check_case(case, torch.bfloat16, (5e-2, 5e-2), backend="tiled")


@pytest.mark.parametrize("case", CASES_LOW[45:], ids=str)
def test_float16_sweep(case):
    check_case(case, torch.float16, (1e-2, 1e-2), backend="tiled")


@pytest.mark.parametrize("products", ["per-head", "stacked"])
@pytest.mark.parametrize("case", CASES_64[::12], ids=str)
def test_both_ways_of_running_the_heads(case, products, monkeypatch):
    """The products over heads run as a loop of one product per head, or as one product over
    all heads for small ones (tiled_rows.SMALL_PRODUCT): each of them alone, every gradient."""
    monkeypatch.setattr(tiled_rows, "SMALL_PRODUCT", 0 if products == "per-head" else 1 << 62)
    check_case(case, torch.float64, (1e-9, 1e-9), backend="tiled")


@pytest.mark.parametrize("seed", range(6))
def test_larger_problems_in_many_chunks(seed, monkeypatch):
    """Problems of a few thousand tokens (bigger boxes, borders far apart) with the chunk
    made small, so that every call walks many chunks of boxes."""
    monkeypatch.setattr(tiled_plan, "CHUNK_SCORES", 1 << 12)
    rng = random.Random(seed)
    case = random_case(rng, 1 + seed % 3, max_tokens=2400)
    check_case(case, torch.float64, (1e-9, 1e-9), backend="tiled")


def test_heads_first_views_gqa_dilation_and_rpb():
    """Non-contiguous inputs (heads-first tensors seen heads-last), GQA, dilation with axes
    that the dilation does not divide, an even kernel, then an RPB, against the reference."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 11, 9, 5, generator=g, dtype=torch.float64).permute(0, 2, 3, 1, 4).requires_grad_(True)
    kv = torch.randn(2, 2, 2, 11, 9, 5, generator=g, dtype=torch.float64)
    k, v = (t.permute(0, 2, 3, 1, 4).requires_grad_(True) for t in kv)
    out, lse = nattn.na2d(q, k, v, (3, 4), dilation=(2, 1), return_lse=True, backend="tiled")
    ref_out, ref_lse = nattn.na2d(q, k, v, (3, 4), dilation=(2, 1), return_lse=True, backend="reference")
    assert_close("out", out, ref_out, 1e-12, 1e-12)
    assert_close("lse", lse, ref_lse, 1e-12, 1e-12)
    rpb = torch.randn(6, 5, 9, generator=g, dtype=torch.float64, requires_grad=True)
    out = nattn.na2d(q, k, v, (3, 5), dilation=(3, 1), rpb=rpb, backend="tiled")
    ref = nattn.na2d(q, k, v, (3, 5), dilation=(3, 1), rpb=rpb, backend="reference")
    assert_close("out", out, ref, 1e-12, 1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [q, k, v, rpb], grad)
    want = torch.autograd.grad(ref, [q, k, v, rpb], grad)
    for name, x, y in zip("qkvr", got, want):
        assert_close(f"grad {name}", x, y, 1e-12, 1e-12)


def test_forward_lse_without_gradients_matches_oracle():
    case = CASES_64[7]
    t = make_inputs(case, torch.float64, requires_grad=False)
    out, lse = run_nattn(case, t, backend="tiled")
    ref_out, ref_lse = run_oracle(case, t)
    assert_close("out", out, ref_out, 1e-9, 1e-9)
    assert_close("lse", lse, ref_lse, 1e-9, 1e-9)


def test_backward_is_deterministic():
    case = CASES_64[5]
    runs = []
    for _ in range(2):
        t = make_inputs(case, torch.float32)
        out, lse = run_nattn(case, t, backend="tiled")
        (out.sum() + lse.sum()).backward()
        runs.append([x.grad for x in t.values()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("length,kernel,stride,causal", [
    (n, k, s, c) for n, k, s, c in itertools.product((5, 9, 17, 40), (2, 3, 4, 7), (1, 2, 3), (False, True))
    if k <= n and s <= k])
def test_axis_plan_covers_every_window_exactly(length, kernel, stride, causal):
    """Per box: its U keys stay inside the axis; the mask selects each query's window slots
    (axis_window's valid keys) and nothing else; padded queries see nothing; the RPB offset
    is the window's where it is used."""
    coords, valid, rpb = axis_window(length, kernel, stride, 1, causal)
    for box in (1, 2, 4, 8, 64):
        plan = axis_plan(length, kernel, stride, causal, box)
        assert plan.boxes * box >= length > (plan.boxes - 1) * box
        assert 0 <= int(plan.key_start.min()) and int(plan.key_start.max()) + plan.keys <= length
        for b in range(plan.boxes):
            keys = plan.key_start[b] + torch.arange(plan.keys)
            for r in range(box):
                qi = b * box + r
                seen = set(keys[plan.mask[b, r]].tolist())
                if qi >= length:
                    assert not seen
                    continue
                want = set(coords[qi][valid[qi]].tolist())
                assert seen == want, (qi, seen, want)
                for j, key in enumerate(keys.tolist()):
                    if plan.mask[b, r, j]:
                        slot = [t for t in range(kernel) if valid[qi, t] and coords[qi, t] == key][0]
                        assert int(plan.rpb[b, r, j]) == int(rpb[qi, slot])


def test_axis_key_interval_is_axis_window():
    for n, k, s, c in itertools.product(range(2, 24), range(2, 8), range(1, 4), (False, True)):
        if k > n or s > k:
            continue
        coords, valid, _ = axis_window(n, k, s, 1, c)
        first, last = axis_key_interval(n, k, s, c)
        assert torch.equal(first, torch.where(valid, coords, n).amin(1))
        assert torch.equal(last, torch.where(valid, coords, -1).amax(1))


def test_box_sizes():
    assert box_sizes((56, 56), (7, 7), (1, 1), (False, False)) == (4, 4)
    assert math.prod(box_sizes((64, 64), (13, 13), (1, 1), (False, False))) >= 32  # 4x8 or 8x8: a tie
    one_d = box_sizes((4096,), (255,), (1,), (False,))[0]
    assert 64 <= one_d <= 1024
    assert box_sizes((3,), (3,), (1,), (False,)) == (3,)  # the whole axis


@pytest.mark.parametrize("spatial,dilation", [((7,), (3,)), ((10, 9), (3, 2)), ((5, 6, 7), (2, 3, 1)),
                                              ((8, 8), (1, 1))])
def test_dilation_fold_round_trip(spatial, dilation):
    """Every token lands in exactly one class's batch entry, at its group coordinate."""
    x = torch.randn(2, *spatial, 3, 4)
    xp = padded(x, spatial, dilation)
    back = torch.zeros_like(xp)
    total = 0
    for cls in fold_classes(spatial, dilation):
        f = fold(xp, cls, dilation)
        view = f.view(2, *cls.count, *cls.lengths, 3, 4)
        for b, gs, js in itertools.product(range(2), itertools.product(*map(range, cls.count)),
                                          itertools.product(*map(range, cls.lengths))):
            pos = tuple(cls.first[a] + gs[a] + js[a] * dilation[a] for a in range(len(spatial)))
            assert all(p < n for p, n in zip(pos, spatial))
            assert torch.equal(view[(b, *gs, *js)], x[(b, *pos)])
        view = class_view(back, cls, dilation)  # where results go back
        view.copy_((f + 1).view(view.shape))
        total += f[..., 0, 0].numel()
    assert total == x[..., 0, 0].numel()
    assert torch.equal(back[(slice(None),) + tuple(slice(0, n) for n in spatial)], x + 1)


def _params(q, kernel, **kw):
    return normalize(q, q, q, len(kernel), kernel, **kw)


def test_cpu_dispatch_runs_tiled_and_the_reference_for_meta_tensors():
    q = torch.randn(1, 16, 16, 2, 8)
    params = _params(q, (5, 5))
    assert choose_na_backend(q, q, q, None, params) == "tiled"
    dropout = _params(q, (5, 5), dropout_p=0.1)
    assert choose_na_backend(q, q, q, None, dropout) == "tiled"  # with its fused dropout
    meta = torch.empty(1, 16, 16, 2, 8, device="meta")
    assert choose_na_backend(meta, meta, meta, None, params) == "reference"
    reasons = tiled.TiledBackend().na_not_supported_reasons(meta, meta, meta, None, params, True)
    assert reasons and "meta" in reasons[0]


def test_memory_stays_bounded_by_the_chunk(monkeypatch):
    """One chunk's scores never exceed CHUNK_SCORES or one box's, whichever is larger: no
    N x N tensor (here N^2 is 5.3M scores, a box 2 * 2 * 16 * 256)."""
    seen = []
    real = tiled._Problem.scores

    def spy(self, *args):
        s = real(self, *args)
        seen.append(s.numel())
        return s

    monkeypatch.setattr(tiled._Problem, "scores", spy)
    monkeypatch.setattr(tiled_plan, "CHUNK_SCORES", 1 << 16)
    q, k, v = (torch.randn(2, 48, 48, 2, 8, requires_grad=True) for _ in range(3))
    nattn.na2d(q, k, v, 9, backend="tiled").sum().backward()
    boxes = box_sizes((48, 48), (9, 9), (1, 1), (False, False))
    keys = [axis_plan(48, 9, 1, False, b).keys for b in boxes]
    per_box = 2 * 2 * boxes[0] * boxes[1] * keys[0] * keys[1]
    assert len(seen) > 4 and max(seen) <= max(1 << 16, per_box)


@pytest.mark.parametrize("case", CASES_64[:40], ids=str)
def test_dropout_matches_the_reference(case):
    """Attention dropout draws the same keep mask as the reference (global indices, also
    through dilation folding and GQA): same outputs, LSE and gradients under one seed."""
    t = make_inputs(case, torch.float64)
    results = []
    for backend in ("tiled", "reference"):
        torch.manual_seed(case.seed)
        out, lse = FUNCS[len(case.spatial)](
            t["query"], t["key"], t["value"], case.kernel, stride=case.stride, dilation=case.dilation,
            is_causal=case.causal, scale=case.scale, rpb=t.get("rpb"), dropout_p=0.3, backend=backend,
            return_lse=True)
        g = torch.Generator().manual_seed(case.seed + 1)
        loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum() + (lse * torch.randn(
            lse.shape, generator=g, dtype=lse.dtype)).sum()
        names = [n for n in t if n not in ("additional_keys", "additional_values")]
        results.append((out, lse, torch.autograd.grad(loss, [t[n] for n in names])))
    (out, lse, grads), (ref_out, ref_lse, ref_grads) = results
    assert_close("out", out, ref_out, 1e-9, 1e-9)
    assert_close("lse", lse, ref_lse, 1e-9, 1e-9)
    for g, r in zip(grads, ref_grads):
        assert_close("grad", g, r, 1e-9, 1e-9)
    assert not torch.equal(out, FUNCS[len(case.spatial)](t["query"], t["key"], t["value"], case.kernel,
                                                          stride=case.stride, dilation=case.dilation,
                                                          is_causal=case.causal, scale=case.scale,
                                                          rpb=t.get("rpb"), backend="tiled"))


@pytest.mark.parametrize("dilation", [1, 2])
def test_results_are_contiguous_as_the_ops_fake_results(dilation):
    """The custom ops' fake implementations promise contiguous results (torch.compile checks
    the strides): every tensor the backend returns is contiguous, the bias gradient included."""
    q, k, v = (torch.randn(2, 9, 10, 4, 8) for _ in range(3))
    rpb = torch.randn(4, 5, 5)
    params = normalize(q, k, v, 2, 3, dilation=dilation, rpb=rpb)
    out, lse = tiled.forward(q, k, v, rpb, params)
    grads = tiled.backward(q, k, v, rpb, out, lse, torch.randn_like(out), torch.randn_like(lse), params)
    for x in (out, lse, *grads):
        assert x.is_contiguous()
    assert grads[3].shape == rpb.shape


def test_kept_chunks_stay_within_their_budget(monkeypatch):
    """Chunk lists are kept between calls within CACHED_BYTES over all problems, least
    recently used out first; a problem whose chunks exceed it builds them one at a time."""
    dev = torch.device("cpu")

    def boxes(n, rpb=False):
        return tiled_plan.Boxes((n, n), (5, 5), (1, 1), (False, False), rpb, dev)

    a, b, c = boxes(12), boxes(13), boxes(13, rpb=True)
    sizes = []
    for x in (a, b, c):  # each one's bytes, alone
        alone = tiled_plan._KeptChunks()
        monkeypatch.setattr(tiled_plan, "KEPT", alone)
        x.chunks(1)
        sizes.append(alone.bytes)
    kept = tiled_plan._KeptChunks()
    monkeypatch.setattr(tiled_plan, "KEPT", kept)
    monkeypatch.setattr(tiled_plan, "CACHED_BYTES", sizes[0] + max(sizes[1:]))
    first = a.chunks(1)
    assert a.chunks(1) is first  # the same list, kept
    b.chunks(1)
    a.chunks(1)  # a is now the most recently used
    c.chunks(1)  # c needs b's room: b, the least recently used, goes
    keys = [k[0] for k in kept.lists]
    assert a.key in keys and c.key in keys and b.key not in keys
    assert kept.bytes == sizes[0] + sizes[2] <= tiled_plan.CACHED_BYTES
    monkeypatch.setattr(tiled_plan, "CACHED_BYTES", 16)
    big = boxes(15).chunks(1)
    assert not isinstance(big, list)  # a generator: never all at once
    assert sum(ch.k_idx.shape[0] for ch in big) == boxes(15).count
    assert boxes(15).key not in [k[0] for k in kept.lists]


def test_bias_patterns_are_shared_by_interior_boxes():
    """With an RPB, a chunk holds each distinct box pattern of bias entries once: 2-D boxes
    of a 7x7 window fall into at most 3 x 3 (first, interior, last along each axis)."""
    boxes = tiled_plan.Boxes((40, 40), (7, 7), (1, 1), (False, False), True, torch.device("cpu"))
    assert boxes.pattern_count <= 9 < boxes.count  # the problem's patterns, built once
    for ch in boxes.chunks(1):
        assert ch.rpb_idx.shape[0] <= 9 and ch.rpb_box.shape == (ch.k_idx.shape[0],)
        assert int(ch.rpb_box.max()) < ch.rpb_idx.shape[0]


@pytest.mark.parametrize("seed", range(12))
def test_box_patterns_match_the_score_by_score_chunks(seed, monkeypatch):
    """A chunk's mask / bias indices from the axes' box patterns (built once per problem) are
    the ones built score by score (what problems whose patterns outgrow PATTERN_SCORES get):
    every box, borders, padding rows, causal axes and strides included."""
    rng = random.Random(seed)
    nd = 2 + seed % 2
    kernel = tuple(rng.randint(1, 7) for _ in range(nd))
    lengths = tuple(k + rng.randint(0, 20) for k in kernel)
    stride = tuple(rng.randint(1, k) for k in kernel)
    causal = tuple(rng.random() < 0.3 for _ in range(nd))
    for with_rpb in (False, True):
        def chunks():
            boxes = tiled_plan.Boxes(lengths, kernel, stride, causal, with_rpb, torch.device("cpu"))
            return boxes, list(boxes._chunk(s, min(s + 7, boxes.count), True) for s in range(0, boxes.count, 7))
        fast_boxes, fast = chunks()
        assert fast_boxes.pattern_count <= fast_boxes.count
        monkeypatch.setattr(tiled_plan, "PATTERN_SCORES", 0)
        slow_boxes, slow = chunks()
        monkeypatch.undo()
        assert slow_boxes.pattern_mask is None and slow_boxes.pattern_rpb is None
        assert (fast_boxes.pattern_rpb is not None) == with_rpb != (fast_boxes.pattern_mask is not None)
        for a, b in zip(fast, slow):
            for name in ("q_gather", "q_scatter", "k_idx", "row_ok", "slot", "slot_ok"):
                x, y = getattr(a, name), getattr(b, name)
                assert (x is None and y is None) or torch.equal(x, y), name
            if with_rpb:
                assert torch.equal(a.rpb_idx[a.rpb_box], b.rpb_idx[b.rpb_box])
            else:
                assert torch.equal(a.mask, b.mask)
