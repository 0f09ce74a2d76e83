"""Grouped parameter casts under autocast (nattn/nn/param_cast.py, the models' blocks): the
same logits and gradients, bit for bit, as autocast's per-parameter casts, in far fewer cast
ops; hooks, gradient checkpointing, features and dtype changes keep working."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nattn  # noqa: F401  (registers the models with timm)
from nattn.nn import param_cast

timm = pytest.importorskip("timm")


class _CountCasts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.casts += 1
        return func(*args, **(kwargs or {}))


def _pair(name="nat_mini", **kw):
    """Two copies of one model (no stochastic depth): grouped casts on and off."""
    torch.manual_seed(torch.seed() % 2**31)
    a = timm.create_model(name, num_classes=7, drop_path_rate=0.0, depths=(2, 1, 2, 1), **kw)
    with torch.no_grad():  # gains and biases that are not round numbers in bf16
        for p in a.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    b = timm.create_model(name, num_classes=7, drop_path_rate=0.0, depths=(2, 1, 2, 1), **kw)
    b.load_state_dict(a.state_dict())
    b.group_casts = False
    return a, b


def _step(model, x, checkpoint=False):
    model.set_grad_checkpointing(checkpoint)
    with _CountCasts() as count, torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    y.float().square().sum().backward()
    return y, {n: p.grad for n, p in model.named_parameters()}, count.casts


@pytest.mark.parametrize("checkpoint", [False, True])
def test_same_logits_and_gradients_in_fewer_casts(checkpoint):
    a, b = _pair()
    x = torch.randn(2, 3, 48, 48)
    ya, ga, ca = _step(a.train(), x, checkpoint)
    yb, gb, cb = _step(b.train(), x, checkpoint)
    assert ya.dtype == torch.bfloat16 and torch.isfinite(ya).all()
    assert torch.equal(ya, yb)
    assert ga.keys() == gb.keys()
    for n in ga:
        assert (ga[n] is None) == (gb[n] is None), n
        if ga[n] is not None:
            assert torch.equal(ga[n], gb[n]), n
    blocks = 6
    if not checkpoint:  # checkpointed blocks recompute outside the region: autocast's casts there
        # per block off: 4 Linears x (weight, bias) + 2 norms x (weight, bias) [+ 2 inputs]
        assert cb >= 12 * blocks and ca <= cb - 10 * blocks, (ca, cb)


def test_features_and_hooks():
    a, b = _pair()
    x = torch.randn(2, 3, 48, 48)
    seen = []
    a.stages[1].blocks[0].attn.qkv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fa = a.forward_intermediates(x, intermediates_only=True)
        fb = b.forward_intermediates(x, intermediates_only=True)
        assert torch.equal(a(x), b(x))
    assert seen == [torch.bfloat16, torch.bfloat16]  # the hooked Linear ran as a module
    assert len(fa) == 4 and all(torch.equal(u, v) for u, v in zip(fa, fb))
    grads = []  # a full backward hook fires too (the module is called, not F.linear)
    a.stages[2].blocks[1].mlp.fc2.register_full_backward_hook(lambda m, gi, go: grads.append(go[0].dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = a(x)
    y.float().sum().backward()
    assert grads == [torch.bfloat16]


def test_without_autocast_and_after_dtype_changes():
    a, b = _pair()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), _CountCasts() as count:
        assert torch.equal(a(x), b(x))
    assert count.casts == 0
    assert param_cast.cast_of(a.stages[0].blocks[0].mlp.fc1.weight) is a.stages[0].blocks[0].mlp.fc1.weight
    a.to(torch.bfloat16)
    b.to(torch.bfloat16)  # bf16 parameters: nothing to group, the plan is rebuilt
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(a(x.bfloat16()), b(x.bfloat16()))
    assert a._casts_plan is not None and not a._casts_plan.groups


@pytest.mark.parametrize("name,kw", [("nat_isotropic_small", dict(depth=2)), ("dinat_s_tiny", {}),
                                     ("nat_video_tiny", dict(depths=(1, 1, 1, 1)))])
def test_every_family(name, kw):
    torch.manual_seed(torch.seed() % 2**31)
    a = timm.create_model(name, num_classes=5, drop_path_rate=0.0, **kw)
    b = timm.create_model(name, num_classes=5, drop_path_rate=0.0, **kw)
    b.load_state_dict(a.state_dict())
    b.group_casts = False
    x = torch.randn(1, 3, 4, 32, 32) if "video" in name else torch.randn(1, 3, 64, 64)
    ya, ga, ca = _step(a.train(), x)
    yb, gb, cb = _step(b.train(), x)
    assert torch.equal(ya, yb) and ca < cb / 2, (ca, cb)
    assert all(torch.equal(ga[n], gb[n]) for n in ga if ga[n] is not None)


def test_replaced_parameters_regroup():
    """A parameter replaced in its module (load_state_dict with assign=True) makes the groups
    stale: the next forward regroups, holds the new parameters only, and still matches."""
    a, b = _pair()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a(x)
    old = a._casts_plan
    fc1 = a.stages[0].blocks[0].mlp.fc1
    before = fc1.weight
    a.load_state_dict({k: v.clone() for k, v in a.state_dict().items()}, assign=True)
    assert fc1.weight is not before and old.stale()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(a(x), b(x))
    assert a._casts_plan is not old and not a._casts_plan.stale()
    grouped = {id(p) for _, ts, _, _ in a._casts_plan.groups for p in ts}
    assert id(fc1.weight) in grouped and id(before) not in grouped


def test_functional_call_and_back():
    """torch.func.functional_call swaps plain tensors in and the parameters back: the call
    matches autocast's, and the next plain forward groups the parameters again."""
    a, b = _pair()
    x = torch.randn(2, 3, 32, 32)
    given = {n: p.detach() * 1.01 for n, p in a.named_parameters()}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a(x)
        fa = torch.func.functional_call(a, given, (x,))
        fb = torch.func.functional_call(b, given, (x,))
    assert torch.equal(fa, fb)
    with torch.no_grad(), _CountCasts() as grouped, torch.autocast("cpu", dtype=torch.bfloat16):
        ya = a(x)
    with torch.no_grad(), _CountCasts() as each, torch.autocast("cpu", dtype=torch.bfloat16):
        yb = b(x)
    assert torch.equal(ya, yb) and grouped.casts < each.casts / 2, (grouped.casts, each.casts)
    a.to(torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a(x.bfloat16())
        plan = a._casts_plan
        a(x.bfloat16())
    assert a._casts_plan is plan and not plan.stale()  # bf16 parameters: built once, not every forward


def test_replaced_submodules_are_left_to_autocast():
    """A block whose MLP was swapped for another module (no fc1 / fc2) still runs, its other
    parameters grouped."""
    a, b = _pair()
    for m in (a, b):
        m.stages[0].blocks[0].mlp = torch.nn.Sequential(torch.nn.Linear(64, 64))
    b.stages[0].blocks[0].mlp.load_state_dict(a.stages[0].blocks[0].mlp.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(a(x), b(x))
