"""GPU tier: libnattn's forward LayerNorm (nattn/nn/fast_norm.py) on fresh random rows against
the same norm in float64 and against torch's kernel, the cases it must decline, and the NA
models' inference with it against torch's norms; the residual add fused into it
(``add_layer_norm``) against torch's add and the unfused kernel, bit for bit.

NATTN_NORM_SEED=<n> reruns one draw (a failure prints its seed)."""

import os
import random
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
from nattn._cuda import library  # noqa: E402
from nattn.nn import fast_norm  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
if getattr(library.load(), "layer_norm", None) is None:
    pytest.skip("libnattn without its LayerNorm kernel", allow_module_level=True)

SEED = int(os.environ.get("NATTN_NORM_SEED", random.SystemRandom().randrange(2**31)))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# one rounding of the output (half an ulp, relative) and float32 statistics
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def draw(rng):
    """One random call: rows (maybe 0 or 1, maybe strided), channels, dtypes, parameters, eps."""
    channels = 8 * rng.randint(1, 128)
    rows = rng.choice([0, 1, 3, rng.randint(2, 5000), rng.randint(20000, 70000)])
    x_dtype = rng.choice(DTYPES)
    round_to_out = rng.random() < 0.3
    out_dtype = rng.choice(DTYPES) if round_to_out else rng.choice([x_dtype, torch.float32])
    w_dtype = rng.choice([torch.float32, x_dtype])
    gap = rng.choice([0, 0, 8, 24])  # extra elements between rows: a slice of wider rows
    return dict(channels=channels, rows=rows, x_dtype=x_dtype, out_dtype=out_dtype, w_dtype=w_dtype,
                weight=rng.random() < 0.85, bias=rng.random() < 0.75, gap=gap,
                offset=rng.choice([0.0, 0.0, 3.0, 100.0]), scale=rng.choice([1e-3, 1.0, 30.0]),
                eps=rng.choice([1e-5, 1e-6, 1e-3]), round_to_out=round_to_out, seed=rng.randrange(2**31))


def make(c):
    g = torch.Generator(device="cuda").manual_seed(c["seed"])
    wide = torch.randn(c["rows"], c["channels"] + c["gap"], device="cuda", generator=g)
    x = (wide * c["scale"] + c["offset"]).to(c["x_dtype"])[:, : c["channels"]]
    w = (torch.randn(c["channels"], device="cuda", generator=g) * 0.5 + 1).to(c["w_dtype"]) if c["weight"] else None
    b = torch.randn(c["channels"], device="cuda", generator=g).to(c["w_dtype"]) if c["bias"] else None
    return x, w, b


def float64_norm(x, w, b, c):
    """What the kernel computes, in float64: inputs rounded to the output dtype if asked."""
    r = (lambda t: t.to(c["out_dtype"])) if c["round_to_out"] else (lambda t: t)
    wd = None if w is None else r(w).double()
    bd = None if b is None else r(b).double()
    return F.layer_norm(r(x).double(), (c["channels"],), wd, bd, c["eps"])


@pytest.mark.parametrize("i", range(240))
def test_layer_norm_matches_float64(i):
    rng = random.Random(SEED * 1000 + i)
    c = draw(rng)
    x, w, b = make(c)
    with torch.no_grad():
        y = fast_norm.layer_norm(x, w, b, c["eps"], c["out_dtype"], c["round_to_out"])
    assert y is not None, f"declined {c} (NATTN_NORM_SEED={SEED})"
    assert y.dtype == c["out_dtype"] and y.shape == x.shape and y.is_contiguous()
    ref = float64_norm(x, w, b, c)
    assert torch.isfinite(y).all(), f"non-finite output, {c} (NATTN_NORM_SEED={SEED})"
    if not c["rows"]:
        return
    # the output's rounding, plus float32 statistics: their error on x_hat grows with the rows'
    # mean over their deviation (the sums of x and of (x - mean)^2 round at |x|'s scale)
    xd = (x.to(c["out_dtype"]) if c["round_to_out"] else x).double()
    ratio = (xd.mean(-1).abs() / (xd.var(-1, unbiased=False) + c["eps"]).sqrt()).max().item()
    xhat = float64_norm(x, None, None, c).abs().max().item()
    wmax = 1.0 if w is None else w.double().abs().max().item()
    bound = UNIT[c["out_dtype"]] * ref.abs() + wmax * 2.0**-24 * 64 * (1 + ratio) * (xhat + 1) + 1e-7
    err = (y.double() - ref).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"error above the bound by {worst:.3g}, {c} (NATTN_NORM_SEED={SEED})"


