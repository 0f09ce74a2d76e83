"""FLOPs of single ops: the docs/semantics.md formula, torch's FlopCounterMode (registered on
``import nattn``) and fvcore (``add_nattn_handles``) must agree."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import nattn
from nattn.flops import add_nattn_handles, attention_flops, na_flops, na_macs

fvcore = pytest.importorskip("fvcore.nn")

FUNCS = {1: nattn.na1d, 2: nattn.na2d, 3: nattn.na3d}

# (spatial, heads, heads_kv, dim, dim_v, kernel, kwargs)
CASES = [
    ((20,), 2, 2, 8, 8, 5, {}),
    ((9, 10), 4, 2, 8, 12, (3, 5), dict(dilation=(2, 1))),
    ((9, 10), 2, 1, 8, 8, 4, dict(stride=2, is_causal=True)),
    ((4, 5, 6), 2, 2, 4, 4, (2, 3, 3), dict(dilation=(1, 1, 2))),
]


class _Call(torch.nn.Module):
    def __init__(self, na_dim, kernel, kwargs):
        super().__init__()
        self.na_dim, self.kernel, self.kwargs = na_dim, kernel, kwargs

    def forward(self, q, k, v):
        return FUNCS[self.na_dim](q, k, v, self.kernel, **self.kwargs)


def _inputs(spatial, heads, heads_kv, dim, dim_v, grad=False):
    q = torch.randn(2, *spatial, heads, dim, requires_grad=grad)
    k = torch.randn(2, *spatial, heads_kv, dim, requires_grad=grad)
    v = torch.randn(2, *spatial, heads_kv, dim_v, requires_grad=grad)
    return q, k, v


def _fvcore_total(module, inputs):
    analysis = add_nattn_handles(fvcore.FlopCountAnalysis(module, inputs))
    analysis.unsupported_ops_warnings(False)
    return analysis.total(), analysis


def test_formula_by_hand():
    # 2-D: B=2, 9x10 tokens, 4 heads, W = 3*5, D = 8, D_v = 12
    assert na_flops((2, 9, 10, 4, 8), (2, 9, 10, 2, 8), (2, 9, 10, 2, 12), (3, 5)) == \
        2 * 2 * 4 * 90 * 15 * 8 + 2 * 2 * 4 * 90 * 15 * 12
    assert na_macs((1, 7, 7, 2, 16), kernel_size=7) == 1 * 2 * 49 * 49 * 32
    # stride, dilation, causal change nothing
    base = na_flops((1, 16, 3, 4), kernel_size=5)
    assert base == na_flops((1, 16, 3, 4), kernel_size=5, stride=2, dilation=3, is_causal=True)
    # extra keys: a dense attention of every query over them
    assert na_flops((1, 16, 3, 4), kernel_size=5, additional_keys=(1, 6, 3, 4)) == base + 2 * 3 * 16 * 6 * 8
    assert attention_flops((1, 10, 2, 4), (1, 7, 1, 4), (1, 7, 1, 6)) == 2 * 2 * 10 * 7 * 10


def test_formula_bad_arguments():
    with pytest.raises(ValueError, match="kernel_size"):
        na_flops((1, 8, 8, 2, 4), kernel_size=(3, 3, 3))
    with pytest.raises(TypeError, match="query"):
        na_flops("abc", kernel_size=3)
    with pytest.raises(ValueError, match="query"):
        na_flops((1, 2, 4), kernel_size=3)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_torch_and_fvcore_match_formula(case):
    spatial, heads, heads_kv, dim, dim_v, kernel, kwargs = case
    module = _Call(len(spatial), kernel, kwargs)
    q, k, v = _inputs(spatial, heads, heads_kv, dim, dim_v, grad=True)
    expected = na_flops(q, k, v, kernel, **kwargs)
    with FlopCounterMode(display=False) as counter:
        out = module(q, k, v)
    assert counter.get_total_flops() == expected
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    assert counter.get_total_flops() == 2 * expected  # backward counted as 2x forward, as for sdpa
    macs, analysis = _fvcore_total(module, (q.detach(), k.detach(), v.detach()))
    assert macs * 2 == expected
    assert analysis.by_operator()["na_forward"] == macs


def test_additional_keys_counted_as_dense_attention():
    q, k, v = _inputs((6, 7), 2, 2, 8, 8)
    ek, ev = torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)

    class Extra(torch.nn.Module):
        def forward(self, q, k, v, ek, ev):
            return nattn.na2d(q, k, v, 3, additional_keys=ek, additional_values=ev)

    expected = na_flops(q, k, v, 3, additional_keys=ek, additional_values=ev)
    with FlopCounterMode(display=False) as counter:
        Extra()(q, k, v, ek, ev)
    assert counter.get_total_flops() == expected
    macs, analysis = _fvcore_total(Extra(), (q, k, v, ek, ev))
    assert macs * 2 == expected
    assert analysis.by_operator()["attention_forward"] * 2 == attention_flops((2, 42, 2, 8), ek, ev)


def test_dense_attention_counts():
    q, k, v = torch.randn(1, 12, 2, 8, requires_grad=True), torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 4)
    with FlopCounterMode(display=False) as counter:
        out = nattn.attention(q, k, v)
    assert counter.get_total_flops() == attention_flops(q, k, v) == 2 * 2 * 12 * 9 * 12
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    assert counter.get_total_flops() == 2 * attention_flops(q, k, v)


def test_module_counts_projections_plus_na():
    m = nattn.nn.NeighborhoodAttention2D(32, 4, 5, dilation=2, rel_pos_bias=True)
    x = torch.randn(2, 10, 12, 32)
    tokens = 2 * 10 * 12
    expected = 2 * tokens * 32 * 96 + 2 * tokens * 32 * 32 + na_flops((2, 10, 12, 4, 8), kernel_size=5)
    with FlopCounterMode(display=False) as counter:
        m(x)
    assert counter.get_total_flops() == expected
    macs, _ = _fvcore_total(m, (x,))
    assert macs * 2 == expected


def test_flop_counter_on_meta_tensors():
    """Shapes are enough: counting a big problem costs no compute."""
    q = torch.empty(8, 64, 64, 8, 64, device="meta")
    with FlopCounterMode(display=False) as counter:
        nattn.na2d(q, q, q, 13, dilation=2)
    assert counter.get_total_flops() == 4 * 8 * 8 * 64 * 64 * 169 * 64
    assert math.isclose(counter.get_total_flops(), na_flops(q, kernel_size=13))


def test_formulas_registered_by_import_nattn_alone():
    import subprocess
    import sys

    code = ("import sys; sys.modules['timm'] = None; import torch, nattn; "
            "from torch.utils.flop_counter import FlopCounterMode; "
            "q = torch.randn(1, 8, 8, 2, 4)\n"
            "with FlopCounterMode(display=False) as c: nattn.na2d(q, q, q, 3)\n"
            "print(c.get_total_flops())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == 4 * 2 * 64 * 9 * 4
