"""The NA models' one stochastic-depth draw a training forward (``one_drop_path_draw``): the
same result as timm's per-block DropPath given the same masks, one kernel for every block,
the configured keep rate per row, the model's dtypes, and the per-block draws where they
must stay (evaluation, gradient checkpointing, the switch off, torch.compile's graph)."""

import collections

import pytest
import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nattn.models  # noqa: F401  (registers the timm models)
from nattn.models._common import NABlock

DEPTHS = (1, 2, 1, 1)


def _model(rate=0.5, **kw):
    return timm.create_model("nat_mini", num_classes=5, depths=DEPTHS, drop_path_rate=rate, backend="reference", **kw)


def _blocks(model):
    return [b for stage in model.stages for b in stage.blocks]


class _Ops(TorchDispatchMode):
    """Counts the aten ops a region runs."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _with_recorded_rows(model):
    """Makes the model record the rows it draws in ``model.recorded``."""
    draw = model._drop_path_rows

    def recording(x):
        rows = draw(x)
        model.recorded = rows
        return rows

    model._drop_path_rows = recording


def _timm_forward(model, x, rows):
    """The model's forward written with timm's drop_path arithmetic on the given masks:
    ``x + gamma * branch * mask / keep`` per branch."""
    x = model.patch_embed(x)
    it = iter(rows)
    for stage in model.stages:
        x = stage.downsample(x)
        for b in stage.blocks:
            keep = 1.0 - b.drop_prob()
            for branch, gamma in ((lambda t: b.attn(b.norm1(t)), b.gamma1), (lambda t: b.mlp(b.norm2(t)), b.gamma2)):
                y = branch(x)
                y = y if gamma is None else gamma * y
                mask = next(it).view(-1, *([1] * (y.dim() - 1)))
                x = x + (y * mask / keep if keep > 0 else y * mask)
    return model.forward_head(model.norm(x))


@pytest.mark.parametrize("layer_scale", [None, 0.5])
def test_one_draw_equals_timms_drop_path_on_the_same_masks(layer_scale):
    """Logits and every gradient equal timm's arithmetic on the masks the model drew (fresh
    seed); some samples' branches are dropped, some kept."""
    torch.manual_seed(torch.seed() % 2**31)
    model = _model(0.5, layer_scale=layer_scale).train()
    _with_recorded_rows(model)
    x = torch.randn(8, 3, 32, 32)
    out = model(x)
    rows = model.recorded
    assert len(rows) == 2 * sum(DEPTHS) and all(r.shape == (8, 1, 1, 1) for r in rows)
    stacked = torch.stack(rows)
    assert set(stacked.unique().tolist()) <= {0.0, 1.0}
    assert (stacked[2:] == 0).any() and (stacked[2:] == 1).any()  # (all one kind: 2^-80)
    assert (stacked[:2] == 1).all()  # the first block's drop rate is 0
    out.square().sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    want = _timm_forward(model, x, rows)
    want.square().sum().backward()
    torch.testing.assert_close(out, want)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)


def test_one_draw_is_one_kernel_for_every_block():
    """A training forward draws once (one bernoulli over all blocks' rows) where the blocks'
    own DropPath draws would be one each; without the switch, one per dropped branch."""
    model = _model(0.3).train()
    x = torch.randn(2, 3, 32, 32)
    with _Ops() as ops:
        model(x)
    assert ops.count["aten.bernoulli"] == 1 and ops.count["aten.bernoulli_"] == 0
    model.one_drop_path_draw = False
    with _Ops() as ops:
        model(x)
    dropping = sum(b.drop_prob() > 0 for b in _blocks(model))
    assert ops.count["aten.bernoulli"] == 0 and ops.count["aten.bernoulli_"] == 2 * dropping


