"""Eager NA calls remember (params, backend) per signature (nattn/_call_cache.py): a hit must
never let an argument through that the checks would reject, nor reuse a choice made under
other conditions."""

import pytest
import torch

import nattn
from nattn import _call_cache


def qkv(requires_grad=False):
    return [torch.randn(1, 6, 6, 2, 8, requires_grad=requires_grad) for _ in range(3)]


def test_values_that_hash_alike_are_checked_apart():
    q, k, v = qkv()
    nattn.na2d(q, k, v, 3)
    assert len(_call_cache._CACHE) == 1
    with pytest.raises(TypeError, match="kernel_size"):
        nattn.na2d(q, k, v, 3.0)  # 3.0 == 3 and hash(3.0) == hash(3)
    with pytest.raises(TypeError, match="is_causal"):
        nattn.na2d(q, k, v, 3, is_causal=1)  # 1 == True
    nattn.na2d(q, k, v, 3, is_causal=True)
    assert len(_call_cache._CACHE) == 2


def test_a_hit_returns_the_same_result_and_other_shapes_are_checked():
    q, k, v = qkv()
    first = nattn.na2d(q, k, v, 3, dilation=2)
    again = nattn.na2d(q, k, v, 3, dilation=2)
    torch.testing.assert_close(first, again)
    small = torch.randn(1, 4, 4, 2, 8)
    with pytest.raises(ValueError, match="kernel_size \\* dilation"):
        nattn.na2d(small, small, small, 3, dilation=2)


def test_grad_mode_and_determinism_are_part_of_the_signature():
    q, k, v = qkv(requires_grad=True)
    nattn.na2d(q, k, v, 3)
    with torch.no_grad():
        nattn.na2d(q, k, v, 3)
    torch.use_deterministic_algorithms(True)
    try:
        nattn.na2d(q, k, v, 3)
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(_call_cache._CACHE) == 3


def test_uncacheable_arguments_and_tuning_skip_the_cache():
    q, k, v = qkv()
    nattn.na2d(q, k, v, torch.tensor(3).item())  # an int: cached
    assert len(_call_cache._CACHE) == 1
    _call_cache.clear()
    with nattn.autotune():
        nattn.na2d(q, k, v, 3)
    assert not _call_cache._CACHE
    assert _call_cache.key((q,), (object(),)) is None