def torch_norm(x, w, b, c):
    """The call as torch's kernel runs it in the models: inputs rounded to the output dtype
    first (a block norm under autocast), autocast's float32 norm (a 16-bit input written as
    float32), or the norm at the input's dtype (float32 or the input's parameters)."""
    if c["round_to_out"] or c["out_dtype"] == torch.float32:
        x, w, b = (None if t is None else t.to(c["out_dtype"]) for t in (x, w, b))
    return F.layer_norm(x, (c["channels"],), w, b, c["eps"])


@pytest.mark.parametrize("i", range(40))
def test_layer_norm_matches_torch(i):
    """Against torch's own kernel on the same (rounded) inputs: at most one rounding step of
    the output apart (float32 statistics summed in another order)."""
    rng = random.Random(SEED * 1000 + 500 + i)
    c = draw(rng)
    c.update(rows=max(c["rows"], 1), offset=0.0)
    if not c["round_to_out"] and c["out_dtype"] == c["x_dtype"]:
        c["w_dtype"] = c["x_dtype"]  # torch's norm takes parameters of the input's dtype only
    x, w, b = make(c)
    with torch.no_grad():
        y = fast_norm.layer_norm(x, w, b, c["eps"], c["out_dtype"], c["round_to_out"])
        ref = torch_norm(x, w, b, c)
    atol = 2e-5 * max(1.0, ref.abs().max().item())
    torch.testing.assert_close(y, ref, rtol=4 * UNIT[c["out_dtype"]], atol=atol, msg=lambda m: f"{m}\n{c} (NATTN_NORM_SEED={SEED})")


def test_layer_norm_declines_what_it_cannot_take(monkeypatch):
    """None (torch's norm runs instead) for a gradient to record, channels outside 8..1024 or
    not a multiple of 8, unpacked channels, a misaligned start, float64, a FLOP counter, fake
    tensors, the switch off."""
    x = torch.randn(64, 96, device="cuda")
    w = torch.ones(96, device="cuda")
    assert fast_norm.layer_norm(x, w, None, 1e-5) is not None
    assert fast_norm.layer_norm(x, w.requires_grad_(), None, 1e-5) is None
    with torch.no_grad():
        assert fast_norm.layer_norm(x, w, None, 1e-5) is not None
        assert fast_norm.layer_norm(torch.randn(4, 12, device="cuda"), None, None, 1e-5) is None
        assert fast_norm.layer_norm(torch.randn(4, 1032, device="cuda"), None, None, 1e-5) is None
        assert fast_norm.layer_norm(x.t().contiguous().t(), None, None, 1e-5) is None  # channels 64 apart
        assert fast_norm.layer_norm(torch.randn(64 * 96 + 1, device="cuda")[1:].view(64, 96), None, None, 1e-5) is None
        assert fast_norm.layer_norm(x.double(), None, None, 1e-5) is None
        assert fast_norm.layer_norm(x.cpu(), None, None, 1e-5) is None
        # observers see torch's op: a FLOP counter (a dispatch mode), fake tensors, a tracer
        with FlopCounterMode(display=False):
            assert fast_norm.layer_norm(x, w, None, 1e-5) is None
        with FakeTensorMode() as mode:
            assert fast_norm.layer_norm(mode.from_tensor(x), None, None, 1e-5) is None
        monkeypatch.setenv("NATTN_LAYER_NORM_KERNEL", "0")
        assert fast_norm.layer_norm(x, None, None, 1e-5) is None