def test_one_draw_keeps_each_row_at_its_blocks_rate():
    """Each row keeps a sample with probability 1 - its block's drop_prob (6 sigma over 40000
    fresh draws), and a block's two rows are drawn independently."""
    model = _model(0.6).train()
    n = 40000
    rows = torch.stack(model._drop_path_rows(torch.empty(n, 1))).flatten(1)
    keeps = torch.tensor([1.0 - b.drop_prob() for b in _blocks(model) for _ in range(2)])
    sigma = (keeps * (1 - keeps) / n).sqrt()
    assert ((rows.mean(1) - keeps).abs() <= 6 * sigma + 1e-12).all()
    for i in range(2, rows.shape[0], 2):  # the blocks that drop
        a, b = rows[i] - rows[i].mean(), rows[i + 1] - rows[i + 1].mean()
        corr = (a * b).mean() / (a.square().mean() * b.square().mean()).sqrt()
        assert abs(corr) < 6 / n ** 0.5


def test_one_draw_follows_a_changed_drop_rate():
    """A block's drop_prob changed after the first forward (a schedule) reaches the next draw."""
    model = _model(0.2).train()
    model(torch.randn(2, 3, 32, 32))
    for b in _blocks(model)[1:]:
        b.drop_path.drop_prob = 1.0  # keep 0: every branch of these blocks is dropped
    rows = torch.stack(model._drop_path_rows(torch.empty(64, 1)))
    assert (rows[:2] == 1).all() and (rows[2:] == 0).all()


def test_one_draw_keeps_the_models_dtype():
    """Masks at the residual stream's dtype: a bfloat16 model's forward stays bfloat16."""
    model = _model(0.4).to(torch.bfloat16).train()
    _with_recorded_rows(model)
    out = model(torch.randn(2, 3, 32, 32, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert all(r.dtype == torch.bfloat16 for r in model.recorded)


def test_per_block_draws_in_eval_under_checkpointing_and_for_replaced_blocks():
    """No draw in evaluation; gradient checkpointing recomputes each stage with its saved RNG
    state, so the blocks draw their own; a block that is not an NABlock turns the one draw off."""
    model = _model(0.3)
    x = torch.randn(2, 3, 32, 32)
    assert model.eval()._drop_path_rows(x) is None
    model.train().set_grad_checkpointing(True)
    with _Ops() as ops:
        model(x)
    assert ops.count["aten.bernoulli"] == 0 and ops.count["aten.bernoulli_"] > 0
    model.set_grad_checkpointing(False)

    class Wrapped(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return self.block(x)

    model.stages[1].blocks[0] = Wrapped(model.stages[1].blocks[0])
    assert model._drop_path_rows(x) is None
    assert torch.isfinite(model(x)).all()


def test_compiled_training_forward_draws_once_and_matches_eager():
    """torch.compile(fullgraph=True) through AOT autograd (eager kernels): one bernoulli in the
    forward graph; with every drop rate 0 or 1 (draws that are certain) logits and gradients
    equal eager's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(torch.seed() % 2**31)
    model = _model(0.3).train()
    for i, b in enumerate(_blocks(model)):
        b.drop_path.drop_prob = float(i % 2)  # the first block has a DropPath of rate 0: give all one
    x = torch.randn(2, 3, 32, 32)
    draws = []

    def fw_compiler(gm, _):
        draws.append(sum(str(n.target).startswith("aten.bernoulli") for n in gm.graph.nodes))
        return make_boxed_func(gm)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=fw_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm))
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    out = compiled(x)
    out.square().sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    want = model(x)
    want.square().sum().backward()
    assert draws[0] == 1
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-3, atol=1e-5, msg=n)
    torch._dynamo.reset()


def test_isotropic_model_draws_once():
    """The isotropic model (a sequence of blocks, no stages) takes the one draw too."""
    model = timm.create_model("nat_isotropic_small", num_classes=3, depth=3, embed_dim=32, num_heads=2,
                              drop_path_rate=0.5, backend="reference").train()
    assert isinstance(model.blocks[0], NABlock)
    with _Ops() as ops:
        out = model(torch.randn(2, 3, 64, 64))
    assert ops.count["aten.bernoulli"] == 1 and ops.count["aten.bernoulli_"] == 0
    assert torch.isfinite(out).all()
