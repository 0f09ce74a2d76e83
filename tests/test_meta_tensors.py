"""Meta tensors (``module.to("meta")``, shape inference): NA calls propagate shapes and dtypes."""

import pytest
import torch

import nattn
from nattn.nn import NeighborhoodAttention1D, NeighborhoodAttention2D, NeighborhoodAttention3D

CLASSES = {1: NeighborhoodAttention1D, 2: NeighborhoodAttention2D, 3: NeighborhoodAttention3D}
SPATIAL = {1: (13,), 2: (9, 11), 3: (5, 6, 7)}


@pytest.mark.parametrize("na_dim", [1, 2, 3])
def test_module_on_meta_with_backward(na_dim):
    m = CLASSES[na_dim](16, 2, 3, rel_pos_bias=True).to("meta")
    x = torch.empty(2, *SPATIAL[na_dim], 16, device="meta", requires_grad=True)
    extra = torch.empty(2, 3, 16, device="meta")
    y = m(x, additional_tokens=extra)
    assert y.shape == x.shape and y.device.type == "meta"
    y.sum().backward()
    assert x.grad.shape == x.shape and m.rpb.grad.shape == m.rpb.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_functional_on_meta(dtype):
    q = torch.empty(2, 6, 7, 4, 8, device="meta", dtype=dtype)
    kv = torch.empty(2, 6, 7, 2, 8, device="meta", dtype=dtype)
    v = torch.empty(2, 6, 7, 2, 5, device="meta", dtype=dtype)
    out, lse = nattn.na2d(q, kv, v, (3, 4), stride=(1, 2), is_causal=(False, True), return_lse=True)
    assert out.shape == (2, 6, 7, 4, 5) and out.dtype == dtype and out.device.type == "meta"
    assert lse.shape == (2, 6, 7, 4)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    flat = q.flatten(1, 2)
    out = nattn.attention(flat, kv.flatten(1, 2), v.flatten(1, 2), is_causal=True)
    assert out.shape == (2, 42, 4, 5) and out.device.type == "meta"


def test_meta_under_autocast():
    m = NeighborhoodAttention2D(16, 2, 3).to("meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(torch.empty(1, 8, 8, 16, device="meta"))
    assert y.shape == (1, 8, 8, 16)