def test_traced_norm_records_torch_op():
    """torch.jit.trace of a model's norm (fvcore's FLOP counts, deployment) records torch's
    layer_norm, which then runs correctly on other inputs: the kernel is invisible to a tracer."""
    import importlib

    common = importlib.import_module("nattn.models._common")
    norm = common.LayerNorm(96).cuda()
    torch.nn.init.normal_(norm.weight)
    with torch.no_grad():
        traced = torch.jit.trace(norm, (torch.randn(4, 5, 96, device="cuda"),))
        assert "layer_norm" in str(traced.graph)
        x = torch.randn(3, 7, 96, device="cuda")
        torch.testing.assert_close(traced(x), F.layer_norm(x, (96,), norm.weight, norm.bias, 1e-5))


def model_and_input(model_name):
    """A timm NA model on the GPU in eval mode, channels-last, and a batch of two images."""
    import importlib

    import timm

    importlib.import_module("nattn.models")  # registers the models with timm
    torch.manual_seed(SEED % 1000)
    model = timm.create_model(model_name).cuda().eval().to(memory_format=torch.channels_last)
    return model, torch.randn(2, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)


def count_calls(monkeypatch, entry: str, calls=None) -> list:
    """``calls`` (default: a new list), which gets one item per call of libnattn's ``entry``
    from now on."""
    lib = library.load()
    kernel = getattr(lib, entry)
    calls = [] if calls is None else calls

    def counted(*args):
        calls.append(args)
        return kernel(*args)

    monkeypatch.setattr(lib, entry, counted)
    return calls


@pytest.mark.parametrize("model_name", ["dinat_tiny", "nat_mini"])
@pytest.mark.parametrize("amp", [False, True])
def test_models_infer_with_the_kernel(model_name, amp, monkeypatch):
    """An NA model's inference with libnattn's norms against torch's norms (the switch off):
    the same logits up to the norms' rounding, and the kernel ran for each norm."""
    model, x = model_and_input(model_name)
    calls = count_calls(monkeypatch, "add_layer_norm", count_calls(monkeypatch, "layer_norm"))
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=amp):
        ours = model(x).float()
        monkeypatch.setenv("NATTN_LAYER_NORM_KERNEL", "0")
        theirs = model(x).float()
    norms = sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert len(calls) == norms, f"{len(calls)} kernel calls for {norms} norms"
    err = ((ours - theirs).norm() / theirs.norm()).item()
    assert err < (3e-2 if amp else 1e-4), f"relative error {err:.3g} (NATTN_NORM_SEED={SEED})"


@pytest.mark.parametrize("i", range(160))
def test_add_layer_norm_is_add_then_norm(i):
    """``add_layer_norm(x, r, ...)`` against torch's ``x + r`` and ``layer_norm`` of that sum,
    bit for bit: the sum (the dtypes' promotion, one rounding) and the norm read from registers
    compute the same values as the two kernels."""
    rng = random.Random(SEED * 1000 + 2000 + i)
    c = draw(rng)
    x, w, b = make(c)
    r_dtype = rng.choice(DTYPES)
    r_gap = rng.choice([0, 0, 8, 40])
    g = torch.Generator(device="cuda").manual_seed(c["seed"] + 1)
    r = (torch.randn(c["rows"], c["channels"] + r_gap, device="cuda", generator=g) * c["scale"]).to(r_dtype)
    r = r[:, : c["channels"]]
    s_dtype = torch.promote_types(x.dtype, r_dtype)
    if not c["round_to_out"]:
        c["out_dtype"] = rng.choice([s_dtype, torch.float32])
    with torch.no_grad():
        fused = fast_norm.add_layer_norm(x, r, w, b, c["eps"], c["out_dtype"], c["round_to_out"])
        assert fused is not None, f"declined {c}, r {r_dtype} (NATTN_NORM_SEED={SEED})"
        s, y = fused
        ref_s = x + r
        ref_y = fast_norm.layer_norm(ref_s, w, b, c["eps"], c["out_dtype"], c["round_to_out"])
    info = f"{c}, r {r_dtype} gap {r_gap} (NATTN_NORM_SEED={SEED})"
    assert s.dtype == s_dtype and s.is_contiguous() and y.dtype == c["out_dtype"] and y.shape == x.shape, info
    assert torch.isfinite(y).all() and torch.isfinite(s).all(), f"non-finite output, {info}"
    assert torch.equal(s, ref_s), f"sum differs, {info}"
    assert torch.equal(y, ref_y), f"norm differs, {info}"


