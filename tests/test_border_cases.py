"""Border cases of docs/semantics.md, each against the float64 oracle with gradients."""

import pytest
import torch

from cases import Case
from test_reference_vs_oracle import check_case

F, T = False, True


def case(spatial, kernel, stride=None, dilation=None, causal=None, **kw):
    n = len(spatial)
    base = dict(batch=2, heads=2, heads_kv=1, dim=8, dim_v=8, extra=0, rpb=False, seed=7)
    base.update(kw)
    return Case(tuple(spatial), tuple(kernel), tuple(stride or (1,) * n), tuple(dilation or (1,) * n),
                tuple(causal or (F,) * n), **base)


BORDER = [
    case([7], [7]),  # kernel == size: every query sees everything
    case([6, 5], [6, 5]),  # even kernel == size
    case([9], [3], dilation=[3]),  # kernel * dilation == size
    case([8, 10], [4, 5], dilation=[2, 2]),  # even and odd, k * d == size
    case([9], [3], stride=[3]),  # stride == kernel
    case([10, 7], [4, 3], stride=[4, 3]),  # stride == kernel, sizes not divisible
    case([5, 6, 7], [3, 2, 3], causal=[F, T, F]),  # 3-D with one causal axis
    case([4, 5, 6], [2, 3, 3], causal=[T, F, F], stride=[2, 1, 3], dilation=[2, 1, 2]),
    case([7, 7], [7, 7], rpb=True),  # RPB with kernel == size
    case([12], [5], dilation=[2], rpb=True, extra=4),
    case([11], [4], stride=[4], causal=[T]),  # causal, stride == kernel, ragged last block
]


@pytest.mark.parametrize("c", BORDER, ids=str)
def test_border_case_float64(c):
    check_case(c, torch.float64, (1e-9, 1e-9))


def test_kernel_equal_size_is_dense_attention():
    import nattn

    q, k, v = (torch.randn(2, 5, 6, 2, 8, dtype=torch.float64) for _ in range(3))
    na = nattn.na2d(q, k, v, kernel_size=(5, 6))
    dense = nattn.attention(q.reshape(2, 30, 2, 8), k.reshape(2, 30, 2, 8), v.reshape(2, 30, 2, 8))
    torch.testing.assert_close(na.reshape(2, 30, 2, 8), dense)