def test_add_layer_norm_declines_what_it_cannot_take(monkeypatch):
    """None (torch's add and the norm run instead) for another shape, a gradient to record,
    a misaligned branch, a CPU branch, float64, the switch off."""
    x, r = torch.randn(64, 96, device="cuda"), torch.randn(64, 96, device="cuda").bfloat16()
    w = torch.ones(96, device="cuda")
    assert fast_norm.add_layer_norm(x, r, w, None, 1e-5) is not None
    with torch.no_grad():
        assert fast_norm.add_layer_norm(x, r[:32], w, None, 1e-5) is None
        assert fast_norm.add_layer_norm(x, r.cpu(), w, None, 1e-5) is None
        assert fast_norm.add_layer_norm(x, r.double(), w, None, 1e-5) is None
        odd = torch.randn(64 * 96 + 1, device="cuda")[1:].view(64, 96)
        assert fast_norm.add_layer_norm(x, odd, w, None, 1e-5) is None
        assert fast_norm.add_layer_norm(odd, r, w, None, 1e-5) is None
        assert fast_norm.add_layer_norm(x, r.t().contiguous().t(), w, None, 1e-5) is None
        with FlopCounterMode(display=False):
            assert fast_norm.add_layer_norm(x, r, w, None, 1e-5) is None
        monkeypatch.setenv("NATTN_FUSED_ADD_NORM", "0")
        assert fast_norm.add_layer_norm(x, r, w, None, 1e-5) is None
    monkeypatch.delenv("NATTN_FUSED_ADD_NORM")
    assert fast_norm.add_layer_norm(x, r.requires_grad_(), w, None, 1e-5) is None


@pytest.mark.parametrize("model_name", ["dinat_tiny", "nat_mini", "nat_isotropic_small"])
@pytest.mark.parametrize("amp", [False, True])
def test_models_fused_add_is_bitwise(model_name, amp, monkeypatch):
    """An NA model's inference with its residual adds fused into the norms after them (a stage's
    blocks chained) against the same model with the adds left to torch
    (``NATTN_FUSED_ADD_NORM=0``): the same logits bit for bit, and the fused calls expected."""
    model, x = model_and_input(model_name)
    fused_calls = count_calls(monkeypatch, "add_layer_norm")
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=amp):
        ours = model(x)
        monkeypatch.setenv("NATTN_FUSED_ADD_NORM", "0")
        theirs = model(x)
    # a stage's blocks (an isotropic model's block sequence) run chained: every residual add
    # but the sequence's last runs in a norm's kernel
    sequences = [m.blocks for m in model.modules() if type(m).__name__ == "NAStage"] or [model.blocks]
    expected = sum(2 * len(blocks) - 1 for blocks in sequences)
    assert len(fused_calls) == expected, f"{len(fused_calls)} fused calls, expected {expected}"
    assert torch.isfinite(ours).all()
    assert torch.equal(ours, theirs), f"max difference {(ours - theirs).abs().max().item():.3g} (NATTN_NORM_SEED={SEED})"
